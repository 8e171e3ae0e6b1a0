"""Turn every Lightning return form of ``configure_optimizers`` into optimizers and scheduler configs."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from callbacks.exceptions import MisconfigurationException
from engine.prepare.optimizer import OptimizerView

_SCHEDULER_KEYS = {"scheduler", "interval", "frequency", "monitor", "strict", "name", "reduce_on_plateau"}
_OPTIMIZER_KEYS = {"optimizer", "lr_scheduler", "monitor"}
_FORMS = (
    "an optimizer; a list/tuple of optimizers; two lists `([optimizers], [schedulers])`; a dict "
    "`{'optimizer': opt, 'lr_scheduler': scheduler_or_dict, 'monitor': name}`; or a list/tuple of such dicts"
)


@dataclass
class SchedulerConfig:
    """One learning-rate scheduler and when the trainer steps it (Lightning's ``LRSchedulerConfig``).

    Attributes:
        scheduler: the user's scheduler object (stepped once per optimizer step or epoch, on every process).
        interval: ``"step"`` (after optimizer steps) or ``"epoch"`` (at the end of training epochs).
        frequency: step it every ``frequency`` intervals.
        monitor: the logged metric passed to ``scheduler.step(value)``; required for ``ReduceLROnPlateau``.
        strict: with ``monitor``, a metric that was never logged is an error (else a warning and no step).
        name: the name ``LearningRateMonitor`` logs it under (default: ``lr-<OptimizerClass>``).
        reduce_on_plateau: whether ``scheduler.step`` takes the monitored value.
    """

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None
    reduce_on_plateau: bool = False


class OptimizerConfigError(MisconfigurationException, TypeError):
    """``configure_optimizers`` returned something that is not one of its forms (Lightning raises a
    ``MisconfigurationException``; a ``TypeError`` too, as the value's type is the problem)."""


def _stateful(obj: Any) -> bool:
    """A custom scheduler Lightning accepts: it saves and loads its state (checkpoints hold it)."""
    return all(callable(getattr(obj, name, None)) for name in ("state_dict", "load_state_dict"))


def check_one_optimizer(module: Any, optimizers: list[torch.optim.Optimizer], manual: bool) -> None:
    """Lightning's rule: several optimizers (or a ``training_step`` still taking ``optimizer_idx``, Lightning 1.x's
    way to use them) need manual optimisation.

    Raises:
        RuntimeError: Lightning's type and sentence, then the count and the fix.
    """
    import inspect

    name = type(module).__name__
    if "optimizer_idx" in inspect.signature(module.training_step).parameters:
        raise RuntimeError(f"Training with multiple optimizers is only supported with manual optimization. Remove "
                           f"the `optimizer_idx` argument from `training_step` ({name}.training_step takes it), set "
                           "`self.automatic_optimization = False` and access your optimizers in `training_step` "
                           "with `opt1, opt2, ... = self.optimizers()`.")
    if not manual and len(optimizers) > 1:
        raise RuntimeError(f"Training with multiple optimizers is only supported with manual optimization: "
                           f"{name}.configure_optimizers returned {len(optimizers)} optimizers and automatic "
                           "optimisation steps exactly one. Set `self.automatic_optimization = False` in __init__ and "
                           "step them in training_step (opt1, opt2 = self.optimizers()).")


def check_custom_schedulers(configs: list[SchedulerConfig], manual: bool, custom_step: bool, owner: str) -> None:
    """Lightning's rule for a scheduler that is not torch's: under automatic optimisation the trainer steps it, so
    the module must say how (``lr_scheduler_step``); under manual optimisation the module steps it itself.

    Raises:
        MisconfigurationException: a custom scheduler, automatic optimisation, no ``lr_scheduler_step`` override.
    """
    if manual or custom_step:
        return
    for config in configs:
        if not is_scheduler(config.scheduler):
            raise MisconfigurationException(
                f"The provided lr scheduler `{type(config.scheduler).__name__}` doesn't follow PyTorch's LRScheduler "
                f"API. You should override the `LightningModule.lr_scheduler_step` hook with your own logic if you "
                f"are using a custom LR scheduler: define {owner}.lr_scheduler_step(self, scheduler, metric) "
                "calling scheduler.step(...).")


def is_scheduler(obj: Any) -> bool:
    """Whether ``obj`` is a torch learning-rate scheduler (``LRScheduler`` or ``ReduceLROnPlateau``)."""
    return isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau))


