"""`TrainerViews`: the Trainer's read-only Lightning attributes, its stop flag, and its checkpoint contents."""

from __future__ import annotations

from typing import Any

from callbacks import Callback
from engine import Accelerator
from trainer.datamodule import DataModule
from trainer.hooks import HookTable
from trainer.metrics import MetricLogger, to_python
from trainer.module import TrainModule
from trainer.state import TrainState


class TrainerViews:
    """Properties every Lightning user reads (``current_epoch``, ``callback_metrics``, ``should_stop``...)."""

    accelerator: Accelerator
    state: TrainState
    callbacks: list[Callback]
    module: TrainModule | None
    datamodule: DataModule | None
    _metrics: MetricLogger
    _hooks: HookTable | None
    max_epochs: int | None
    max_steps: int | None
    accumulate_grad_batches: int | None
    num_training_batches: int | None
    _stop_requested: bool
    _send_to_trackers: Any

    @property
    def current_epoch(self) -> int:
        """The training epoch in progress (0-based; after fit, the number of epochs run)."""
        return self.state.epoch

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self.state.global_step

    @property
    def lightning_module(self) -> TrainModule | None:
        """The module being (or last) run; Lightning's name for ``trainer.module``."""
        return self.module

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the main process (rank 0)."""
        return self.accelerator.is_main_process

    @property
    def world_size(self) -> int:
        """The number of processes."""
        return self.accelerator.num_processes

    @property
    def global_rank(self) -> int:
        """This process's rank."""
        return self.accelerator.process_index

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine."""
        return self.accelerator.local_process_index

    @property
    def log_dir(self) -> str | None:
        """Where the trackers write (the engine's ``logging_dir``)."""
        return self.accelerator.logging_dir

    @property
    def sanity_checking(self) -> bool:
        """Whether the validation sanity check is running."""
        return self.state.stage == "sanity_check"

    @property
    def training(self) -> bool:
        """Whether training batches are running (False during fit's validation)."""
        return self.state.stage == "train"

    @property
    def validating(self) -> bool:
        """Whether a validation run is in progress (inside fit or ``validate``)."""
        return self.state.stage == "validate"

    @property
    def testing(self) -> bool:
        """Whether ``test`` is running."""
        return self.state.stage == "test"

    @property
    def predicting(self) -> bool:
        """Whether ``predict`` is running."""
        return self.state.stage == "predict"

    @property
    def callback_metrics(self) -> dict[str, Any]:
        """The latest value of every logged metric (tensors; epoch values replace step values at epoch end)."""
        return dict(self._metrics.callback_metrics)

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """What was last sent to the trackers, by name (tensors)."""
        return dict(self._metrics.logged_metrics)

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The ``prog_bar=True`` metrics as Python numbers (reading it syncs the device once)."""
        return to_python(self._metrics.progress_bar_metrics)

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps ``fit`` will take (``inf`` when unbounded), e.g. for ``OneCycleLR(total_steps=...)``."""
        per_epoch = self.num_training_batches
        epochs = self.max_epochs
        if per_epoch is None or epochs is None:
            return self.max_steps if self.max_steps is not None else float("inf")
        steps = -(-per_epoch // (self.accumulate_grad_batches or 1)) * epochs
        return min(steps, self.max_steps) if self.max_steps is not None else steps

    @property
    def should_stop(self) -> bool:
        """Whether training stops at the next step boundary. Setting it True on any process stops every process
        at the same step (through the engine's trigger)."""
        return self.state.should_stop or self._stop_requested

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        if value:
            self._stop_requested = True
            self.accelerator.set_trigger()
        else:
            self._stop_requested = self.state.should_stop = False

    def log_metrics(self, values: dict[str, Any], step: int | None = None) -> None:
        """Send ``values`` to the trackers at ``step`` (default: the global step), for callbacks; values also
        show in ``logged_metrics``. A no-op without running trackers."""
        self._metrics.logged_metrics.update(values)
        self._send_to_trackers(values, step)

    # -- checkpoint contents ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The trainer's part of a checkpoint: ``TrainState``, every callback's state, the data module's state."""
        callbacks: dict[str, Any] = {}
        for callback in self.callbacks:
            state = callback.state_dict()
            if state:
                if callback.state_key in callbacks:
                    raise ValueError(f"Two callbacks save state under the key {callback.state_key!r}: override "
                                     "`state_key` so each is unique (e.g. include its arguments).")
                callbacks[callback.state_key] = state
        datamodule = self.datamodule.state_dict() if self.datamodule is not None else {}
        return {"state": self.state.state_dict(), "callbacks": callbacks, "datamodule": datamodule}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (callbacks matched by ``state_key``)."""
        self.state.load_state_dict(state_dict["state"])
        for callback in self.callbacks:
            if callback.state_key in state_dict["callbacks"]:
                callback.load_state_dict(state_dict["callbacks"][callback.state_key])
        if self.datamodule is not None and state_dict.get("datamodule"):
            self.datamodule.load_state_dict(state_dict["datamodule"])

