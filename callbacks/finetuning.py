"""`BaseFinetuning` / `BackboneFinetuning`: freeze modules before training, unfreeze them later as new parameter
groups of the optimizer (Lightning's fine-tuning callbacks)."""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable, Generator, Iterable
from typing import Any, ClassVar

import torch
from torch.nn import Module
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView

log = logging.getLogger(__name__)

Modules = Module | Iterable[Any]


def multiplicative(epoch: int) -> float:
    """``BackboneFinetuning``'s default learning-rate factor per epoch (2: the backbone's rate doubles)."""
    return 2.0


class BaseFinetuning(Callback):
    """Freeze modules in ``freeze_before_training`` (called at ``setup``, before ``configure_optimizers``) and
    change them at each training epoch's start in ``finetune_function(module, epoch, optimizer)``, called once per
    optimizer (the user's ``torch.optim`` object). Subclass it and override both.

    The helpers (``freeze``, ``make_trainable``, ``unfreeze_and_add_param_group``...) are static, as in Lightning.
    Batch-norm layers stay trainable by default (``train_bn=True``).

    Example:
        >>> class UnfreezeAtEpoch2(BaseFinetuning):
        ...     def freeze_before_training(self, module):
        ...         self.freeze(module.backbone)
        ...     def finetune_function(self, module, epoch, optimizer):
        ...         if epoch == 2:
        ...             self.unfreeze_and_add_param_group(module.backbone, optimizer, lr=1e-4)
        >>> net = torch.nn.Module()
        >>> net.backbone = torch.nn.Linear(2, 2)
        >>> BaseFinetuning.freeze(net.backbone)
        >>> [p.requires_grad for p in net.backbone.parameters()]
        [False, False]
    """

    def __init__(self) -> None:
        # Per optimizer, each parameter group (settings, parameters by name), as Lightning's (in checkpoints).
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._fit_trainer: weakref.ReferenceType[Any] | None = None  # the trainer of the fit in progress

    # -- what subclasses override ------------------------------------------------------------------------------
    def freeze_before_training(self, pl_module: Module) -> None:
        """Freeze what must not train at first (called at ``setup``, before the optimizers exist)."""
        raise NotImplementedError(f"{type(self).__name__}: override freeze_before_training(self, pl_module).")

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        """Unfreeze or change the learning rate at the start of ``epoch`` (once per optimizer)."""
        raise NotImplementedError(f"{type(self).__name__}: override finetune_function(self, pl_module, epoch, "
                                  "optimizer).")

    # -- hooks ------------------------------------------------------------------------------------------------
    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        if stage == "fit":
            self._fit_trainer = weakref.ref(trainer)  # a resume's load_state_dict adds the saved groups back
            self.freeze_before_training(pl_module)

    def teardown(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        self._fit_trainer = None

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        names = {id(p): n for n, p in pl_module.named_parameters()}
        for index, optimizer in enumerate(trainer.optimizers):
            optimizer = getattr(optimizer, "optimizer", optimizer)  # the user's optimizer, not the engine's wrapper
            before = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            # Lightning's record: every group (its settings, parameters by name) the first time, then the groups
            # added since.
            known = self._internal_optimizer_metadata.get(index)
            groups = optimizer.param_groups if known is None else optimizer.param_groups[before:]
            named = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names.get(id(p), "") for p in
                                                                                g["params"]]} for g in groups]
            if known is None:
                self._internal_optimizer_metadata[index] = named
            else:
                known.extend(named)

    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    # A resume gives this callback its state before the optimizers' states are loaded (Lightning's order,
    # trainer.checkpoint.early_callbacks): the groups it had added are added back first, so those states fit.
    restores_before_optimizers: ClassVar[bool] = True

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._internal_optimizer_metadata = {int(k): v for k, v in
                                             state_dict.get("internal_optimizer_metadata", {}).items()}
        trainer = self._fit_trainer() if self._fit_trainer is not None else None
        module = getattr(trainer, "lightning_module", None)
        if trainer is None or module is None:
            return
        named = dict(module.named_parameters())
        for index, optimizer in enumerate(trainer.optimizers):
            optimizer = getattr(optimizer, "optimizer", optimizer)  # the user's optimizer, not the engine's wrapper
            saved = self._internal_optimizer_metadata.get(index, [])
            for group in saved[len(optimizer.param_groups):]:  # the groups added since the optimizer was built
                params = [named[name] for name in group["params"] if name in named]
                optimizer.add_param_group({**{k: v for k, v in group.items() if k != "params"}, "params": params})
                for parameter in params:
                    parameter.requires_grad_(True)  # it trained when the checkpoint was taken

    # -- helpers --------------------------------------------------------------------------------------------------
    @staticmethod
    def flatten_modules(modules: Modules) -> list[Module]:
        """The leaf modules (and those holding parameters of their own) of ``modules`` (a module, a
        ``ModuleDict`` or an iterable of them)."""
        if isinstance(modules, torch.nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable) and not isinstance(modules, Module):
            found: list[Module] = []
            for item in modules:
                found.extend(BaseFinetuning.flatten_modules(item))
            return found
        assert isinstance(modules, Module)
        return [m for m in modules.modules() if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True,
                      requires_grad: bool = True) -> Generator[torch.nn.Parameter, None, None]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (batch norms left out
        unless ``train_bn``)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Every parameter of ``modules`` trains again (batch norms track running statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: Module) -> None:
        """``module``'s own parameters stop training (a batch norm also stops tracking running statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze every leaf of ``modules``; batch norms stay trainable when ``train_bn``."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
        """``params`` without those the optimizer holds already (with a warning naming how many)."""
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in held]
        if len(kept) != len(params):  # Lightning 2.6's words (observed), then how many
            warnings.warn("The provided params to be frozen already exist within another group of this optimizer. "
                          "Those parameters will be skipped.\nHINT: Did you init your optimizer in "
                          f"`configure_optimizer` as such:\n {type(optimizer)}(filter(lambda p: p.requires_grad, "
                          f"self.parameters()), ...) ({len(params) - len(kept)} of the parameters to add to "
                          f"{type(optimizer).__name__} are in one of its groups already.)", UserWarning, stacklevel=3)
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(modules: Modules, optimizer: Optimizer, lr: float | None = None,
                                     initial_denom_lr: float = 10.0, train_bn: bool = True) -> None:
        """Unfreeze ``modules`` and give their parameters to ``optimizer`` as a new group, at ``lr`` (default: the
        first group's learning rate divided by ``initial_denom_lr``)."""
        BaseFinetuning.make_trainable(modules)
        group_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        candidates = BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        params = BaseFinetuning.filter_on_optimizer(optimizer, candidates)
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})