class NoOptimizer(torch.optim.Optimizer):
    """What a fit uses when ``configure_optimizers`` returned ``None`` (Lightning's "No Optimizer"): steps run
    their forward, backward and hooks, ``step`` changes nothing, so the weights stay as they are.

    Example:
        >>> NoOptimizer()
        No Optimizer
    """

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {})  # torch needs one parameter; this one is never read

    def step(self, closure: Any = None) -> Any:
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def __repr__(self) -> str:
        return "No Optimizer"


def parse_optimizers(conf: Any, manual: bool = False) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """Optimizers and scheduler configs from what ``configure_optimizers`` returned (``manual``: the module steps
    its schedulers itself, so ``monitor`` / ``strict`` / ``reduce_on_plateau`` are ignored with a warning).

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        >>> opts, configs = parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched,
        ...                                                                      "interval": "step"}})
        >>> opts == [opt], configs[0].interval
        (True, 'step')

    Raises:
        TypeError / ValueError: any other shape, an unknown dict key, a bad interval or frequency, a
            ``ReduceLROnPlateau`` without ``monitor``, or a scheduler of an optimizer that was not returned.
    """
    optimizers: list[torch.optim.Optimizer]
    configs: list[SchedulerConfig]
    if conf is None:
        return [], []  # the trainer runs without an optimizer (NoOptimizer), with a warning
    if _is_optimizer(conf):
        optimizers, configs = [conf], []
    elif isinstance(conf, Mapping):
        optimizers, configs = _from_dict(conf, manual)
    elif _is_two_lists(conf):
        optimizers = list(conf[0])
        configs = [_scheduler_config(s, None, manual) for s in conf[1]]
    elif isinstance(conf, Sequence) and not isinstance(conf, str) and conf and all(_is_optimizer(o) for o in conf):
        optimizers, configs = list(conf), []
    elif isinstance(conf, Sequence) and not isinstance(conf, str) and conf and all(isinstance(d, Mapping)
                                                                                  for d in conf):
        optimizers, configs = [], []
        for item in conf:
            opts, scheds = _from_dict(item, manual)
            optimizers += opts
            configs += scheds
    else:
        raise OptimizerConfigError(f"Unknown configuration for model optimizers: configure_optimizers returned "
                                   f"{_describe(conf)}, which is not a supported form. Return {_FORMS}.")
    for optimizer in optimizers:
        if not _is_optimizer(optimizer):
            raise OptimizerConfigError(f"Unknown configuration for model optimizers: configure_optimizers returned "
                                       f"{_describe(optimizer)} where an optimizer was expected: return "
                                       "torch.optim.Optimizer instances.")
    for config in configs:
        owner = getattr(config.scheduler, "optimizer", None)
        if owner is not None and not any(owner is opt for opt in optimizers):
            raise MisconfigurationException(
                f"Some schedulers are attached with an optimizer that wasn't returned from `configure_optimizers`: "
                f"{type(config.scheduler).__name__} steps another one. Build it on one of the returned optimizers.")
    return optimizers, configs


def _from_dict(conf: Mapping[str, Any], manual: bool = False) -> tuple[list[torch.optim.Optimizer],
                                                                      list[SchedulerConfig]]:
    unknown = set(conf) - _OPTIMIZER_KEYS
    if unknown:  # Lightning warns and ignores them
        warnings.warn(f"Found unsupported keys in the optimizer configuration: {set(unknown)}. They are ignored; "
                      f"the keys used are {sorted(_OPTIMIZER_KEYS)}.", RuntimeWarning, stacklevel=4)
    if "optimizer" not in conf:
        raise OptimizerConfigError(f"Unknown configuration for model optimizers: configure_optimizers returned a "
                                   f"dict without 'optimizer' (keys: {sorted(conf)}): add "
                                   "{'optimizer': torch.optim.<Optimizer>(...)}.")
    scheduler = conf.get("lr_scheduler")
    configs = [] if scheduler is None else [_scheduler_config(scheduler, conf.get("monitor"), manual)]
    return [conf["optimizer"]], configs


