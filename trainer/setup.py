"""What the Trainer builds from its keywords (the Accelerator, the callback list), and how a run that failed
ends on several processes."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from callbacks import Callback, ModelSummary, ProgressBar
from engine import Accelerator
from trainer.hooks import HookTable, overrides
from trainer.module import TrainModule
from trainer.profiling import run_profiler
from trainer.signals import Preempted
from trainer.tracking import TrackerLink
from trainer.utilities.rank_zero import rank_zero_only


@dataclass
class Attached:
    """What the trainer's runs work on: the callbacks, the module and the data module (one shared record: the
    trainer shows them as ``trainer.callbacks`` / ``module`` / ``datamodule``, the checkpointer reads them)."""

    callbacks: list[Callback]
    module: TrainModule | None = None
    datamodule: Any = None


UNSET: Any = object()  # "keyword not given", distinct from an explicit None
EXIT_GRACE_S = 5.0  # after a failure on one of several ranks, the most this process lives on (as ember launch)


def build_accelerator(accelerator: Any, precision: str | None, lightning: Any, fast_dev_run: int) -> Accelerator:
    """The given ``Accelerator`` (checked against the keywords) or a new one for ``"auto"`` / ``"cpu"`` / ``"gpu"``.

    ``lightning`` (``trainer.lightning_keywords.LightningChoices``) gives the trackers, the project folder and
    the strategy's engine settings.
    """
    lightning.launch_if_asked(precision)  # `python train.py` with devices > 1: run it in N processes, exit
    log_with, project_dir, extra = lightning.log_with, lightning.project_dir, lightning.accelerator_kwargs
    if isinstance(accelerator, Accelerator):
        given = {k: v for k, v in (("log_with", log_with), ("project_dir", project_dir)) if v is not UNSET}
        if extra:
            given["strategy"] = "(options)"
        if given:
            raise ValueError(f"Trainer(accelerator=<Accelerator>) was given together with {sorted(given)}: set "
                             "them on the Accelerator you pass.")
        if precision is not None and precision != accelerator.mixed_precision:
            raise ValueError(f"Trainer asks for mixed precision {precision!r} but the given Accelerator uses "
                             f"{accelerator.mixed_precision!r}: set it on the Accelerator only.")
    elif accelerator not in (None, "auto", "cpu", "gpu", "cuda"):
        raise ValueError(f"Trainer(accelerator=...) takes an engine.Accelerator or 'auto' / 'cpu' / 'gpu'. "
                         f"Received: {accelerator!r}.")
    else:
        log_with = "csv" if log_with is UNSET else log_with
        project_dir = "runs" if project_dir is UNSET else project_dir
        accelerator = Accelerator(cpu=accelerator == "cpu", mixed_precision=precision,
                                  log_with=None if fast_dev_run else log_with, project_dir=project_dir, **extra)
    if accelerator.gradient_accumulation_steps != 1:
        # The trainer decides every accumulation window itself (see Trainer._train_step); a second factor in the
        # engine would divide each loss again.
        raise ValueError(f"The Accelerator accumulates gradients over {accelerator.gradient_accumulation_steps} "
                         "steps (gradient_accumulation_steps or ACCELERATE_GRADIENT_ACCUMULATION_STEPS), but the "
                         "Trainer owns accumulation: build the Accelerator with gradient_accumulation_steps=1 and "
                         f"pass Trainer(accumulate_grad_batches={accelerator.gradient_accumulation_steps}).")
    rank_zero_only.rank = accelerator.process_index  # type: ignore[attr-defined]  # Lightning's rank_zero_* helpers
    return accelerator


def build_callbacks(callbacks: Any, progress_bar: bool, model_summary: bool,
                    default_checkpoint: Callback | None = None) -> list[Callback]:
    """The given callbacks plus the built-in ``ModelSummary`` (first) and ``ProgressBar`` (last) when enabled,
    and ``default_checkpoint`` (Lightning's default ``ModelCheckpoint``) before the bar."""
    given = [callbacks] if isinstance(callbacks, Callback) else list(callbacks or [])
    for callback in given:
        if not isinstance(callback, Callback):
            raise TypeError(f"Trainer(callbacks=...) takes Callback instances. Received: {callback!r} "
                            f"({type(callback).__name__}).")
    has_bar = any(isinstance(c, ProgressBar) for c in given)
    if has_bar and not progress_bar:
        raise ValueError("Trainer(enable_progress_bar=False) but callbacks holds a ProgressBar: remove one.")
    result = list(given)
    if model_summary and not any(isinstance(c, ModelSummary) for c in given):
        result.insert(0, ModelSummary())
    if default_checkpoint is not None:
        result.append(default_checkpoint)
    if progress_bar and not has_bar:
        result.append(ProgressBar())  # last, so it shows what the other callbacks logged
    return result


def module_callbacks(module: TrainModule, callbacks: list[Callback]) -> list[Callback]:
    """``callbacks`` with the module's ``configure_callbacks()`` added, replacing those of the same type."""
    extra = module.configure_callbacks()
    extra = [extra] if isinstance(extra, Callback) else list(extra or [])
    if not extra:
        return callbacks
    kinds = {type(c) for c in extra}
    return [c for c in callbacks if type(c) not in kinds] + extra


def check_module(module: Any) -> TrainModule:
    if not isinstance(module, TrainModule):
        raise TypeError(f"The trainer runs TrainModule subclasses. Received: {type(module).__name__}: derive your "
                        "model from trainer.TrainModule.")
    return module


def end_failed_process(accelerator: Accelerator, error: BaseException) -> None:
    """With several processes, make sure this one ends promptly after ``error``.

    Another rank may be waiting in a collective for this one (a step that raised here only), and it only fails
    once this process is gone. So the process group is destroyed and, unless the error was raised on every rank
    alike (a preemption, a non-finite loss), the process is ended with status 1 if it still runs
    ``EXIT_GRACE_S`` (5 s) later: time for the traceback to print and the exception to end the script as usual,
    but not for a caught exception or a stuck shutdown to leave the other ranks waiting.
    """
    if accelerator.num_processes <= 1:
        return
    if not isinstance(error, (Preempted, FloatingPointError)):
        print(f"[ember] rank {accelerator.process_index}: {type(error).__name__} in the trainer; this process ends "
              f"within {EXIT_GRACE_S:.0f} s so the other ranks do not wait for it.", file=sys.stderr, flush=True)
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
              trackers: TrackerLink) -> Iterator[None]:
    """Prepare data and call ``setup`` before a run, ``teardown`` after it; on a failure call ``on_exception``,
    finish the trackers and (several processes) make sure this process ends promptly. The hook table's profiler
    is set up first (the setup hooks are timed too) and describes the run at its end."""
    with run_profiler(hooks.profiler, stage, accelerator):
        yield from _run_body(stage, hooks, module, datamodule, accelerator, trackers)


def _run_body(stage: str, hooks: HookTable, module: TrainModule, datamodule: Any, accelerator: Accelerator,
              trackers: TrackerLink) -> Iterator[None]:
    try:
        if datamodule is not None:
            first = accelerator.is_local_main_process if datamodule.prepare_data_per_node else \
                accelerator.is_main_process
            if first:
                datamodule.prepare_data()
        if accelerator.is_local_main_process and overrides(module, TrainModule, "prepare_data"):
            module.prepare_data()
        accelerator.wait_for_everyone()
        if datamodule is not None:
            datamodule.setup(stage)
        hooks.call("setup", stage)
        yield
        if datamodule is not None:
            datamodule.teardown(stage)
        hooks.call("teardown", stage)
    except BaseException as error:
        try:
            hooks.call_callbacks("on_exception", error)
        finally:
            try:
                trackers.finish()
            finally:
                end_failed_process(accelerator, error)
        raise