class BackboneFinetuning(BaseFinetuning):
    """Train ``module.backbone`` from epoch ``unfreeze_backbone_at_epoch`` on, at a learning rate that grows by
    ``lambda_func(epoch + 1)`` per epoch (capped at the other groups' rate when ``should_align``).

    Args:
        unfreeze_backbone_at_epoch: the epoch the backbone joins the optimizer.
        lambda_func: the factor applied to the backbone's rate at each later epoch.
        backbone_initial_ratio_lr: the backbone's first rate as a fraction of the optimizer's
            (``backbone_initial_lr`` sets it directly instead).
        should_align: never let the backbone's rate exceed the optimizer's first group's.
        initial_denom_lr: passed to ``unfreeze_and_add_param_group``.
        train_bn: keep batch norms trainable while the backbone is frozen.
        verbose: log the rates at every epoch after the unfreeze.
        rounding: digits of the logged rates.

    Example:
        >>> BackboneFinetuning(unfreeze_backbone_at_epoch=5).unfreeze_backbone_at_epoch
        5
    """

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, lambda_func: Callable[[int], float] = multiplicative,
                 backbone_initial_ratio_lr: float = 1e-1, backbone_initial_lr: float | None = None,
                 should_align: bool = True, initial_denom_lr: float = 10.0, train_bn: bool = True,
                 verbose: bool = False, rounding: int = 12) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict.get("previous_backbone_lr")
        super().load_state_dict(state_dict)

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        if stage == "fit" and not isinstance(getattr(pl_module, "backbone", None), Module):
            raise MisconfigurationException(f"BackboneFinetuning needs the module to hold its backbone as "
                                            f"`self.backbone` (an nn.Module); {type(pl_module).__name__} has none. "
                                            "The "
                                            "LightningModule should have a nn.Module `backbone` attribute.")
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: Module) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            initial = (self.backbone_initial_lr if self.backbone_initial_lr is not None
                       else current_lr * self.backbone_initial_ratio_lr)
            self.previous_backbone_lr = initial
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, initial, train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
        elif epoch > self.unfreeze_backbone_at_epoch and self.previous_backbone_lr is not None:
            next_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and next_lr > current_lr:
                next_lr = current_lr
            optimizer.param_groups[-1]["lr"] = next_lr
            self.previous_backbone_lr = next_lr
        else:
            return
        if self.verbose:
            log.info(f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: "
                     f"{round(self.previous_backbone_lr, self.rounding)}")