def _scheduler_config(item: Any, monitor: str | None, manual: bool = False) -> SchedulerConfig:
    if isinstance(item, Mapping) and manual:
        ignored = [key for key in item if key in ("reduce_on_plateau", "monitor", "strict")]
        if ignored:  # Lightning's text: the module steps its schedulers itself under manual optimisation
            warnings.warn(f"The lr scheduler dict contains the key(s) {ignored}, but the keys will be ignored. You "
                          "need to call `lr_scheduler.step()` manually in manual optimization.", RuntimeWarning,
                          stacklevel=5)
        item = {key: value for key, value in item.items() if key not in ignored}
    if isinstance(item, Mapping):
        unknown = set(item) - _SCHEDULER_KEYS
        if unknown:  # Lightning warns and ignores them
            warnings.warn(f"Found unsupported keys in the lr scheduler dict: {set(unknown)}. They are ignored; the "
                          f"keys used are {sorted(_SCHEDULER_KEYS)}.", RuntimeWarning, stacklevel=5)
        if "scheduler" not in item:
            raise MisconfigurationException(f'The lr scheduler dict must have the key "scheduler" with its item '
                                            f"being an lr scheduler (keys: {sorted(item)}): add "
                                            "{'scheduler': torch.optim.lr_scheduler.<Scheduler>(...)}.")
        fields = {k: v for k, v in item.items() if k in _SCHEDULER_KEYS}
        fields.setdefault("monitor", monitor)
    else:
        fields = {"scheduler": item, "monitor": monitor}
    scheduler = fields["scheduler"]
    if not is_scheduler(scheduler) and not _stateful(scheduler):
        raise TypeError(f"The provided lr scheduler `{type(scheduler).__name__}` is invalid. It should have "
                        "`state_dict` and `load_state_dict` methods defined: pass a torch.optim.lr_scheduler."
                        "LRScheduler or ReduceLROnPlateau, or an object with step(), state_dict() and "
                        "load_state_dict() (stepped by LightningModule.lr_scheduler_step).")
    fields.setdefault("reduce_on_plateau", isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau))
    config = SchedulerConfig(**fields)
    if config.interval not in ("step", "epoch"):
        raise MisconfigurationException(f'The "interval" key in lr scheduler dict must be "step" or "epoch" but is '
                                        f'"{config.interval}".')
    if config.interval == "epoch" and isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR):
        warnings.warn("A `OneCycleLR` scheduler is using 'interval': 'epoch'. Are you sure you didn't mean "
                      "'interval': 'step'?", RuntimeWarning, stacklevel=5)
    if not isinstance(config.frequency, int) or isinstance(config.frequency, bool) or config.frequency < 1:
        raise ValueError(f"lr_scheduler 'frequency' must be a positive int. Received: {config.frequency!r}.")
    if config.reduce_on_plateau and config.monitor is None and not manual:
        raise MisconfigurationException(
            f"`configure_optimizers` must include a monitor when a `ReduceLROnPlateau` scheduler is used "
            f"({type(scheduler).__name__} needs a metric to watch): return {{'optimizer': opt, 'lr_scheduler': "
            "{'scheduler': sched, 'monitor': 'val/loss'}}.")
    return config


def _is_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer)


def _is_two_lists(conf: Any) -> bool:
    return (isinstance(conf, (list, tuple)) and len(conf) == 2 and isinstance(conf[0], (list, tuple))
            and isinstance(conf[1], (list, tuple)) and all(_is_optimizer(o) for o in conf[0]))


def _describe(obj: Any) -> str:
    text = repr(obj)
    return f"{type(obj).__name__} ({text[:80]}{'...' if len(text) > 80 else ''})"


class LightningOptimizer(OptimizerView):
    """Lightning's optimizer wrapper name: a real ``torch.optim.Optimizer`` whose state lives in ``.optimizer``.

    ``self.optimizers()`` returns one under manual optimisation (a ``ManualOptimizer``, which also fires the
    step hooks). ``toggle_model()`` freezes the parameters other optimizers own while it is active (GANs).

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> opt = LightningOptimizer(torch.optim.SGD(net.parameters(), lr=0.1))
        >>> isinstance(opt, torch.optim.Optimizer), opt.param_groups[0]["lr"]
        (True, 0.1)
    """

    def __init__(self, optimizer: torch.optim.Optimizer, module: Any = None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"LightningOptimizer wraps a torch.optim.Optimizer. Received: {_describe(optimizer)}.")
        self.optimizer = optimizer
        self._module = module
        # As Lightning: an instance of the user's optimizer class too (`isinstance(opt, torch.optim.Adam)`), named
        # `LightningAdam`; the class is the innermost one, under the engine's wrapper.
        self.__class__ = _imitating(type(self), type(_innermost(optimizer)))

    def __reduce__(self) -> Any:
        # The imitating class is made at run time (no importable name): pickle the plain class and the fields.
        return _rebuilt, (type(self).__mro__[1], self.__dict__)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return self.optimizer.step() if closure is None else self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @contextlib.contextmanager
    def toggle_model(self, sync_grad: bool = True) -> Iterator[None]:
        """Only this optimizer's parameters require grad inside the block (``module.toggle_optimizer``).

        ``sync_grad=False`` also skips the cross-process gradient all-reduce of backward calls in the block
        (``accelerator.no_sync``), for accumulating over several manual backward calls.
        """
        if self._module is None:
            raise RuntimeError("toggle_model() needs the module this optimizer belongs to: use the optimizers "
                               "returned by self.optimizers() inside a run.")
        self._module.toggle_optimizer(self)
        try:
            if sync_grad:
                yield
            else:
                trainer = self._module.trainer
                with trainer.accelerator.no_sync(trainer._model):
                    yield
        finally:
            self._module.untoggle_optimizer(self)



