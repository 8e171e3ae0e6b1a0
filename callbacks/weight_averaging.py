"""Weight averaging on ``torch.optim.swa_utils``: Lightning 2.6's ``WeightAveraging`` / ``EMAWeightAveraging``, and
``StochasticWeightAveraging`` (SWA with ``SWALR`` and a batch-norm update at the end).

The averaged copy is an ``AveragedModel``; validation runs on the averaged weights (swapped in and out around each
validation epoch, as Lightning 2.6 does) and the module holds them when ``fit`` ends. The averaged weights, the
update counters and SWA's scheduler are part of the callback's checkpoint state, so a resumed run goes on with
bitwise the same average.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_avg_fn, update_bn

from callbacks.base import Callback
from callbacks.exceptions import MisconfigurationException
from callbacks.protocols import TrainerView
from engine.keywords import keyword_error, suggest_keywords

log = logging.getLogger(__name__)
AvgFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# What WeightAveraging's **kwargs may hold: AveragedModel's arguments that the callback does not set itself.
_AVERAGED_MODEL_KEYWORDS = ("avg_fn", "multi_avg_fn")


@suggest_keywords
class WeightAveraging(Callback):
    """Keep an ``AveragedModel`` of the module, updated after every optimizer step (override ``should_update``).

    Args:
        device: where the averaged copy lives (default: the module's device; ``"cpu"`` saves accelerator memory).
        use_buffers: average the buffers too (default ``True``, unlike ``AveragedModel``); with ``False`` only
            parameters are averaged and the module's own buffers are kept.
        **kwargs: passed to ``AveragedModel`` (``avg_fn`` / ``multi_avg_fn``; default: the equal-weight mean).

    Example:
        >>> from torch.optim.swa_utils import get_ema_avg_fn
        >>> class EMAAfter100(WeightAveraging):
        ...     def __init__(self) -> None:
        ...         super().__init__(avg_fn=get_ema_avg_fn(0.99))
        ...     def should_update(self, step_idx=None, epoch_idx=None) -> bool:
        ...         return step_idx is not None and step_idx >= 100
        >>> EMAAfter100().should_update(step_idx=150)
        True
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True,
                 **kwargs: Any) -> None:
        if device is not None and not isinstance(device, (torch.device, str, int)):
            raise ValueError(f"{type(self).__name__}(device=...) must be a torch.device, a str or an int. "
                             f"Received: {device!r}.")
        unknown = [name for name in kwargs if name not in _AVERAGED_MODEL_KEYWORDS]
        if unknown:  # they go to AveragedModel at fit's setup: name the typo now, not when fit starts
            accepted = [name for name, p in inspect.signature(type(self).__init__).parameters.items()
                        if name != "self" and p.kind is not p.VAR_KEYWORD]
            raise keyword_error(type(self).__name__, unknown[0], accepted + list(_AVERAGED_MODEL_KEYWORDS))
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._latest_update_step = 0
        self._latest_update_epoch = -1
        self._pending: dict[str, Any] | None = None  # a restored state, applied once the averaged model exists

    @property
    def average_model(self) -> AveragedModel | None:
        """The ``AveragedModel`` (``None`` before ``fit`` starts)."""
        return self._average_model

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update after optimizer step ``step_idx`` / at the end of epoch ``epoch_idx`` (0-based; one
        of them is given). Default: after every optimizer step."""
        return step_idx is not None

    # -- building --------------------------------------------------------------------------------------------
    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        if stage == "fit" and str(getattr(trainer.accelerator, "distributed_type", "")).endswith("FSDP"):
            raise ValueError(f"{type(self).__name__} keeps a full copy of the module and does not support FSDP "
                             "(sharded parameters): use DDP or one process.")
        if stage == "fit":  # as Lightning: the averaged copy exists from fit's setup on
            self._build(pl_module)

    def on_fit_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        # configure_model may have added layers since setup (the copy is built again), and the module may have
        # moved to the accelerator (the copy follows it, unless a device was given); a restored state waits for it.
        average = self._average_model
        if average is None or _layout(average.module) != _layout(pl_module):
            self._build(pl_module)
        elif self._device is None:
            average.to(_device_of(pl_module))
        assert self._average_model is not None
        if self._pending is not None:
            self._average_model.load_state_dict(self._pending)
            self._pending = None

    def _build(self, module: torch.nn.Module) -> None:
        # AveragedModel deep-copies the module; the copy is detached from the trainer (TrainModule.__getstate__).
        self._average_model = AveragedModel(module, device=self._device or _device_of(module),
                                            use_buffers=self._use_buffers, **self._kwargs)

    # -- updates -----------------------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: TrainerView, pl_module: torch.nn.Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._update(pl_module)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._update(pl_module)
            self._latest_update_epoch = epoch

    def _update(self, module: torch.nn.Module) -> None:
        assert self._average_model is not None
        self._average_model.update_parameters(module)

    def _has_average(self) -> bool:
        return self._average_model is not None

    # -- validation and the end of fit on the averaged weights -----------------------------------------------
    def on_validation_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._has_average():
            self._swap_models(pl_module)

    def on_validation_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._has_average():
            self._swap_models(pl_module)

    def on_train_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._has_average():
            self._copy_average_to_current(pl_module)

    def _pairs(self, module: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        assert self._average_model is not None
        average, current = self._average_model.module, module
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = list(zip(average.parameters(), current.parameters()))
        if self._use_buffers:  # otherwise the averaged copy's buffers are stale: the module keeps its own
            pairs += list(zip(average.buffers(), current.buffers()))
        return pairs

    # Lightning's names for the two weight moves: a subclass counting or wrapping them (as Lightning's own tests
    # do) sees every swap around a validation epoch and the one copy when fit ends.
    def _swap_models(self, module: torch.nn.Module) -> None:
        """Exchange the module's weights with the averaged copy's (around each validation epoch)."""
        with torch.no_grad():
            for average, current in self._pairs(module):
                saved = average.detach().clone()
                average.copy_(current.detach())
                current.copy_(saved)

    def _copy_average_to_current(self, module: torch.nn.Module) -> None:
        """Give the module the averaged weights (when fit ends)."""
        with torch.no_grad():
            for average, current in self._pairs(module):
                current.copy_(average.detach())

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        average = self._average_model.state_dict() if self._average_model is not None else self._pending
        return {"latest_update_step": self._latest_update_step, "latest_update_epoch": self._latest_update_epoch,
                "average_model": dict(average) if average is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = int(state_dict["latest_update_step"])
        self._latest_update_epoch = int(state_dict.get("latest_update_epoch", -1))
        average = state_dict.get("average_model")
        # Loaded now into a copy of the same layout; else (none yet, or configure_model adds layers after the
        # setup-time copy) once on_fit_start has built the copy.
        if average is not None and self._average_model is not None and \
                set(average) == set(self._average_model.state_dict()):
            self._average_model.load_state_dict(average)
        else:
            self._pending = average


@suggest_keywords
class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights (Lightning 2.6's ``EMAWeightAveraging``).

    Args:
        decay: the EMA decay (``average = decay * average + (1 - decay) * weights``).
        update_every_n_steps: update after every N-th optimizer step (0: never per step).
        update_starting_at_step: first optimizer step (0-based) to update after (default: from the start).
        update_starting_at_epoch: also update at the end of every epoch from this one on (default: never).

    Example:
        >>> ema = EMAWeightAveraging(decay=0.99, update_every_n_steps=2)
        >>> ema.should_update(step_idx=4), ema.should_update(step_idx=5)
        (True, False)
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True,
                 decay: float = 0.999, update_every_n_steps: int = 1, update_starting_at_step: int | None = None,
                 update_starting_at_epoch: int | None = None, **kwargs: Any) -> None:
        if not isinstance(decay, (int, float)) or not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMAWeightAveraging(decay=...) must be a number in [0, 1]. Received: {decay!r}.")
        if not isinstance(update_every_n_steps, int) or update_every_n_steps < 0:
            raise ValueError("EMAWeightAveraging(update_every_n_steps=...) must be an int >= 0. Received: "
                             f"{update_every_n_steps!r}.")
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.decay = decay
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        if epoch_idx is not None:
            return self.update_starting_at_epoch is not None and epoch_idx >= self.update_starting_at_epoch
        return False


@suggest_keywords
class StochasticWeightAveraging(WeightAveraging):
    """Stochastic Weight Averaging: from epoch ``swa_epoch_start`` on, the learning rate anneals to ``swa_lrs``
    (``SWALR``) and the weights are averaged at every epoch end; at the end of ``fit`` the module gets the average
    and, if it has batch norm, its statistics are recomputed with ``swa_utils.update_bn`` on the training data.

    This is the loop of PyTorch's SWA recipe (``update_parameters`` then ``swa_scheduler.step()`` after each SWA
    epoch, ``update_bn`` at the end), run by the trainer.

    Args:
        swa_lrs: the SWA learning rate, one float or one per parameter group.
        swa_epoch_start: the first SWA epoch, 1-based (an int), or a fraction of ``max_epochs`` (a float in [0, 1]).
        annealing_epochs: epochs ``SWALR`` takes to reach ``swa_lrs``.
        annealing_strategy: ``"cos"`` or ``"linear"``.
        avg_fn: the averaging function of ``AveragedModel`` (default: the equal-weight mean).
        device: where the averaged copy lives (default ``"cpu"``, as Lightning; ``None``: the module's device).

    Example:
        >>> swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=3)
        >>> swa.should_update(epoch_idx=1), swa.should_update(epoch_idx=2)  # epochs are 0-based here
        (False, True)
    """

    def __init__(self, swa_lrs: float | list[float], swa_epoch_start: float = 0.8, annealing_epochs: int = 10,
                 annealing_strategy: Literal["cos", "linear"] = "cos", avg_fn: AvgFn | None = None,
                 device: torch.device | str | None = "cpu") -> None:
        # Lightning's checks and words (a test may match them; MisconfigurationException is a ValueError): a list
        # holds floats only (Lightning refuses [0.2, 1]); the single value may also be a positive int.
        lrs = swa_lrs if isinstance(swa_lrs, list) else [swa_lrs]
        floats = isinstance(swa_lrs, list)
        if not lrs or not all(isinstance(lr, float if floats else (int, float)) and not isinstance(lr, bool)
                              and lr > 0 for lr in lrs):
            raise MisconfigurationException(
                "StochasticWeightAveraging(swa_lrs=...) should be a positive float, or a list of positive floats (one "
                f"per parameter group). Received: {swa_lrs!r}.")
        if isinstance(swa_epoch_start, bool) or not (
                (isinstance(swa_epoch_start, int) and swa_epoch_start >= 1)
                or (isinstance(swa_epoch_start, float) and 0.0 <= swa_epoch_start <= 1.0)):
            raise MisconfigurationException(
                "StochasticWeightAveraging(swa_epoch_start=...) should be a >0 integer or a float between 0 and 1 "
                f"(an int: the 1-based first SWA epoch; a float: a fraction of max_epochs). Received: "
                f"{swa_epoch_start!r}.")
        if isinstance(annealing_epochs, bool) or not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise ValueError("StochasticWeightAveraging(annealing_epochs=...) must be an int >= 0. Received: "
                             f"{annealing_epochs!r}.")
        if annealing_strategy not in ("cos", "linear"):
            raise ValueError("StochasticWeightAveraging(annealing_strategy=...) must be 'cos' or 'linear'. Received: "
                             f"{annealing_strategy!r}.")
        if avg_fn is not None and not callable(avg_fn):
            raise ValueError(f"StochasticWeightAveraging(avg_fn=...) must be callable. Received: {avg_fn!r}.")
        # Parameters only, as swa_utils' recipe: batch-norm statistics are recomputed by update_bn at the end.
        super().__init__(device=device, use_buffers=False, **({"avg_fn": avg_fn} if avg_fn else {}))
        self._swa_lrs = swa_lrs
        self._swa_epoch_start = swa_epoch_start
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._swa_scheduler: SWALR | None = None
        self._scheduler_state: dict[str, Any] | None = None
        # The SWA learning rates of this epoch, applied before every step.
        self._lrs: list[float | torch.Tensor] | None = None

    @property
    def swa_start(self) -> int:
        """The first SWA epoch, 0-based (resolved from a fraction once ``fit`` knows ``max_epochs``)."""
        if isinstance(self._swa_epoch_start, float):
            raise RuntimeError("swa_start is known once fit starts (swa_epoch_start is a fraction of max_epochs).")  # noqa: TRY004
        return max(self._swa_epoch_start - 1, 0)

    @property
    def n_averaged(self) -> torch.Tensor | None:
        """How many models were averaged so far (Lightning's attribute; ``None`` before ``fit`` sets up)."""
        return None if self._average_model is None else self._average_model.n_averaged

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return epoch_idx is not None and epoch_idx >= self.swa_start

    def setup(self, trainer: TrainerView, pl_module: torch.nn.Module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        max_epochs = trainer.max_epochs
        if isinstance(self._swa_epoch_start, float):
            if max_epochs is None or max_epochs < 0:
                raise ValueError(f"StochasticWeightAveraging(swa_epoch_start={self._swa_epoch_start}) is a fraction "
                                 f"of max_epochs, but Trainer(max_epochs={max_epochs}): give swa_epoch_start as an "
                                 "int epoch, or set max_epochs.")
            self._swa_epoch_start = int(max_epochs * self._swa_epoch_start)
        if max_epochs is not None and max_epochs >= 0 and self.swa_start >= max_epochs:
            raise ValueError(f"StochasticWeightAveraging(swa_epoch_start={self.swa_start + 1}) starts after the last "
                             f"epoch (Trainer(max_epochs={max_epochs})), so nothing would be averaged: use "
                             f"swa_epoch_start <= {max_epochs} or raise max_epochs.")

    def on_fit_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(f"StochasticWeightAveraging works with exactly one optimizer; configure_optimizers "
                             f"returned {len(trainer.optimizers)}.")
        super().on_fit_start(trainer, pl_module)

    # -- the SWA learning rate -------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if self._swa_scheduler is not None or trainer.current_epoch < self.swa_start:
            return
        optimizer = trainer.optimizers[0]
        resumed = self._scheduler_state  # resumed: the optimizer's groups already hold their swa_lr
        swa_lrs = [g["swa_lr"] for g in optimizer.param_groups] if resumed is not None else self._swa_lrs
        self._swa_scheduler = SWALR(
            optimizer, swa_lr=swa_lrs,  # type: ignore[arg-type]  # torch's stub says float; SWALR takes a list too
            anneal_epochs=self._annealing_epochs, anneal_strategy=self._annealing_strategy)
        if resumed is not None:
            self._swa_scheduler.load_state_dict(resumed)
            self._scheduler_state = None
        elif trainer.is_global_zero:  # once, when SWA starts (a resumed run saw it then)
            _say_swalr_takes_over(trainer.lr_scheduler_configs)
        self._lrs = list(self._swa_scheduler.get_last_lr())
        self._apply_lrs(optimizer)

    def on_before_optimizer_step(self, trainer: TrainerView, pl_module: torch.nn.Module,
                                 optimizer: torch.optim.Optimizer) -> None:
        # SWALR owns the learning rate during SWA (Lightning swaps the module's scheduler out): whatever another
        # scheduler set since, the step uses SWALR's value.
        if self._lrs is not None:
            self._apply_lrs(optimizer)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        super().on_train_epoch_end(trainer, pl_module)  # the average first, as in the recipe
        if self._swa_scheduler is not None:
            optimizer = trainer.optimizers[0]
            self._apply_lrs(optimizer)  # SWALR anneals from the value it set, not from another scheduler's
            self._swa_scheduler.step()
            self._lrs = list(self._swa_scheduler.get_last_lr())

    def _apply_lrs(self, optimizer: torch.optim.Optimizer) -> None:
        assert self._lrs is not None
        for group, lr in zip(optimizer.param_groups, self._lrs):
            group["lr"] = lr

    # -- the end of fit ----------------------------------------------------------------------------------------
    def _has_average(self) -> bool:
        # Before the first SWA epoch ends there is nothing averaged: validate and keep the trained weights.
        return self._average_model is not None and int(self._average_model.n_averaged) > 0

    def on_train_end(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if not self._has_average():
            return
        self._copy_average_to_current(pl_module)
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in pl_module.modules()):
            loader = trainer.train_dataloader
            assert loader is not None
            # The loader as given (trainer.train_dataloader in one process) leaves its batches on the CPU.
            update_bn(loader, pl_module, device=getattr(pl_module, "device", None))

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        scheduler = self._swa_scheduler.state_dict() if self._swa_scheduler is not None else self._scheduler_state
        state.update(scheduler_state=scheduler, swa_epoch_start=self._swa_epoch_start)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._scheduler_state = state_dict.get("scheduler_state")
        self._swa_scheduler, self._lrs = None, None
        self._swa_epoch_start = state_dict.get("swa_epoch_start", self._swa_epoch_start)


def _say_swalr_takes_over(configs: list[Any]) -> None:
    """Lightning 2.6's warning and info line (observed) when SWA starts while the module has a scheduler: SWALR
    sets the learning rate from then on, once per epoch, whatever the module's scheduler's interval."""
    if not configs:
        return
    config = configs[0]
    if config.interval != "epoch" or config.frequency != 1:
        warnings.warn(f"SWA is currently only supported every epoch. Found {config}: from the first SWA epoch on, "
                      "SWALR sets the learning rate and steps once per epoch, and this scheduler's steps are "
                      "overridden. Give it interval='epoch' and frequency=1 to silence this.",
                      UserWarning, stacklevel=4)
    log.info(f"Swapping scheduler `{type(config.scheduler).__name__}` for `SWALR`")


def _layout(module: torch.nn.Module) -> list[tuple[str, torch.Size]]:
    return [(name, p.shape) for name, p in module.named_parameters()]


def _device_of(module: torch.nn.Module) -> torch.device:
    return next(iter(module.parameters()), torch.empty(0)).device
