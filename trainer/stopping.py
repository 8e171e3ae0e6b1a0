"""`StopMixin`: when fit stops, validates and checkpoints, and how every process agrees on it.

Anything that stops a run (``trainer.should_stop`` from a callback on any process, ``max_time``, a preemption
signal) goes through the engine's trigger at a step boundary, so every process stops at the same step. A stop
that should leave a resumable checkpoint (preemption; ``max_time`` with a ``ModelCheckpoint``) saves it there.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from engine import Accelerator
from trainer.signals import Preempted, PreemptionHandler
from trainer.state import TrainState


class StopMixin:
    """Stop conditions, the batch boundary, interrupts (preemption, ``max_time``) and validation timing."""

    accelerator: Accelerator
    state: TrainState
    max_epochs: int | None
    max_steps: int | None
    min_epochs: int | None
    min_steps: int | None
    max_time: float | None
    check_val_every_n_epoch: int | None
    num_training_batches: int | None
    val_dataloaders: list[Any]
    train_dataloader: Any
    preemption_exit_code: int
    _preemption: PreemptionHandler
    _interrupt: str | None
    _local_interrupts: set[str]
    _stop_requested: bool
    _world: int
    _val_every: int | None
    _fit_clock: float
    _plateau_step_schedulers: list[Any]
    _step_schedulers: Any
    _flush_boundary: Any
    _save_interrupted: Any
    _finish_trackers: Any
    checkpoint_callback: Any

    def _fit_done(self) -> bool:
        state = self.state
        if self.num_training_batches == 0:
            return True  # limit_train_batches=0 turns training off (the sanity check still runs), as in Lightning
        if self.max_epochs is not None and state.epoch >= self.max_epochs:
            return True
        if self.max_steps is not None and state.global_step >= self.max_steps:
            return True
        if self._stop_now():
            self._handle_interrupt()
            return True
        return False

    def _batch_boundary(self, stepped: bool) -> bool:
        """A training batch is completely done: run step-interval plateau schedulers, agree on stopping, write
        the checkpoints that waited for this point, and act on an interrupt. Returns whether to stop."""
        stop = False
        if stepped:
            if self._plateau_step_schedulers:  # after validation: they may monitor a validation metric
                self._step_schedulers(self._plateau_step_schedulers)
            stop = self._stop_now()
        self._flush_boundary(stepped)
        if stop:
            self._handle_interrupt()
        return stop

    def _stop_now(self) -> bool:
        """Whether to stop at this step boundary; every process reaches the same answer at the same step."""
        state = self.state
        if state.should_stop or (self.max_steps is not None and state.global_step >= self.max_steps):
            return True  # decided already: no second stop (nor a second interrupt save) for the same run
        # The clock is only read per step when max_time needs it (a clock read can be a syscall in a VM).
        if self.max_time is not None and not self._stop_requested and self._update_time() >= self.max_time:
            self._local_interrupts.add("max_time")
            self.should_stop = True
        if self._preemption.received is not None and "preempted" not in self._local_interrupts:
            self._local_interrupts.add("preempted")  # the handler only set a flag; act where everyone meets
            self.should_stop = True
        # Only a rank that asked can know a stop is pending in a single process; with several, ask everyone.
        if (self._stop_requested or self._world > 1) and self.accelerator.check_trigger():
            self._stop_requested = False
            self._interrupt = self._agree_interrupt()
            if self._interrupt == "preempted" or (state.epoch >= (self.min_epochs or 0)
                                                  and state.global_step >= (self.min_steps or 0)):
                state.should_stop = True
            else:
                self._interrupt = None
                warnings.warn(f"A stop was requested at epoch {state.epoch}, step {state.global_step}, before "
                              f"min_epochs={self.min_epochs} / min_steps={self.min_steps}: training goes on.",
                              UserWarning, stacklevel=2)
        return state.should_stop

    def _agree_interrupt(self) -> str | None:
        """Why the agreed stop happened, if it was an interrupt on any process (one reduce, only at a stop)."""
        local = self._local_interrupts
        flags = torch.tensor([float("preempted" in local), float("max_time" in local)], device=self.accelerator.device)
        if self._world > 1:
            flags = self.accelerator.reduce(flags, "sum")
        local.clear()
        preempted, timed_out = (bool(v) for v in flags.tolist())
        return "preempted" if preempted else "max_time" if timed_out else None

    def _handle_interrupt(self) -> None:
        """Save the exact position for a resume; after a preemption also finish the trackers and exit."""
        reason, self._interrupt = self._interrupt, None
        if reason is None or (reason == "max_time" and self.checkpoint_callback is None):
            return
        self._save_interrupted(reason)
        if reason == "preempted":
            signal_name = self._preemption.consume() or "a signal to another process"
            self._finish_trackers()
            state = self.state
            raise Preempted(self.preemption_exit_code,
                            f"Preempted by {signal_name} at epoch {state.epoch}, batch {state.batch_in_epoch}, step "
                            f"{state.global_step}: the checkpoint is saved; run the same command with "
                            "fit(..., ckpt_path='last') to continue.")

    def _update_time(self) -> float:
        """Bring ``state.time_elapsed`` up to date (per step with ``max_time``, else at epoch ends and saves)."""
        self.state.time_elapsed = time.monotonic() - self._fit_clock
        return self.state.time_elapsed

    # -- validation timing ------------------------------------------------------------------------------------
    def _val_in_epoch(self) -> bool:
        every = self.check_val_every_n_epoch
        return bool(self.val_dataloaders) and (every is None or (self.state.epoch + 1) % every == 0)

    def _val_due(self, batch_idx: int) -> bool:
        if self._val_every is None or not self._val_in_epoch():
            return False
        if self.check_val_every_n_epoch is None:
            return self.state.micro_step % self._val_every == 0
        return (batch_idx + 1) % self._val_every == 0

    def _set_epoch(self) -> None:
        # Shuffling samplers need the epoch, also when an epoch was cut short (limit_train_batches, -1, stops).
        set_epoch = getattr(self.train_dataloader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.state.epoch)