_IMITATING: dict[tuple[type, type], type] = {}  # a cache: one made class per pair, never invalid


def _imitating(plain: type, optimizer_class: type) -> type:
    """``Lightning{Name}``: ``plain`` (a ``LightningOptimizer`` class) first, then ``optimizer_class``; one class per
    pair, so instances wrapping the same optimizer class share it. Its ``repr`` is torch's, under this name."""
    if issubclass(plain, optimizer_class):
        return plain
    key = (plain, optimizer_class)
    if key not in _IMITATING:
        _IMITATING[key] = type(f"Lightning{optimizer_class.__name__}", (plain, optimizer_class),
                               {"__module__": plain.__module__})
    return _IMITATING[key]


def _innermost(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The user's optimizer under any wrappers that keep it in ``.optimizer`` (the engine's, a LightningOptimizer)."""
    while isinstance(optimizer, OptimizerView):
        optimizer = optimizer.optimizer
    return optimizer


def _rebuilt(plain: type, fields: dict[str, Any]) -> LightningOptimizer:
    wrapper: LightningOptimizer = object.__new__(plain)
    wrapper.__dict__.update(fields)
    wrapper.__class__ = _imitating(plain, type(_innermost(fields["optimizer"])))
    return wrapper


class ManualOptimizer(LightningOptimizer):
    """What ``self.optimizers()`` returns under manual optimisation: the prepared optimizer, with its ``step``
    firing ``on_before_optimizer_step`` and counting one global step.

    Like the engine's ``AcceleratedOptimizer`` it is a real ``torch.optim.Optimizer`` (``isinstance`` holds) whose
    state lives in the wrapped optimizer.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, before_step: Callable[[torch.optim.Optimizer], None],
                 after_step: Callable[[], None], module: Any = None) -> None:
        super().__init__(optimizer, module)
        self._before_step = before_step
        self._after_step = after_step

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last step was skipped by the fp16 loss scaler."""
        return bool(getattr(self.optimizer, "step_was_skipped", False))

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """The optimizer's step (``kwargs`` passed on to it, as Lightning's ``LightningOptimizer.step``)."""
        self._before_step(self.optimizer)
        result = self.optimizer.step(**kwargs) if closure is None else self.optimizer.step(closure, **kwargs)
        self._after_step()
        return result


def clip_gradients(accelerator: Any, optimizer: torch.optim.Optimizer, value: float | None,
                   algorithm: str | None = None) -> None:
    """Clip the gradients of ``optimizer``'s parameters through the engine: by norm (default) or by value.

    ``accelerator`` is the engine's ``Accelerator`` (it unscales fp16 gradients and clips sharded ones).
    A ``value`` of None or 0 clips nothing.
    """
    if value is None or value == 0:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if (algorithm or "norm") == "value":
        accelerator.clip_grad_value_(params, value)
    else:
        accelerator.clip_grad_norm_(params, value)


def clip_settings(config: Any, value: float | None, algorithm: str | None) -> tuple[float | None, str | None]:
    """``clip_gradients``' value and algorithm with the trainer's ``config`` (Lightning's checks and messages)."""
    if value is None:
        value = config.gradient_clip_val
    elif config.gradient_clip_val is not None and config.gradient_clip_val != value:
        raise MisconfigurationException(f"You have set `Trainer(gradient_clip_val={config.gradient_clip_val!r})` and "
                                        f"have passed `clip_gradients(gradient_clip_val={value!r})`. Please use only "
                                        "one of them.")
    if algorithm is None:
        algorithm = config.gradient_clip_algorithm
    else:
        algorithm = algorithm.lower()
        if config.gradient_clip_algorithm is not None and config.gradient_clip_algorithm != algorithm:
            raise MisconfigurationException(
                f"You have set `Trainer(gradient_clip_algorithm={config.gradient_clip_algorithm!r})` and have passed "
                f"`clip_gradients(gradient_clip_algorithm={algorithm!r}) Please use only one of them.")
    return value, algorithm
