"""Lightning's ``Trainer`` attribute names, declared in one table and each read from its one owner.

``trainer.max_epochs`` reads ``trainer.config.max_epochs``, ``trainer.val_dataloaders`` the run plan's prepared
loaders, ``trainer.global_step`` the ``TrainState``, and so on. ``LIGHTNING_ATTRIBUTES`` lists every such name
with the part it shows; ``with_lightning_attributes`` puts them on the Trainer class as descriptors (a plain
attribute lookup, no ``__getattr__`` fallback), so the Trainer's own body holds only its own behaviour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from callbacks import EarlyStopping, ProgressBar
from trainer import args as checks
from trainer.compat import devices
from trainer.compat.keywords import log_dir, logger_views
from trainer.compat.loop_views import EvaluationLoopView, FitLoopView
from trainer.compat.pickling import reduce_trainer
from trainer.metrics.logger import to_python
from trainer.states import TrainerFn, TrainerStatus


class _View:
    """A Trainer attribute computed from one of its parts; ``read`` / ``write`` say how."""

    name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else self.read(obj)

    def __set__(self, obj: Any, value: Any) -> None:
        self.write(obj, value)

    def read(self, obj: Any) -> Any:
        raise AttributeError(self.name)

    def write(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"trainer.{self.name} is set by the trainer; it cannot be assigned.")


class ConfigField(_View):
    """``trainer.<name>`` reads ``trainer.config.<name>``; ``settable`` ones take a new count (validated), as
    Lightning lets scripts raise ``max_epochs`` before a second ``fit``. The others refuse assignment."""

    def __init__(self, settable: bool = False, minimum: int = 0) -> None:
        self.settable = settable
        self.minimum = minimum

    def read(self, obj: Any) -> Any:
        return getattr(obj.config, self.name)

    def write(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"trainer.{self.name} is read-only after construction: pass Trainer({self.name}="
                                 f"{value!r}) instead.")
        if not (self.name in ("max_epochs", "max_steps") and value == -1):  # -1: Lightning's "no limit"
            value = checks.check_count(self.name, value, self.minimum, allow_none=self.minimum == 0)
        obj.config = dataclasses.replace(obj.config, **{self.name: value})  # checked again as a whole


class LoopLimit(ConfigField):
    """``trainer.max_epochs`` / ``trainer.max_steps`` as Lightning shows them (settable as a ``ConfigField``).

    ``max_steps``: -1 for no limit (``TrainerConfig`` stores ``None``). ``max_epochs``: what was given until a fit
    starts (``None`` when it was not), then the resolved limit: 1000 when nothing else limits the run, -1 when
    ``max_steps`` / ``max_time`` do or -1 was given.
    """

    def read(self, obj: Any) -> Any:
        config = obj.config
        value = getattr(config, self.name)
        if self.name == "max_steps":
            return -1 if value is None else value
        if config.max_epochs_unlimited:
            return -1
        if value is not None and not config.max_epochs_defaulted:
            return value
        fitted = obj.state.fn == TrainerFn.FITTING or obj.plan.train_source is not None
        return None if not fitted else -1 if value is None else value


class PartField(_View):
    """``trainer.<name>`` reads ``trainer.<part>.<attribute>`` (read-only unless ``settable``)."""

    def __init__(self, part: str, attribute: str, settable: bool = False) -> None:
        self.part = part
        self.attribute = attribute
        self.settable = settable

    def read(self, obj: Any) -> Any:
        return getattr(getattr(obj, self.part), self.attribute)

    def write(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"trainer.{self.name} is set by the trainer ({self.part}.{self.attribute}); it "
                                 "cannot be assigned.")
        setattr(getattr(obj, self.part), self.attribute, value)


class StageFlag(_View):
    """``trainer.<name>``: whether the trainer's stage (``trainer.state.stage``) is ``stage`` (read-only)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def read(self, obj: Any) -> Any:
        return obj.state.stage == self.stage


class Computed(_View):
    """``trainer.<name>``: a value computed from the trainer's parts by ``read`` (read-only)."""

    def __init__(self, read: Callable[[Any], Any]) -> None:
        self.compute = read

    def read(self, obj: Any) -> Any:
        return self.compute(obj)


