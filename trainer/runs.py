"""`RunMixin`: how each run is set up (accelerator, callbacks, data, model, optimizers, trackers) and torn down."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import DataLoader

from callbacks import Callback, ModelSummary, ProgressBar
from engine import Accelerator
from trainer import args as checks
from trainer.data import limit_batches, loader_length, resolve_loaders, without_shuffle
from trainer.datamodule import DataModule
from trainer.errors import MisconfigurationError
from trainer.hooks import HookTable, overrides
from trainer.metrics import MetricLogger, to_python
from trainer.module import StepRouter, TrainModule
from trainer.optim import ManualOptimizer, SchedulerConfig, parse_optimizers
from trainer.signals import Preempted
from trainer.state import TrainState

_UNSET: Any = object()  # "keyword not given", distinct from an explicit None
EXIT_GRACE_S = 5.0  # after a failure on one of several ranks, the most this process lives on (as ember launch)


class RunMixin:
    """Set-up and tear-down shared by ``fit`` / ``validate`` / ``test`` / ``predict``."""

    accelerator: Accelerator
    state: TrainState
    callbacks: list[Callback]
    module: TrainModule | None
    datamodule: DataModule | None
    _metrics: MetricLogger
    _hooks: HookTable | None
    fast_dev_run: int
    overfit_batches: int | float
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    num_sanity_val_steps: int
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    accumulate_grad_batches: int | None
    project_name: str
    optimizers: list[torch.optim.Optimizer]
    lr_scheduler_configs: list[SchedulerConfig]
    train_dataloader: DataLoader | None
    val_dataloaders: list[DataLoader]
    test_dataloaders: list[DataLoader]
    predict_dataloaders: list[DataLoader]
    num_training_batches: int | None
    num_val_batches: list[int | None]
    num_sanity_val_batches: list[int | None]
    num_test_batches: list[int | None]
    num_predict_batches: list[int | None]
    _model: torch.nn.Module | None
    _model_for: tuple[TrainModule, bool] | None
    _module_optimizers: list[torch.optim.Optimizer]
    _trackers_started: bool
    _trackers_finished: bool
    _prepared: list[str]
    _interrupt: str | None
    _local_interrupts: set[str]
    _unchecked: list[Any]
    _world: int
    _stop_requested: bool
    _val_every: int | None
    _fit_clock: float
    _automatic: bool
    _custom_optimizer_step: bool
    _custom_zero_grad: bool
    _clip: bool
    _training_step: Callable[..., Any]
    _step_schedulers_list: list[SchedulerConfig]
    _plateau_step_schedulers: list[SchedulerConfig]
    _epoch_schedulers: list[SchedulerConfig]

    # -- construction helpers ---------------------------------------------------------------------------------
    def _build_accelerator(self, accelerator: Any, precision: str | None, log_with: Any, project_dir: Any
                           ) -> Accelerator:
        if isinstance(accelerator, Accelerator):
            given = {k: v for k, v in (("log_with", log_with), ("project_dir", project_dir)) if v is not _UNSET}
            if given:
                raise ValueError(f"Trainer(accelerator=<Accelerator>) was given together with {sorted(given)}: set "
                                 "them on the Accelerator you pass.")
            if precision is not None and precision != accelerator.mixed_precision:
                raise ValueError(f"Trainer asks for mixed precision {precision!r} but the given Accelerator uses "
                                 f"{accelerator.mixed_precision!r}: set it on the Accelerator only.")
            return accelerator
        if accelerator not in (None, "auto", "cpu", "gpu", "cuda"):
            raise ValueError(f"Trainer(accelerator=...) takes an engine.Accelerator or 'auto' / 'cpu' / 'gpu'. "
                             f"Received: {accelerator!r}.")
        log_with = "csv" if log_with is _UNSET else log_with
        project_dir = "runs" if project_dir is _UNSET else project_dir
        return Accelerator(cpu=accelerator == "cpu", mixed_precision=precision,
                           log_with=None if self.fast_dev_run else log_with, project_dir=project_dir)

    @staticmethod
    def _build_callbacks(callbacks: Any, progress_bar: bool, model_summary: bool) -> list[Callback]:
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
        if progress_bar and not has_bar:
            result.append(ProgressBar())  # last, so it shows what the other callbacks logged
        return result

    # -- set-up of each run -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _run(self, stage: str, module: TrainModule | None, datamodule: DataModule | None) -> Iterator[None]:
        """Attach the module, resolve the hooks, prepare data and call ``setup``; ``teardown`` and
        ``on_exception`` at the end."""
        module = self._attach(module, datamodule)
        self._hooks = HookTable(self, module, self.callbacks, TrainModule)
        try:
            acc = self.accelerator
            if datamodule is not None:
                first = acc.is_local_main_process if datamodule.prepare_data_per_node else acc.is_main_process
                if first:
                    datamodule.prepare_data()
            if acc.is_local_main_process and overrides(module, TrainModule, "prepare_data"):
                module.prepare_data()
            acc.wait_for_everyone()
            if datamodule is not None:
                datamodule.setup(stage)
            self._hooks.call("setup", stage)
            yield
            if datamodule is not None:
                datamodule.teardown(stage)
            self._hooks.call("teardown", stage)
        except BaseException as error:
            try:
                self._hooks.call_callbacks("on_exception", error)
            finally:
                self._after_failure(error)
            raise
        finally:
            self._hooks = None  # drops the hook table's references to this trainer and the module
            self._set_stage("idle")

    def _after_failure(self, error: BaseException) -> None:
        """Finish the trackers; with several processes, make sure this one ends promptly.

        Another rank may be waiting in a collective for this one (a step that raised here only), and it only
        fails once this process is gone. So the process group is destroyed and, unless the error was raised on
        every rank alike (a preemption, a non-finite loss), the process is ended with status 1 if it still runs
        ``EXIT_GRACE_S`` (5 s) later: time for the traceback to print and the exception to end the script as
        usual, but not for a caught exception or a stuck shutdown to leave the other ranks waiting.
        """
        try:
            self._finish_trackers()
        finally:
            if self._world > 1 and not isinstance(error, (Preempted, FloatingPointError)):
                rank = self.accelerator.process_index
                print(f"[ember] rank {rank}: {type(error).__name__} in the trainer; this process ends within "
                      f"{EXIT_GRACE_S:.0f} s so the other ranks do not wait for it.", file=sys.stderr, flush=True)
                timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(1,))
                timer.daemon = True
                timer.start()
            if self._world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
                self.accelerator.state.destroy_process_group()

    def _finish_trackers(self) -> None:
        if self._trackers_started and not self._trackers_finished:
            self._trackers_finished = True
            self.accelerator.finish_trackers()

    def _attach(self, module: TrainModule | None, datamodule: DataModule | None) -> TrainModule:
        if module is None:
            module = self.module
            if module is None:
                raise ValueError("No module given and none was fitted before: pass the module, e.g. "
                                 "trainer.validate(model, dataloaders).")
        if not isinstance(module, TrainModule):
            raise TypeError(f"The trainer runs TrainModule subclasses. Received: {type(module).__name__}: derive "
                            "your model from trainer.TrainModule.")
        if module is not self.module:
            extra = module.configure_callbacks()
            extra = [extra] if isinstance(extra, Callback) else list(extra or [])
            if extra:
                kinds = {type(c) for c in extra}
                self.callbacks = [c for c in self.callbacks if type(c) not in kinds] + extra
        module._trainer_ref = weakref.ref(self)
        if datamodule is not None:
            datamodule._trainer_ref = weakref.ref(self)
        self.module, self.datamodule = module, datamodule
        return module

    def _setup_fit(self, train_dataloaders: Any, val_dataloaders: Any) -> None:
        module = self.module
        assert module is not None
        name = type(module).__name__
        manual = not module.automatic_optimization
        train = resolve_loaders("train", train_dataloaders, self.datamodule, module)
        if not train:
            raise ValueError(f"No training data: pass fit(model, train_dataloaders=...), datamodule=..., or define "
                             f"{name}.train_dataloader().")
        val = resolve_loaders("val", val_dataloaders, self.datamodule, module) if self.limit_val_batches else []
        if val and not overrides(module, TrainModule, "validation_step"):
            warnings.warn(f"Validation data was given but {name} has no validation_step: validation is skipped.",
                          UserWarning, stacklevel=3)
            val = []
        if self.overfit_batches:
            train = [without_shuffle(train[0])]
        self.train_dataloader = self.accelerator.prepare(train[0])
        self._prepared.append("train loader")
        self.num_training_batches = limit_batches(loader_length(self.train_dataloader), self.limit_train_batches,
                                                  "limit_train_batches")
        self._set_val_loaders(val)
        self._prepare_model(training=True)

        optimizers, configs = parse_optimizers(module.configure_optimizers())
        if not manual and len(optimizers) != 1:
            raise ValueError(f"{name}.configure_optimizers returned {len(optimizers)} optimizers; automatic "
                             "optimisation uses exactly one. For several (e.g. a GAN) set `self.automatic_optimization "
                             "= False` and step them in training_step.")
        prepared = self.accelerator.prepare(*optimizers, *(c.scheduler for c in configs)) if optimizers else ()
        prepared = list(prepared) if isinstance(prepared, tuple) else [prepared]
        self.optimizers = prepared[:len(optimizers)]
        self._prepared += [f"{len(optimizers)} optimizer(s)", f"{len(configs)} scheduler(s)"]
        self.lr_scheduler_configs = configs  # hold the user's schedulers: stepped once per step on every process
        self._module_optimizers = ([ManualOptimizer(o, self._manual_before_step, self._manual_after_step)
                                    for o in self.optimizers] if manual else list(self.optimizers))
        self._automatic = not manual
        self._custom_optimizer_step = overrides(module, TrainModule, "optimizer_step")
        self._custom_zero_grad = overrides(module, TrainModule, "optimizer_zero_grad")
        self._clip = self.gradient_clip_val is not None or overrides(module, TrainModule, "configure_gradient_clipping")
        # Under manual optimisation the module steps its schedulers (as in Lightning): the trainer steps none.
        auto = configs if not manual else []
        self._step_schedulers_list = [c for c in auto if c.interval == "step" and not c.reduce_on_plateau]
        self._plateau_step_schedulers = [c for c in auto if c.interval == "step" and c.reduce_on_plateau]
        self._epoch_schedulers = [c for c in auto if c.interval == "epoch"]
        self.accelerator.gradient_accumulation_steps = self.accumulate_grad_batches or 1
        self.state.should_stop = self._stop_requested = False
        self._interrupt, self._local_interrupts, self._unchecked = None, set(), []
        self._fit_clock = time.monotonic() - self.state.time_elapsed

    def _set_val_loaders(self, val: list[DataLoader]) -> None:
        self.val_dataloaders = [self.accelerator.prepare(loader) for loader in val]
        self._prepared += ["val loader"] * len(val)
        self.num_val_batches = [limit_batches(loader_length(v), self.limit_val_batches, "limit_val_batches")
                                for v in self.val_dataloaders]
        sanity = self.num_sanity_val_steps
        self.num_sanity_val_batches = [n if sanity == -1 else (sanity if n is None else min(sanity, n))
                                       for n in self.num_val_batches]
        self._val_every = None
        if not self.val_dataloaders:
            return
        n_train, interval = self.num_training_batches, self.val_check_interval
        if checks.is_int(interval):
            if self.check_val_every_n_epoch is not None and n_train is not None and interval > n_train:
                raise ValueError(f"Trainer(val_check_interval={interval}) is larger than the {n_train} training "
                                 "batches of an epoch, so validation would never run: lower it, or set "
                                 "check_val_every_n_epoch=None to validate every val_check_interval batches across "
                                 "epochs.")
            self._val_every = int(interval)
        elif n_train is not None:
            self._val_every = max(1, int(n_train * interval))
        elif interval != 1.0:
            raise ValueError(f"Trainer(val_check_interval={interval}) is a fraction of the epoch, but the training "
                             "loader has no length: pass an int number of batches.")

    def _setup_eval(self, kind: str, dataloaders: Any) -> tuple[list[DataLoader], list[int | None]]:
        module = self.module
        assert module is not None
        step = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}[kind]
        if kind != "predict" and not overrides(module, TrainModule, step):
            raise MisconfigurationError(f"trainer.{kind}() needs {type(module).__name__}.{step}(self, batch, "
                                      "batch_idx).")
        source = {"validate": "val", "test": "test", "predict": "predict"}[kind]
        loaders = resolve_loaders(source, dataloaders, self.datamodule, module)
        if not loaders:
            raise ValueError(f"No {source} data: pass trainer.{kind}(model, dataloaders=...), datamodule=..., or "
                             f"define {type(module).__name__}.{source}_dataloader().")
        self._prepare_model(training=False)
        if kind == "validate":
            self._set_val_loaders(loaders)
            return self.val_dataloaders, self.num_val_batches
        limit = self.limit_test_batches if kind == "test" else self.limit_predict_batches
        prepared = [self.accelerator.prepare(loader) for loader in loaders]
        self._prepared += [f"{kind} loader"] * len(loaders)
        counts = [limit_batches(loader_length(p), limit, f"limit_{kind}_batches") for p in prepared]
        if kind == "test":
            self.test_dataloaders, self.num_test_batches = prepared, counts
        else:
            self.predict_dataloaders, self.num_predict_batches = prepared, counts
        return prepared, counts

    def _prepare_model(self, training: bool) -> None:
        """Wrap the module for this setup once (again only to add DDP / FSDP2 when an evaluation came first)."""
        module = self.module
        assert module is not None
        if self._model_for is not None and self._model_for[0] is module and (self._model_for[1] or not training):
            return
        if overrides(module, TrainModule, "configure_model"):
            module.configure_model()
        router = StepRouter(module)
        self._model = self.accelerator.prepare_model(router, evaluation_mode=not training)
        self._prepared.append("model" if training else "model (evaluation)")
        self._model_for = (module, training)
        # Unwrapped (one process, no DDP / FSDP2 / compile / autocast wrapper, no hooks), the module's step is
        # called directly: the same call minus nn.Module.__call__ and the router (~2 us per step on a slow CPU).
        bare = self._model is router and type(router) is StepRouter and "forward" not in vars(router) and not (
            router._forward_hooks or router._forward_pre_hooks or router._backward_hooks)
        self._training_step = module.training_step if bare else functools.partial(self._model, "training_step")

    def _start_trackers(self) -> None:
        if self._trackers_started or self.fast_dev_run or not self.accelerator.log_with:
            return
        config: dict[str, Any] = {}
        for owner in (self.module, self.datamodule):
            if owner is not None and owner.__dict__.get("_log_hyperparams", True):
                config.update(owner.hparams)
        self.accelerator.init_trackers(self.project_name, config=config or None)
        self._trackers_started = True

    def _log_to_trackers(self, values: dict[str, Any]) -> None:
        self._send_to_trackers(values, None)

    def _send_to_trackers(self, values: dict[str, Any], step: int | None) -> None:
        # Only a process that runs trackers converts the tensors (the one device sync of logging).
        if values and self._trackers_started and not self._trackers_finished and self.accelerator.trackers:
            payload = to_python(values)
            payload.setdefault("epoch", self.state.epoch)
            self.accelerator.log(payload, step=self.state.global_step if step is None else step)

    def _set_stage(self, stage: str) -> None:
        self.state.stage = stage

    def _manual_before_step(self, optimizer: torch.optim.Optimizer) -> None:
        assert self._hooks is not None
        self._hooks.call("on_before_optimizer_step", optimizer)

    def _manual_after_step(self) -> None:
        self.state.global_step += 1

    def _batches(self, loader: Any, count: int | None, start: int = 0) -> Iterator[tuple[int, Any]]:
        """``(batch_idx, batch)`` for the first ``count`` batches of ``loader``, numbered from ``start``.

        ``start`` is the number of batches of this epoch already done before a resume; the prepared loader
        continues from its own restored position (the engine saves it), so nothing is skipped here. A loop that
        breaks early drops this iterator, and the engine's loader ends its pass when its generator is collected
        (at once in CPython), so no explicit close is needed.
        """
        if count is not None and start >= count:
            return iter(())
        batches = iter(loader)
        # All of a loader is read to its end (not cut by islice), so its pass finishes and the position it saves
        # at an epoch end is "this epoch done" (see CheckpointMixin._line_up_loaders for limited epochs).
        if count is None or count == loader_length(loader):
            return enumerate(batches, start)
        return enumerate(islice(batches, count - start), start)
