"""Each run's set-up and tear-down (``run_scope``), the module's callbacks, and how a run that failed ends on
several processes."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from callbacks import Callback
from engine import Accelerator
from trainer.build import checkpoints_last
from trainer.hparams import drop_unpicklable
from trainer.loop.hooks import HookTable, overrides
from trainer.loop.signals import Preempted, resume_hint
from trainer.metrics.tracking import TrackerLink
from trainer.module import TrainModule
from trainer.plugins.environments import ClusterEnvironment
from trainer.profiling import datamodule_hook, run_profiler
from trainer.states import TrainerFn

EXIT_GRACE_S = 5.0  # after a failure on one of several ranks, the most this process lives on (as ember launch)


def module_callbacks(module: TrainModule, callbacks: list[Callback]) -> list[Callback]:
    """``callbacks`` with the module's ``configure_callbacks()`` added, replacing those of the same type."""
    extra = module.configure_callbacks()
    extra = [extra] if isinstance(extra, Callback) else list(extra or [])
    if not extra:
        return callbacks
    kinds = {type(c) for c in extra}
    return checkpoints_last([c for c in callbacks if type(c) not in kinds] + extra)


def lend_logging(module: TrainModule, callbacks: list[Callback]) -> TrainModule:
    """As Lightning at the start of each run: every callback gets the module's ``log`` / ``log_dict``, so a
    callback's hook can call ``self.log("name", value)``. Returns ``module``."""
    for callback in callbacks:
        callback.log = module.log
        callback.log_dict = module.log_dict
    return module


def check_module(module: Any) -> TrainModule:
    if not isinstance(module, TrainModule):
        # Lightning's sentence first (code may match on it), then what to do.
        raise TypeError(f"`model` must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got "
                        f"`{type(module).__qualname__}`. The trainer runs TrainModule subclasses: derive your model "
                        "from trainer.TrainModule (Lightning's LightningModule).")
    return module


def end_failed_process(accelerator: Accelerator, error: BaseException, hint: str = "") -> None:
    """With several processes, make sure this one ends promptly after ``error``.

    Another rank may be waiting in a collective for this one (a step that raised here only), and it only fails
    once this process is gone. So the process group is destroyed and, unless the error was raised on every rank
    alike (a preemption, a non-finite loss), the process is ended with status 1 if it still runs
    ``EXIT_GRACE_S`` (5 s) later: time for the traceback to print and the exception to end the script as usual,
    but not for a caught exception or a stuck shutdown to leave the other ranks waiting. ``hint`` ends the line
    this rank prints (a failed ``fit``: where the run can resume from). Not called under a cluster that ends
    failed processes itself (Ray Train: ending the process here would race its error report and leave only "the
    actor died"); a process group adopted from the user's own code is destroyed here too, so no peer waits.
    """
    if accelerator.num_processes <= 1:
        return
    if not isinstance(error, (Preempted, FloatingPointError)):
        print(f"[ember] rank {accelerator.process_index}: {type(error).__name__} in the trainer; this process ends "
              f"within {EXIT_GRACE_S:.0f} s so the other ranks do not wait for it{'; ' + hint if hint else '.'}",
              file=sys.stderr, flush=True)
        timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(1,))
        timer.daemon = True
        timer.start()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        accelerator.state.destroy_process_group()


def eval_sources(datamodule: Any, dataloaders: Any, last_datamodule: Any) -> tuple[Any, Any]:
    """``(datamodule, dataloaders)`` of an evaluation: a data module passed as ``dataloaders`` counts as one; with
    neither, the last run's data module."""
    from trainer.datamodule import DataModule

    if isinstance(dataloaders, DataModule):
        return dataloaders, None
    if datamodule is None and dataloaders is None:
        return last_datamodule, None
    return datamodule, dataloaders