def _first(kind: type) -> Callable[[Any], Any]:
    """The trainer's first callback of type ``kind``, or None."""
    def read(obj: Any) -> Any:
        return next((c for c in obj.callbacks if isinstance(c, kind)), None)
    return read


def _val_check_batch(trainer: Any) -> int | float | None:
    """Lightning's ``trainer.val_check_batch``: the training batches between fit's validations, as the last fit
    planned them; ``inf`` once per epoch over a loader without a length; ``None`` before a fit with validation and
    for a time-based ``val_check_interval``."""
    plan = trainer.plan
    if plan.val_every is not None:
        return int(plan.val_every)
    return float("inf") if plan.val_loaders and plan.val_seconds is None else None


def _all(kind: type) -> Callable[[Any], list[Any]]:
    """Every callback of type ``kind``, in calling order."""
    def read(obj: Any) -> list[Any]:
        return [c for c in obj.callbacks if isinstance(c, kind)]
    return read


# Every Lightning attribute name the Trainer shows, with the part that owns the value.
LIGHTNING_ATTRIBUTES: dict[str, _View] = {
    "callbacks": PartField("attached", "callbacks", settable=True),
    "module": PartField("attached", "module", settable=True),  # the TrainModule being (or last) run
    "model": PartField("attached", "module"),  # Lightning's names for it: the module, never a wrapper
    "lightning_module": PartField("attached", "module"),
    "datamodule": PartField("attached", "datamodule", settable=True),
    "max_epochs": LoopLimit(settable=True),
    "max_steps": LoopLimit(settable=True),
    "min_epochs": ConfigField(settable=True),
    "min_steps": ConfigField(settable=True),
    "accumulate_grad_batches": ConfigField(settable=True, minimum=1),  # GradientAccumulationScheduler sets it
    "max_time": ConfigField(),
    "gradient_clip_val": ConfigField(),
    "gradient_clip_algorithm": ConfigField(),
    "val_check_interval": ConfigField(),
    "check_val_every_n_epoch": ConfigField(),
    "val_check_batch": Computed(_val_check_batch),
    # -1 ("all of them") reads as Lightning shows it: inf.
    "num_sanity_val_steps": Computed(lambda t: float("inf") if t.config.num_sanity_val_steps == -1
                                     else t.config.num_sanity_val_steps),
    "limit_train_batches": ConfigField(),
    "limit_val_batches": ConfigField(),
    "limit_test_batches": ConfigField(),
    "limit_predict_batches": ConfigField(),
    "fast_dev_run": Computed(lambda t: True if t.config.fast_dev_run == 1 else t.config.fast_dev_run),  # 1: True
    "overfit_batches": ConfigField(),
    "log_every_n_steps": ConfigField(),  # 0 under barebones, as in Lightning
    "barebones": ConfigField(),
    "enable_checkpointing": ConfigField(),
    "on_nonfinite_loss": ConfigField(),
    "preemption_exit_code": ConfigField(),
    "project_name": ConfigField(),
    "train_dataloader": PartField("plan", "train_dataloader"),  # a combined collection as given
    # The loaders in the shape they were given (one loader, or a list / dict of them), prepared, as Lightning.
    "val_dataloaders": PartField("plan", "val_dataloaders"),
    "test_dataloaders": PartField("plan", "test_dataloaders"),
    "predict_dataloaders": PartField("plan", "predict_dataloaders"),
    "enable_validation": Computed(lambda t: bool(t.plan.val_loaders)),  # a fit's validation loop runs
    "num_training_batches": PartField("plan", "num_training_batches"),
    "num_val_batches": PartField("plan", "num_val_batches"),
    "num_sanity_val_batches": PartField("plan", "num_sanity_val_batches"),
    "num_test_batches": PartField("plan", "num_test_batches"),
    "num_predict_batches": PartField("plan", "num_predict_batches"),
    "optimizers": PartField("plan", "optimizers"),
    "lr_scheduler_configs": PartField("plan", "scheduler_configs"),
    "current_epoch": PartField("state", "epoch"),
    "global_step": PartField("state", "global_step"),
    "callback_metrics": PartField("metric_logger", "callback_metrics"),
    "logged_metrics": PartField("metric_logger", "logged_metrics"),
    "world_size": PartField("accelerator", "num_processes"),
    "global_rank": PartField("accelerator", "process_index"),
    "local_rank": PartField("accelerator", "local_process_index"),
    "is_global_zero": PartField("accelerator", "is_main_process"),
    # Lightning-style loggers: the given ones, or views of the running trackers (a DummyLogger where none log).
    "loggers": Computed(lambda t: logger_views(t._loggers, t.accelerator.trackers, bool(t.config.fast_dev_run),
                                               t._trackers_asked, t.accelerator.is_main_process)),
    "logger": Computed(lambda t: next(iter(t.loggers), None)),  # the first of loggers, or None
    # "32-true", "bf16-mixed", "16-mixed", "64-true", "bf16-true"... ("fp8": the engine's torchao fp8)
    "precision": Computed(lambda t: devices.precision_name(t.config, t.accelerator)),
    "progress_bar_metrics": Computed(lambda t: to_python(t.metric_logger.progress_bar_metrics)),  # one device sync
    # Optimizer steps fit will take (inf when unbounded), e.g. for OneCycleLR(total_steps=...).
    "estimated_stepping_batches": Computed(lambda t: t.plan.estimated_steps(t.config)),
    "checkpoint_callback": Computed(lambda t: next(iter(t.checkpoint_callbacks), None)),  # the first ModelCheckpoint
    "log_dir": Computed(lambda t: log_dir(t.loggers, t.default_root_dir)),  # the first logger's run folder
    "checkpoint_callbacks": PartField("checkpointer", "checkpoint_callbacks"),  # every ModelCheckpoint, in order
    "default_checkpoint_dir": PartField("checkpointer", "default_dir"),  # {project_dir}/checkpoints
    "sanity_checking": StageFlag("sanity_check"),
    "training": StageFlag("train"),  # False during fit's validation
    "validating": StageFlag("validate"),  # inside fit or validate()
    "testing": StageFlag("test"),
    "predicting": StageFlag("predict"),
    "early_stopping_callback": Computed(_first(EarlyStopping)),
    "early_stopping_callbacks": Computed(_all(EarlyStopping)),
    "progress_bar_callback": Computed(_first(ProgressBar)),  # None without a bar (enable_progress_bar=False)
    "num_nodes": ConfigField(),
    "default_root_dir": Computed(lambda t: devices.root_dir(t.accelerator.project_dir)),
    "num_devices": Computed(lambda t: len(devices.device_ids(t.accelerator))),
    "device_ids": Computed(lambda t: devices.device_ids(t.accelerator)),
    "node_rank": Computed(lambda t: devices.node_rank(t.accelerator)),
    "ckpt_path": PartField("checkpointer", "ckpt_path"),  # what the last fit / validate / ... loaded, or None
    "interrupted": Computed(lambda t: t.state.status == TrainerStatus.INTERRUPTED),
    "received_sigterm": Computed(lambda t: t.stop.preemption.received is not None),
    # Lightning's loop objects, as read-only views over the state above (trainer.compat.loop_views).
    "fit_loop": Computed(FitLoopView),
    "validate_loop": Computed(lambda t: EvaluationLoopView(t, "validate")),
    "test_loop": Computed(lambda t: EvaluationLoopView(t, "test")),
    "predict_loop": Computed(lambda t: EvaluationLoopView(t, "predict")),
}

T = TypeVar("T", bound=type)


def with_lightning_attributes(cls: T) -> T:
    """Class decorator: every ``LIGHTNING_ATTRIBUTES`` name as a descriptor of ``cls`` (refusing a clash with a
    name ``cls`` defines itself), and Lightning's pickling (``trainer.compat.pickling``)."""
    cls.__reduce__ = reduce_trainer  # type: ignore[assignment]  # the stub types __reduce__ as object's method
    for name, view in LIGHTNING_ATTRIBUTES.items():
        if name in vars(cls):
            raise TypeError(f"{cls.__name__}.{name} is defined by the class and in LIGHTNING_ATTRIBUTES: keep one.")
        view.__set_name__(cls, name)
        setattr(cls, name, view)
    return cls
