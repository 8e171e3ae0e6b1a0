"""`StopController`: when ``fit`` stops, and how every process agrees on it.

Anything that stops a run (``trainer.should_stop = True`` from a callback on any process, ``max_time``, a
preemption signal) goes through the engine's trigger at a step boundary, so every process stops at the same
step. A stop that should leave a resumable checkpoint (preemption; ``max_time`` with a ``ModelCheckpoint``)
is reported by ``interrupt()``; the trainer saves it at that boundary.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from typing import NoReturn

import torch

from callbacks.exceptions import MisconfigurationException
from engine import Accelerator
from trainer.config import TrainerConfig
from trainer.loop.signals import Preempted, PreemptionHandler, resume_hint
from trainer.plugins.environments import ClusterEnvironment
from trainer.state import TrainState


class StopController:
    """Owns the stop request, the ``max_time`` clock, the interrupt flags and the agreed stop.

    Args:
        accelerator: its trigger (``set_trigger`` / ``check_trigger``) and ``reduce`` make the decision collective.
        state: the run's ``TrainState``; ``should_stop`` and ``time_elapsed`` are written there.
        preemption: the signal handler whose flag a preemption sets.
    """

    def __init__(self, accelerator: Accelerator, state: TrainState, preemption: PreemptionHandler) -> None:
        self.accelerator = accelerator
        self.state = state
        self.preemption = preemption
        self.world = accelerator.num_processes
        self.requested = False  # a stop asked for on this process, not yet agreed
        self._interrupt: str | None = None  # "preempted" / "max_time" once every process agreed on it
        self._local_interrupts: set[str] = set()
        self._pending_min = False  # a stop agreed before min_epochs / min_steps: it waits for them
        self._clock = 0.0

    # -- the flag callbacks set -------------------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        return self.state.should_stop or self.requested

    def request(self, value: bool) -> None:
        """``trainer.should_stop = value``: True asks every process to stop at the next boundary."""
        if value:
            self.requested = True
            self.accelerator.set_trigger()
        else:
            self.requested = self.state.should_stop = False

    # -- a fit starts or resumes ------------------------------------------------------------------------------
    def start(self) -> None:
        """A fit (or a resumed one) starts: nothing is pending (no stop, no stopped epoch, no open batch) and the
        clock continues from ``time_elapsed``."""
        self.state.should_stop = self.requested = self._pending_min = self.state.batch_open = False
        self.state.stopped_at = None
        self._interrupt, self._local_interrupts = None, set()
        self._clock = time.monotonic() - self.state.time_elapsed

    def update_time(self) -> float:
        """Bring ``state.time_elapsed`` up to date (per step with ``max_time``, else at epoch ends and saves)."""
        self.state.time_elapsed = time.monotonic() - self._clock
        return self.state.time_elapsed

    # -- the decision -----------------------------------------------------------------------------------------
    def fit_done(self, config: TrainerConfig, num_training_batches: int | None) -> bool:
        """Whether fit ends before another epoch (limits reached, or an agreed stop)."""
        state = self.state
        if num_training_batches == 0:
            return True  # limit_train_batches=0 turns training off (the sanity check still runs), as in Lightning
        if config.max_epochs is not None and state.epoch >= config.max_epochs:
            return True
        if config.max_steps is not None and state.global_step >= config.max_steps:
            return True
        return self.stop_now(config)

    def reached(self, config: TrainerConfig) -> str | None:
        """The limit keyword the run stands at (``"max_steps"``, ``"max_epochs"``, ``"max_time"``), or None."""
        state = self.state
        if config.max_steps is not None and state.global_step >= config.max_steps:
            return "max_steps"
        if config.max_epochs is not None and state.epoch >= config.max_epochs:
            return "max_epochs"
        if config.max_time is not None and state.time_elapsed >= config.max_time:
            return "max_time"
        return None

    def limit_reached(self, config: TrainerConfig) -> str | None:
        """Which limit ended ``fit`` (Lightning's words, e.g. "`max_epochs=10` reached."), or None (a stop)."""
        name = self.reached(config)
        if name == "max_time":
            return f"`max_time={config.max_time:g}` seconds reached (elapsed {self.state.time_elapsed:.1f} s)."
        return None if name is None else f"`{name}={getattr(config, name)}` reached."

    def say_already_reached(self, config: TrainerConfig, ckpt_path: str | None) -> None:
        """After a resume: say (on the main process) when the run had already reached one of its limits, so
        nothing is left to train, and which keyword to raise (Lightning only says "`Trainer.fit` stopped: ...")."""
        name, state = self.reached(config), self.state
        if name is None:
            return
        if name == "max_epochs" and config.max_epochs is not None and state.epoch > config.max_epochs:
            # Past the limit, not at it: the limit was lowered (Lightning's error and words, then the fix).
            raise MisconfigurationException(
                f"You restored a checkpoint with current_epoch={state.epoch}, but you have set Trainer(max_epochs="
                f"{config.max_epochs}). Set max_epochs above {state.epoch} to train further, or resume from an "
                "earlier checkpoint.")
        where = {"max_steps": f"at step {state.global_step}", "max_epochs": f"at epoch {state.epoch}",
                 "max_time": f"after {state.time_elapsed:.1f} s of training"}[name]
        value = f"{config.max_time:g} s" if name == "max_time" else getattr(config, name)
        self.accelerator.print(f"fit(ckpt_path={ckpt_path!r}): the run already reached {name}={value} {where}; "
                               f"nothing to train. Raise {name} to train further.")

    def stop_now(self, config: TrainerConfig) -> bool:
        """Whether to stop at this step boundary; every process reaches the same answer at the same step.

        A stop agreed before ``min_epochs`` / ``min_steps`` stays pending and happens at the first boundary where
        both are met (an epoch end for ``min_epochs``), as in Lightning.
        """
        state = self.state
        if state.should_stop or (config.max_steps is not None and state.global_step >= config.max_steps):
            return True  # decided already: no second stop (nor a second interrupt save) for the same run
        if self._pending_min and self._minimum_met(config):
            state.should_stop = True
            return True
        # The clock is only read per step when max_time needs it (a clock read can be a syscall in a VM).
        if config.max_time is not None and not self.requested and self.update_time() >= config.max_time:
            self._local_interrupts.add("max_time")
            self.request(True)
        if self.preemption.check() is not None and "preempted" not in self._local_interrupts:
            self._local_interrupts.add("preempted")  # the handler only set a flag; act where everyone meets
            self.request(True)
        # Only a rank that asked can know a stop is pending in a single process; with several, ask everyone.
        if (self.requested or self.world > 1) and self.accelerator.check_trigger():
            self.requested = False
            self._interrupt = self._agree_interrupt()
            if self._interrupt in ("preempted", "requeue") or self._minimum_met(config):
                state.should_stop = True
            else:
                self._interrupt = None
                if not self._pending_min:
                    warnings.warn(f"A stop was requested at epoch {state.epoch}, step {state.global_step}, before "
                                  f"min_epochs={config.min_epochs} / min_steps={config.min_steps}: training goes on "
                                  "and stops once both are reached.", UserWarning, stacklevel=3)
                self._pending_min = True
        return state.should_stop

    def _minimum_met(self, config: TrainerConfig) -> bool:
        """Whether ``min_epochs`` epochs are complete and ``min_steps`` steps taken."""
        return self.state.epoch >= (config.min_epochs or 0) and self.state.global_step >= (config.min_steps or 0)

    def take_interrupt(self) -> str | None:
        """The agreed interrupt (``"preempted"`` / ``"requeue"`` / ``"max_time"``) of the stop just decided, once."""
        reason, self._interrupt = self._interrupt, None
        return reason

    def _agree_interrupt(self) -> str | None:
        """Why the agreed stop happened, if it was an interrupt on any process (one reduce, only at a stop)."""
        local = self._local_interrupts
        flags = torch.tensor([float("preempted" in local), float("max_time" in local),
                              float(self.preemption.requeue_asked)], device=self.accelerator.device)
        if self.world > 1:
            flags = self.accelerator.reduce(flags, "sum")
        local.clear()
        preempted, timed_out, requeue = (bool(v) for v in flags.tolist())
        # A requeue signal on any process: process 0 requeues the job after the save, even if its own copy of the
        # signal has not arrived yet (SLURM signals every task, not at the same instant).
        return "requeue" if requeue else "preempted" if preempted else "max_time" if timed_out else None

    def exit_preempted(self, requeue: bool, newest: str | None, finish: Callable[[], None], exit_code: int,
                       cluster: ClusterEnvironment | None) -> NoReturn:
        """After the preemption checkpoint is committed: finish the trackers (``finish``), requeue the job on
        process 0 when a requeue signal came (``cluster.requeue()``), say so in one line and raise ``Preempted``.

        The requeue comes last: SLURM ends the job's tasks once it is requeued, so everything that must reach the
        disk already has.
        """
        signal_name = self.preemption.consume() or "a signal to another process"
        finish()
        state, main = self.state, self.accelerator.is_main_process
        where = resume_hint(newest)
        if requeue and cluster is not None:  # the requeued job resumes by itself: the cluster says how it went
            where = f"the checkpoint is {newest}. " + (cluster.requeue() if main else "The job is requeued.")
        message = (f"Preempted by {signal_name} at epoch {state.epoch}, batch {state.batch_in_epoch}, step "
                   f"{state.global_step}: checkpoint saved; {where}")
        if main:
            print(message, file=sys.stderr, flush=True)  # a SystemExit with a code prints nothing itself
        raise Preempted(exit_code, message)
