"""`ModelPruning`: Lightning's pruning callback, on ``torch.nn.utils.prune``.

At the end of each training epoch (or validation epoch, ``prune_on_train_epoch_end=False``) it prunes the chosen
parameters by ``amount``, optionally resets the survivors to their initial values (the lottery ticket hypothesis)
and, when training ends, makes the pruning permanent. Checkpoints hold the plain masked weights and the masks
travel in the callback's state (``callbacks.pruning_checkpoint``): a checkpoint loads into the unpruned module and a
resumed run continues exactly.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from copy import deepcopy
from functools import partial
from typing import Any

import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView
from callbacks.pruning_checkpoint import (
    ParameterRef,
    keep_checkpoints_plain,
    masks_of,
    pruned_names,
    restore_masks,
)

log = logging.getLogger(__name__)

PRUNING_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "ln_structured": torch_prune.ln_structured, "l1_unstructured": torch_prune.l1_unstructured,
    "random_structured": torch_prune.random_structured, "random_unstructured": torch_prune.random_unstructured}
PRUNING_METHODS: dict[str, type[torch_prune.BasePruningMethod]] = {
    "ln_structured": torch_prune.LnStructured, "l1_unstructured": torch_prune.L1Unstructured,
    "random_structured": torch_prune.RandomStructured, "random_unstructured": torch_prune.RandomUnstructured}
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)

Amount = int | float
EpochRule = bool | Callable[[int], bool]


class ModelPruning(Callback):
    """Prune parameters during training with ``torch.nn.utils.prune`` (Lightning's arguments and defaults).

    Args:
        pruning_fn: ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"``,
            ``"random_structured"``, or a ``torch.nn.utils.prune.BasePruningMethod`` subclass (the class, with
            ``use_global_unstructured=True``).
        parameters_to_prune: ``[(module, "weight"), ...]``; empty: every ``parameter_names`` parameter of every
            layer (containers and the module itself excluded). ``filter_parameters_to_prune`` can narrow it.
        parameter_names: ``"weight"`` and / or ``"bias"`` (default both).
        use_global_unstructured: prune the smallest entries across all the parameters at once.
        amount: a fraction (float) or a count (int) of entries to prune, or ``amount(epoch)``.
        apply_pruning: prune this epoch: a bool or ``apply_pruning(epoch)``.
        make_pruning_permanent: remove the pruning re-parametrisation when training ends.
        use_lottery_ticket_hypothesis: after pruning, reset the remaining entries to their values at ``setup``
            (a bool or ``rule(epoch)``); ``resample_parameters`` resets them to freshly initialised values.
        pruning_dim / pruning_norm: the dimension of structured pruning, the norm of ``"ln_structured"``.
        verbose: 0, 1 (log the overall sparsity) or 2 (also per parameter).
        prune_on_train_epoch_end: prune at the training epoch's end, else at the validation epoch's end.

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        >>> pruning = ModelPruning("l1_unstructured", amount=0.5, parameter_names=["weight"])
        >>> targets = pruning.sanitize_parameters_to_prune(net, parameter_names=["weight"])
        >>> [(type(m).__name__, name) for m, name in targets]
        [('Linear', 'weight'), ('Linear', 'weight')]
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(self, pruning_fn: Callable[..., Any] | str, parameters_to_prune: Sequence[ParameterRef] = (),
                 parameter_names: list[str] | None = None, use_global_unstructured: bool = True,
                 amount: Amount | Callable[[int], Amount] = 0.5, apply_pruning: EpochRule = True,
                 make_pruning_permanent: bool = True, use_lottery_ticket_hypothesis: EpochRule = True,
                 resample_parameters: bool = False, pruning_dim: int | None = None, pruning_norm: int | None = None,
                 verbose: int = 0, prune_on_train_epoch_end: bool = True) -> None:
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune: Sequence[ParameterRef] = parameters_to_prune
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._parameter_names = parameter_names or self.PARAMETER_NAMES
        self._global_kwargs: dict[str, Any] = {}
        self._original_layers: dict[int, dict[str, Any]] | None = None
        self._pruning_method_name: str | None = None
        self._handles: list[RemovableHandle] = []
        self._log_here = True  # rank 0 logs the sparsity (set at setup)
        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                # Lightning's words first, then what to do.
                raise MisconfigurationException(f"The provided `parameter_names` name: {name} isn't in "
                                                f"{self.PARAMETER_NAMES}. Prune other tensors through "
                                                "parameters_to_prune=[(module, name)].")
        self.pruning_fn = self._resolve_pruning_fn(pruning_fn, use_global_unstructured, pruning_dim, pruning_norm)
        if use_global_unstructured and getattr(self.pruning_fn, "PRUNING_TYPE", None) != "unstructured":
            raise MisconfigurationException(
                'Only the "unstructured" PRUNING_TYPE is supported with `use_global_unstructured=True`. Found method '
                f"{self.pruning_fn} of type {getattr(self.pruning_fn, 'PRUNING_TYPE', None)}. Pass "
                "use_global_unstructured=False to prune each parameter on its own.")
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        if isinstance(amount, bool) or not (isinstance(amount, (int, float)) or callable(amount)):
            raise MisconfigurationException("`amount` should be provided and be either an int, a float or Callable "
                                            f"function. Received: {amount!r}.")
        self.amount = amount
        if verbose not in (0, 1, 2):
            raise MisconfigurationException(f"`verbose` must be any of (0, 1, 2). Received: {verbose!r}.")
        self._verbose = verbose

    def _resolve_pruning_fn(self, pruning_fn: Any, use_global: bool, dim: int | None,
                            norm: int | None) -> Callable[..., Any]:
        """The function (per parameter) or method class (global) that ``pruning_fn`` names, with its dim / norm."""
        if isinstance(pruning_fn, str):
            name = pruning_fn.lower()
            if name not in PRUNING_FUNCTIONS:
                raise MisconfigurationException(f"The provided `pruning_fn` {name} isn't available in PyTorch's "
                                                f"built-in functions: {list(PRUNING_FUNCTIONS)} ")
            kwargs: dict[str, Any] = {}
            if name.endswith("_structured"):
                if dim is None:
                    raise MisconfigurationException("When requesting `structured` pruning, the `pruning_dim` "
                                                    f"should be provided (pruning_fn={name!r}): e.g. pruning_dim=0 "
                                                    "removes whole output rows.")
                if name == "ln_structured":
                    if norm is None:
                        raise MisconfigurationException("When requesting `ln_structured` pruning, the "
                                                        "`pruning_norm` should be provided: e.g. pruning_norm=1.")
                    kwargs["n"] = norm
                kwargs["dim"] = dim
            method = PRUNING_METHODS[name] if use_global else PRUNING_FUNCTIONS[name]
            self._pruning_method_name = method.__name__
            if use_global:
                self._global_kwargs = kwargs
                return method
            return partial(method, **kwargs)
        if self._is_pruning_method(pruning_fn):
            if not use_global:
                raise MisconfigurationException("PyTorch `BasePruningMethod` is currently only supported with "
                                                "`use_global_unstructured=True`. Received "
                                                f"pruning_fn={pruning_fn.__name__} with "
                                                "use_global_unstructured=False.")
            self._pruning_method_name = pruning_fn.__name__
            return pruning_fn
        raise MisconfigurationException(
            f"`pruning_fn` is expected to be a str in {list(PRUNING_FUNCTIONS)} or a PyTorch `BasePruningMethod`. "
            f"Found: {pruning_fn}. HINT: if passing a `BasePruningMethod`, pass the class, not an instance")

    @staticmethod
    def _is_pruning_method(method: Any) -> bool:
        """Whether ``method`` is a ``BasePruningMethod`` subclass (Lightning's helper of the same name)."""
        return inspect.isclass(method) and issubclass(method, torch_prune.BasePruningMethod)

    # -- what subclasses may override -------------------------------------------------------------------------
    def filter_parameters_to_prune(self, parameters_to_prune: Sequence[ParameterRef] = ()) -> Sequence[ParameterRef]:
        """Narrow the ``(module, name)`` pairs to prune (called at ``setup``); returns them all by default."""
        return parameters_to_prune

    # -- pruning ----------------------------------------------------------------------------------------------
    def apply_pruning(self, amount: Amount) -> None:
        """Prune ``parameters_to_prune`` by ``amount`` now (logging the sparsity with ``verbose``)."""
        before = [self._pruned_stats(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            kwargs = {**self._global_kwargs, "amount": amount}
            accepted = set(inspect.signature(self.pruning_fn).parameters) - {"self"}
            torch_prune.global_unstructured(self._parameters_to_prune, pruning_method=self.pruning_fn,
                                            **{k: v for k, v in kwargs.items() if k in accepted})
        else:
            for module, name in self._parameters_to_prune:
                self.pruning_fn(module, name=name, amount=amount)
        if self._verbose and self._log_here:
            self._log_sparsity(before, [self._pruned_stats(m, n) for m, n in self._parameters_to_prune], amount)

    def apply_lottery_ticket_hypothesis(self) -> None:
        """Reset the remaining entries of each pruned parameter to its value at ``setup`` (a fresh initialisation
        with ``resample_parameters``); the masks stay."""
        if self._original_layers is None:
            raise RuntimeError("ModelPruning.apply_lottery_ticket_hypothesis() runs after setup, with "
                               "use_lottery_ticket_hypothesis set (the initial values are copied at setup).")
        for layer in self._original_layers.values():
            source = layer["data"]
            if self._resample_parameters and callable(getattr(source, "reset_parameters", None)):
                source = deepcopy(source)  # the kept copy stays the original initialisation
                source.reset_parameters()
            for index, name in layer["names"]:
                target, _ = self._parameters_to_prune[index]
                self._copy_param(target, source, name)

    @staticmethod
    def _copy_param(new: nn.Module, old: nn.Module, name: str) -> None:
        destination = getattr(new, name + "_orig") if hasattr(new, name + "_orig") else getattr(new, name)
        source = getattr(old, name)
        if isinstance(destination, Tensor) and isinstance(source, Tensor):
            destination.data = source.data.to(destination.device)

    def make_pruning_permanent(self, module: nn.Module) -> None:
        """Remove the pruning re-parametrisation of every pruned tensor in ``module`` (the masked values stay)."""
        for layer in module.modules():
            for name in pruned_names(layer):
                torch_prune.remove(layer, name)

    def _run_pruning(self, epoch: int) -> None:
        prune = self._apply_pruning(epoch) if callable(self._apply_pruning) else self._apply_pruning
        amount = self.amount(epoch) if callable(self.amount) else self.amount
        if not prune or not amount:
            return
        self.apply_pruning(amount)
        rule = self._use_lottery_ticket_hypothesis
        if rule(epoch) if callable(rule) else rule:
            self.apply_lottery_ticket_hypothesis()

    # -- sparsity log ---------------------------------------------------------------------------------------------
    @staticmethod
    def _pruned_stats(module: nn.Module, name: str) -> tuple[int, int]:
        mask = getattr(module, f"{name}_mask", None)
        if mask is None:
            return 0, 1
        return int((mask == 0).sum().item()), mask.numel()

    def _log_sparsity(self, before: list[tuple[int, int]], after: list[tuple[int, int]], amount: Amount) -> None:
        total = sum(size for _, size in after)
        zeros_before, zeros_after = sum(z for z, _ in before), sum(z for z, _ in after)
        log.info(f"Applied `{self._pruning_method_name}`. Pruned: {zeros_before}/{total} "
                 f"({zeros_before / total:.2%}) -> {zeros_after}/{total} ({zeros_after / total:.2%})")
        if self._verbose == 2:
            for (module, name), (z0, n0), (z1, n1) in zip(self._parameters_to_prune, before, after, strict=True):
                log.info(f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. "
                         f"Pruned: {z0} ({z0 / n0:.2%}) -> {z1} ({z1 / n1:.2%})")

    # -- hooks ----------------------------------------------------------------------------------------------------
    def setup(self, trainer: TrainerView, pl_module: nn.Module, stage: str) -> None:
        self._log_here = bool(getattr(trainer, "is_global_zero", True))
        targets = self.sanitize_parameters_to_prune(pl_module, self._parameters_to_prune, self._parameter_names)
        self._parameters_to_prune = self.filter_parameters_to_prune(targets)
        if self._use_lottery_ticket_hypothesis:
            # One copy per layer, of its values now (the "initialisation" the survivors are reset to).
            self._original_layers = {}
            for index, (module, name) in enumerate(self._parameters_to_prune):
                layer = self._original_layers.setdefault(id(module), {"data": deepcopy(module), "names": []})
                layer["names"].append((index, name))
        for handle in self._handles:
            handle.remove()
        self._handles = keep_checkpoints_plain([module for module, _ in self._parameters_to_prune])

    def teardown(self, trainer: TrainerView, pl_module: nn.Module, stage: str) -> None:
        # After the run the module's state_dict() is torch's again (``<name>_orig`` / ``<name>_mask`` while pruned).
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: nn.Module) -> None:
        if self._prune_on_train_epoch_end:
            self._run_pruning(trainer.current_epoch)

    def on_validation_epoch_end(self, trainer: TrainerView, pl_module: nn.Module) -> None:
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            self._run_pruning(trainer.current_epoch)

    def on_train_end(self, trainer: TrainerView, pl_module: nn.Module) -> None:
        if self._make_pruning_permanent:
            self.make_pruning_permanent(pl_module)

    # -- checkpoints: the weights are saved masked (see callbacks.pruning_checkpoint), the masks here -------------
    @property
    def state_key(self) -> str:
        # Two ModelPruning callbacks (e.g. alternating methods) keep their masks under their own keys.
        return f"{type(self).__qualname__}{{'pruning_fn': {self._pruning_method_name!r}, 'amount': " \
               f"{self.amount if isinstance(self.amount, (int, float)) else 'callable'}}}"

    def state_dict(self) -> dict[str, Any]:
        masks = masks_of(self._parameters_to_prune)
        return {"masks": masks} if masks else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        restore_masks(self._parameters_to_prune, state_dict.get("masks", {}))

    # -- choosing the parameters ----------------------------------------------------------------------------------
    @staticmethod
    def sanitize_parameters_to_prune(pl_module: nn.Module, parameters_to_prune: Sequence[ParameterRef] = (),
                                     parameter_names: Sequence[str] = ()) -> Sequence[ParameterRef]:
        """The ``(module, name)`` pairs to prune: ``parameters_to_prune`` checked against ``pl_module``, or, when
        empty, every ``parameter_names`` parameter (an ``nn.Parameter``) of every layer of ``pl_module``."""
        names = parameter_names or ModelPruning.PARAMETER_NAMES
        # Layers only: not containers, nor a training module itself (its own parameters are not a layer's).
        layers = [m for m in pl_module.modules()
                  if m is not pl_module and not isinstance(m, _CONTAINERS) and not hasattr(m, "training_step")]
        if not parameters_to_prune:
            return [(m, name) for name in names for m in layers if isinstance(getattr(m, name, None), nn.Parameter)]
        if not (isinstance(parameters_to_prune, (list, tuple))
                and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in parameters_to_prune)
                and all(isinstance(m, nn.Module) and isinstance(n, str) for m, n in parameters_to_prune)):
            raise MisconfigurationException("The provided `parameters_to_prune` should either be list of tuple with "
                                            "2 elements: (nn.Module, parameter_name_to_prune) or None. Received: "
                                            f"{parameters_to_prune!r:.200}.")
        known = {id(layer) for layer in layers}
        missing_modules = [m for m, _ in parameters_to_prune if id(m) not in known]
        missing_names = [n for m, n in parameters_to_prune if id(m) in known and not hasattr(m, n)]
        if missing_modules or missing_names:
            raise MisconfigurationException(
                "Some provided `parameters_to_prune` don't exist in the model. Found missing modules: "
                f"{missing_modules} and missing parameters: {missing_names}. Name layers of the module being trained "
                "(e.g. [(model.layer, 'weight')]).")
        return list(parameters_to_prune)