@contextlib.contextmanager
def run_scope(stage: str, hooks: HookTable, module: TrainModule, datamodule: Any, accelerator: Accelerator,
              trackers: TrackerLink, newest: Callable[[], str | None],
              cluster: ClusterEnvironment | None = None) -> Iterator[None]:
    """Prepare data and call ``setup`` before a run, ``teardown`` after it; on a failure call ``on_exception``,
    finish the trackers and (several processes) make sure this process ends promptly. The hook table's profiler
    is set up first (the setup hooks are timed too) and describes the run at its end.

    ``newest`` finds the checkpoint a ``fit(ckpt_path="last")`` would resume from: a fit that fails on several
    processes names it, on every rank still able to print (the rank that was killed cannot; its peers fail in
    their next collective). Under torchrun, once the restarts are spent, that line says where to go on from.
    ``cluster``: the run's cluster environment; one whose ``ends_failed_processes`` is True (Ray Train's) ends the
    processes itself, so a failure leaves them and the process group to it.
    """
    with run_profiler(hooks.profiler, stage, accelerator):
        yield from _run_body(stage, hooks, module, datamodule, accelerator, trackers, newest,
                             cluster is not None and cluster.ends_failed_processes)


def _run_body(stage: str, hooks: HookTable, module: TrainModule, datamodule: Any, accelerator: Accelerator,
              trackers: TrackerLink, newest: Callable[[], str | None], owner_ends: bool) -> Iterator[None]:
    try:
        drop_unpicklable(module.hparams)  # as Lightning at each run's start: a checkpoint could not hold them
        if datamodule is not None:
            first = accelerator.is_local_main_process if datamodule.prepare_data_per_node else \
                accelerator.is_main_process
            if first:
                datamodule_hook(hooks.profiler, datamodule, "prepare_data")()
        if accelerator.is_local_main_process and overrides(module, TrainModule, "prepare_data"):
            module.prepare_data()
        accelerator.wait_for_everyone()
        fn = TrainerFn(stage)  # Lightning passes a TrainerFn (a str enum: == "fit" holds, and it has .value)
        if datamodule is not None:
            datamodule_hook(hooks.profiler, datamodule, "setup")(stage=fn)
        hooks.call("setup", stage=fn)
        yield
        if datamodule is not None:
            datamodule_hook(hooks.profiler, datamodule, "teardown")(stage=fn)
        hooks.call("teardown", stage=fn)
        trackers.run_ended("success")  # Lightning finalizes its loggers after each run's teardown
    except BaseException as error:
        # torchrun's agent SIGTERMs the surviving ranks as soon as one dies; held until this rank has said where
        # the run can resume from (then delivered: the process ends as the agent asked, the line printed).
        with held_signals((signal.SIGTERM,), accelerator.num_processes > 1 and not owner_ends):
            try:
                # Lightning's order: the callbacks, the data module, the strategy, then the loggers (below).
                hooks.call_callbacks("on_exception", error)
                if datamodule is not None and callable(getattr(datamodule, "on_exception", None)):
                    datamodule_hook(hooks.profiler, datamodule, "on_exception")(error)
                on_exception = getattr(getattr(module._attached_trainer(), "strategy", None), "on_exception", None)
                if callable(on_exception):
                    on_exception(error)
            finally:
                try:
                    trackers.end_failed_run()
                finally:
                    if not owner_ends:
                        end_failed_process(accelerator, error, _hint(stage, newest, accelerator.num_processes))
        raise


@contextlib.contextmanager
def held_signals(signals: tuple[int, ...], hold: bool) -> Iterator[None]:
    """Hold ``signals`` inside the block (main thread, when ``hold``): one that arrives meanwhile is recorded and
    raised again when the block ends, to whatever handler is then in place.

    A recording handler rather than a blocked signal mask: a mask is per thread, and a process-wide signal goes to
    any thread that does not block it (gloo's, the launcher watch), whose default action would still end the
    process; a Python handler runs in the main thread whichever thread the signal came to.

    Example:
        >>> received = []
        >>> previous = signal.signal(signal.SIGUSR1, lambda number, frame: received.append(number))
        >>> with held_signals((signal.SIGUSR1,), True):
        ...     os.kill(os.getpid(), signal.SIGUSR1)
        ...     held = list(received)
        >>> held, received == [signal.SIGUSR1]
        ([], True)
        >>> _ = signal.signal(signal.SIGUSR1, previous)
    """
    if not hold or threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {number: signal.signal(number, lambda number, frame: arrived.append(number)) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        if arrived:
            signal.raise_signal(arrived[0])


def _hint(stage: str, newest: Callable[[], str | None], processes: int) -> str:
    """Where a failed ``fit`` can resume from ("" for other stages, and on one process: nothing is printed)."""
    if stage != "fit" or processes <= 1:
        return ""
    try:
        return resume_hint(newest())
    except OSError:  # the checkpoint folder is unreadable: the failure being reported matters more
        return ""
