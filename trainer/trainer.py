"""`Trainer`: drives a `TrainModule` through fit / validate / test / predict, everything distributed via the engine.

This file holds the construction, ``fit`` with its loop and the training step body (forward, backward, clip,
optimizer step), so one step reads top to bottom here; each other concern is a small object the Trainer owns.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from callbacks.warnings import PossibleUserWarning
from engine import set_seed
from engine.prepare.optimizer import clear_grads
from trainer import args as checks
from trainer.build import build_accelerator, build_callbacks
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.entry import Attached, TrainerEntry
from trainer.checkpoint.eval_choice import evaluation_resume
from trainer.checkpoint.resume import Resume, load_weights
from trainer.compat.attributes import with_lightning_attributes
from trainer.compat.keywords import (
    accepts_model,
    convert_module,
    defaults_from_environment,
    resolve_lightning,
    say_what_limits_mean,
)
from trainer.config import KEYWORDS, UNSET, TrainerConfig, check_keywords, keyword_signature
from trainer.datamodule import DataModule
from trainer.evaluation.loop import EvaluationLoop, print_results
from trainer.loop.hooks import HookTable
from trainer.loop.loss_check import LossCheck
from trainer.loop.plan import RunPlan
from trainer.loop.run import check_module, eval_sources, lend_logging, module_callbacks, run_scope
from trainer.loop.schedulers import SchedulerStepper
from trainer.loop.signals import PreemptionHandler, one_line_interrupt
from trainer.loop.stepping import check_trainable, detached, loss_of
from trainer.loop.stop import StopController
from trainer.metrics.logger import LogOptions, MetricLogger
from trainer.metrics.tracking import TrackerLink, warn_log_interval
from trainer.module import TrainModule
from trainer.optim import clip_gradients
from trainer.plugins.environments import check_environment
from trainer.profiling import profiled, profiled_iter, resolve_profiler
from trainer.state import TrainState
from trainer.states import RunningStage, TrainerFn, TrainerStatus
from trainer.utilities.rank_zero import rank_zero_info


@with_lightning_attributes
class Trainer:
    """Runs ``fit`` / ``validate`` / ``test`` / ``predict`` for a ``TrainModule``, with Lightning's argument names.

    Everything distributed goes through one ``engine.Accelerator`` (built here, or passed as ``accelerator=``):
    data sharding, DDP / FSDP2, mixed precision, gradient accumulation, clipping, gathering, trackers, and the
    cross-process stop trigger. Every counter lives in ``trainer.state`` (a ``TrainState``).

    Args:
        accelerator: an ``engine.Accelerator`` to use, or ``"auto"`` / ``"cpu"`` / ``"gpu"`` to build one.
        max_epochs / max_steps: stop after this many epochs / optimizer steps (``None`` or ``-1``: no limit).
            With neither (and no ``max_time``), training stops after 1000 epochs, as in Lightning, with a warning.
        min_epochs / min_steps: a stop request (``trainer.should_stop = True``) waits until these are reached.
        max_time: stop after this long in ``fit`` (``"DD:HH:MM:SS"``, a timedelta, a dict or seconds).
        accumulate_grad_batches: batches per optimizer step (the last batch of an epoch always steps).
        gradient_clip_val / gradient_clip_algorithm: clip gradients before each step (``"norm"`` or ``"value"``).
        mixed_precision / precision: ``"no"`` / ``"fp16"`` / ``"bf16"`` / ``"fp8"`` (torchao's float8 layers in a
            bf16 autocast, as the engine's) or Lightning's ``"32"``, ``"16-mixed"``, ``"bf16-mixed"``.
        val_check_interval: validate every N training batches (int) or fraction of the epoch (float).
        check_val_every_n_epoch: validate in every N-th epoch; ``None`` counts ``val_check_interval`` batches
            across epochs.
        num_sanity_val_steps: validation batches run before training to catch bugs early (-1: all).
        limit_{train,val,test,predict}_batches: an int number or a float fraction of each loader's batches.
        fast_dev_run: run N (``True``: 1) batches of each stage, one epoch, no trackers, no sanity check.
        overfit_batches: train and validate on the first N (or fraction of) training batches, unshuffled.
        log_every_n_steps: send step metrics to the trackers every N optimizer steps.
        enable_checkpointing: without a ``ModelCheckpoint`` in ``callbacks``, add Lightning's default one (the
            newest epoch-end checkpoint kept); default True (False with ``barebones``).
        enable_progress_bar / enable_model_summary: add a ``ProgressBar`` / ``ModelSummary`` callback.
        callbacks: more ``Callback`` instances, called in this order.
        log_with / project_dir / project_name: trackers (not given: Lightning's default logger), their folder (``"runs"``), run name.
        seed / deterministic: ``engine.set_seed(seed)`` now (seed the model's construction by building the
            Trainer first), and ``torch.use_deterministic_algorithms``.
        detect_anomaly: run fit under ``torch.autograd.set_detect_anomaly`` (slow; names the op making a NaN).
        profiler / compile: a ``trainer.profiling`` profiler or its name; ``torch.compile`` (``trainer.tools.compiling``).
        on_nonfinite_loss: ``"raise"`` (default), ``"skip"`` or ``"ignore"`` a NaN/inf loss (``TrainerConfig``).
        preemption_signals / preemption_exit_code: save, finish and exit on these signals (``TrainerConfig``).
        strategy / devices / logger / default_root_dir / ...: Lightning's (``trainer.compat.keywords``).

    Parts, one job each (docs/guides/trainer.md, "Inside the Trainer"): ``config``, ``plan``, ``stop``,
    ``loss_check``, ``schedulers``, ``checkpointer``, ``evaluation``, ``trackers``, ``metric_logger``.

    Resuming: ``fit(..., ckpt_path="last")`` continues bitwise from the newest committed checkpoint, or starts
    fresh without one. An exception in a run calls ``on_exception``, finishes the trackers and, with several
    processes, destroys the process group, so the other ranks fail in their next collective instead of waiting.

    Example:
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> class Regressor(TrainModule):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(3, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> data = DataLoader(TensorDataset(torch.randn(32, 3), torch.randn(32, 1)), batch_size=8)
        >>> trainer = Trainer(max_epochs=2, log_with=None, enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(Regressor(), data)
        >>> trainer.global_step, trainer.current_epoch
        (8, 2)
    """

    def __init__(self, **keywords: Any) -> None:  # the keywords: TrainerConfig's fields (see __signature__)
        check_keywords("Trainer", keywords)
        keywords = defaults_from_environment(keywords, KEYWORDS)  # Lightning's PL_TRAINER_<NAME> defaults
        self.config = config = TrainerConfig(**keywords)
        lightning = resolve_lightning(config, UNSET)  # the Lightning-only keywords, consumed here
        say_what_limits_mean(keywords)
        if config.barebones:
            rank_zero_info("You are running in `Trainer(barebones=True)` mode: no logging, checkpointing, progress "
                           "bar, model summary or sanity check, to measure the training loop's own overhead.")
        self.accelerator = acc = build_accelerator(config, lightning)
        if config.seed is not None:
            set_seed(config.seed, deterministic=config.deterministic)
        elif config.deterministic:
            torch.use_deterministic_algorithms(True)
        self._loggers = lightning.loggers
        # log_with= asked for trackers (fast_dev_run starts none): trainer.loggers is then Lightning's DummyLogger.
        self._trackers_asked = lightning.log_with not in (UNSET, None, False, "", [], ())
        # Lightning's trainer.strategy (DDPStrategy / FSDPStrategy / ...), set up: e.g. ModelParallelStrategy's mesh.
        self.strategy = lightning.strategy.connect(self)
        callbacks = build_callbacks(config.callbacks, bool(config.enable_progress_bar),
                                    bool(config.enable_model_summary), lightning.default_callbacks(config))
        self.attached = Attached(callbacks)
        self.state = TrainState()
        self.metric_logger = MetricLogger(acc.num_processes, acc.reduce, acc.gather)
        self.plan = RunPlan(acc, self.strategy, self.state)
        self.cluster_environment = cluster = lightning.cluster  # plugins=[...], or SLURM's (trainer.plugins)
        if cluster is not None:
            check_environment(cluster, acc.process_index, acc.num_processes)
        self.stop = StopController(acc, self.state, PreemptionHandler(config.preemption_signals, cluster))
        self.loss_check = LossCheck(config.on_nonfinite_loss, acc, self.state)
        self.trackers = TrackerLink(acc, self.state, config.project_name, enabled=not config.fast_dev_run,
                                    autolog=config.enable_autolog_hparams, automatic=lambda: self.plan.automatic)
        self.schedulers = SchedulerStepper([], lambda scheduler, metric: None, self.metric_logger)
        self.evaluation = EvaluationLoop(acc, self.state, self.plan, self.metric_logger, self.trackers,
                                         config.inference_mode)
        self._hooks: HookTable | None = None  # the run's hook table, only while a run is in progress
        self.profiler = resolve_profiler(config.profiler)
        entry = TrainerEntry(self.state, self.attached, self.metric_logger, self.plan.prepared, self.trackers, self,
                             self.profiler)
        self.checkpointer = Checkpointer(acc, entry, self._before_save, self.profiler, *lightning.checkpoint_dirs(acc),
                                         cluster=cluster, window=lambda: self.config.accumulation)
        # The engine's backward (TrainModule.backward's default); no wrapper without a profiler.
        self.engine_backward = profiled(self.profiler, "backward", acc.backward)
        self._world = acc.num_processes
        self._launcher = lightning.launcher  # ddp_spawn / ddp_fork / ddp_notebook: each call starts the workers

    @classmethod
    def from_config(cls, config: TrainerConfig) -> Trainer:
        """A Trainer built from ``config`` (e.g. ``dataclasses.replace(trainer.config, max_steps=100)``).

        Example:
            >>> import dataclasses
            >>> trainer = Trainer(max_epochs=3, log_with=None, enable_progress_bar=False)
            >>> Trainer.from_config(dataclasses.replace(trainer.config, max_epochs=5)).max_epochs
            5
        """
        return cls(**config.keywords())

    # -- fit ----------------------------------------------------------------------------------------------------
    @accepts_model
    def fit(self, module: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: DataModule | None = None, ckpt_path: str | None = None, weights_only: bool | None = None) -> None:
        """Train ``module`` on ``train_dataloaders`` (or ``datamodule``, or its own ``train_dataloader()``).

        ``ckpt_path``: ``"last"`` resumes from the newest committed checkpoint of the project (and starts fresh,
        saying so, when there is none), a ``.ckpt`` (or an older checkpoint folder) resumes from it, exactly; a
        Lightning ``.ckpt`` restores weights, optimizers, schedulers, epoch and step. A path that does not exist
        raises before anything runs. ``weights_only=False``: unpickle a (trusted) file that needs it.
        """
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        config = self.config
        check_trainable(module, config.accumulate_grad_batches, config.gradient_clip_val, config.on_nonfinite_loss)
        resume = self.checkpointer.resolve(ckpt_path, "fit", unpickle=weights_only is False)
        if config.max_epochs_defaulted and self.accelerator.is_main_process:
            # Lightning's category and text (a test may filter on either), then the other way to set a limit.
            warnings.warn(f"`max_epochs` was not set. Setting it to {checks.DEFAULT_MAX_EPOCHS} epochs. To train "
                          "without an epoch limit, set `max_epochs=-1`. (Or pass max_epochs=N, max_steps=N or "
                          "max_time.)", PossibleUserWarning, stacklevel=2)
        anomaly = torch.autograd.set_detect_anomaly(True) if config.detect_anomaly else contextlib.nullcontext()
        interrupt = one_line_interrupt(self.state, self.checkpointer.newest, self.accelerator.is_main_process)
        with interrupt, self._run("fit", module, datamodule) as hooks, self.stop.preemption, anomaly:
            plan, module = self.plan, check_module(self.module)  # the module inside a torch.compile shell
            convert_module(self.config, module, self._world)  # sync_batchnorm
            plan.setup_fit(config, module, self.datamodule, train_dataloaders, val_dataloaders,
                           (self._manual_before_step, self.state.optimizer_stepped), sanity_check=resume is None)
            # Under manual optimisation the module steps its schedulers (as in Lightning): the trainer steps none.
            self.schedulers = SchedulerStepper(plan.scheduler_configs if plan.automatic else [],
                                               module.lr_scheduler_step, self.metric_logger)
            self.loss_check.reset()
            if resume is not None:
                self._restore(resume)  # before the trackers start: they reopen the saved runs
            self.stop.start()  # saved at a stop decision or not, a resumed run goes on until its own limits
            self.trackers.start((self.module, self.datamodule))
            if resume is None:  # said once, when the run starts (not again at every resume of it)
                warn_log_interval(plan.num_training_batches, self.config.log_interval,
                                  self.trackers.started and self.accelerator.is_main_process)
            self._fit_loop(hooks, sanity_check=resume is None)

    def _restore(self, resume: Resume) -> None:
        """Load the run ``resume`` names (the engine restores the trainer's entry too) and line up the loaders."""
        module = self.attached.module
        assert module is not None
        folder = self.checkpointer.restore(resume, module)
        self.plan.line_up_loaders(self.state)
        self.checkpointer.restored_here()  # no interrupt save of this very point
        state = self.state
        self.accelerator.print(f"Resumed from {folder} at epoch {state.epoch}, batch {state.batch_in_epoch}, "
                               f"step {state.global_step}.")
        self.stop.say_already_reached(self.config, resume.ckpt_path)

    def _fit_loop(self, hooks: HookTable, sanity_check: bool) -> None:
        state, plan, metrics, stop, config = self.state, self.plan, self.metric_logger, self.stop, self.config
        hooks.call("on_fit_start")
        if sanity_check and any(n is None or n > 0 for n in plan.num_sanity_val_batches):
            self.evaluation.run("sanity_check", hooks)
        metrics.set_stage("train")
        metrics.set_epoch_hook(True)
        state.stage = RunningStage.TRAINING  # Lightning code reads trainer.state.stage.value
        hooks.call("on_train_start")
        plan.start_val_clock()
        # The per-batch hooks are called only when something overrides them (their tuples are usually empty).
        batch_start_hooks = hooks.overriders["on_train_batch_start"]
        batch_end_hooks = hooks.overriders["on_train_batch_end"]
        run_batch = profiled(self.profiler, "run_training_batch", self._train_step)  # no wrapper without one
        with self.checkpointer.boundaries():  # checkpoints are written where a resume continues exactly
            while not self._fit_done():  # each submodule trains in its own mode (one kept in eval stays so)
                plan.start_epoch(state)  # reloads the training loader when due
                hooks.call("on_train_epoch_start")
                metrics.set_epoch_hook(False)
                every, world = self.config.log_every_n_steps or 1, self._world  # 0: barebones, nothing logs
                if self.config.fast_dev_run:  # as Lightning: every step's metrics are logged in a fast_dev_run
                    every = 1
                loader = plan.train_batches(state.batch_in_epoch)
                cut = False  # the epoch ended before its last batch (a stop, max_steps, or -1 from a hook)
                for batch_idx, batch in profiled_iter(self.profiler, "train_dataloader_next", loader):
                    state.open_batch()
                    size = metrics.new_batch(batch)
                    if batch_start_hooks and hooks.call("on_train_batch_start", batch, batch_idx) == -1:
                        state.drop_batch()
                        cut = True
                        break  # Lightning: the module returning -1 ends the epoch early
                    steps_before = state.global_step
                    self.trackers.steps.batch_started()
                    outputs, loss = run_batch(batch, batch_idx)
                    state.finish_batch(batch_idx, samples=size * world)
                    if state.batch_in_epoch == plan.num_training_batches:  # epoch schedulers step here (Lightning)
                        self.schedulers.at_last_batch(state.epoch)
                    if batch_end_hooks:
                        hooks.call("on_train_batch_end", detached(outputs, loss) if plan.automatic else outputs,
                                   batch, batch_idx)
                    stepped = state.global_step != steps_before
                    if stepped and state.global_step // every != steps_before // every:
                        self.loss_check.check()  # no NaN reaches the trackers unnoticed; one sync per interval
                        self.trackers.log(metrics.step_values())
                    if plan.val_every is not None and plan.val_due(config, state.epoch, batch_idx, state.micro_step):
                        self.evaluation.run("validate", hooks)
                    elif plan.val_seconds is not None and plan.time_due(config, state.epoch):
                        self.evaluation.run("validate", hooks)  # val_check_interval as a time
                    if self._batch_boundary(stepped):  # schedulers, the agreed stop, waiting checkpoints
                        cut = plan.num_training_batches is None or state.batch_in_epoch < plan.num_training_batches
                        state.stop_in_epoch(cut)
                        break
                if plan.val_every is None and plan.val_seconds is None and plan.val_in_epoch(config, state.epoch):
                    self.evaluation.run("validate", hooks)  # once per epoch (or after an unsized loader's end)
                metrics.set_epoch_hook(True)
                self.loss_check.check()
                self.evaluation.epoch_end("on_train_epoch_end", hooks)
                metrics.reset_epoch()  # at the end, so what on_train_start logged counts in the first epoch
                if not cut:  # as Lightning: epoch-interval schedulers step only after a whole epoch
                    self.schedulers.at_epoch_end(state.epoch, sized=plan.num_training_batches is not None)
                state.finish_epoch()
                stop.update_time()
                self.checkpointer.flush(stepped=True)  # resumes at the next epoch (or at stopped_at)
            self.loss_check.check()
        reason = self.stop.limit_reached(config)
        if reason is not None and self.accelerator.is_main_process:  # Lightning's line, on stderr as its log
            print(f"`Trainer.fit` stopped: {reason}", file=sys.stderr, flush=True)
        hooks.call("on_train_end")
        state.stage = "idle"
        hooks.call("on_fit_end")

    def _train_step(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        """One batch: forward, backward and, when the batch closes its accumulation window, the optimizer step.

        Returns what ``training_step`` returned and the loss found in it.
        """
        plan = self.plan
        training_step, model = plan.training_step, plan.model
        assert training_step is not None and model is not None  # set together by RunPlan.prepare_model
        if not plan.automatic:
            outputs = training_step(batch, batch_idx)
            if self.loss_check.active:
                self.loss_check.record_output(outputs, batch_idx)
            return outputs, None
        # The trainer alone decides the accumulation window and tells the engine whether this batch syncs (the
        # field, resolved to an int >= 1, read plainly: this runs every step).
        k = self.config.accumulate_grad_batches or 1
        # With several training loaders the engine's end-of-loader flag is some loader's, not the epoch's end.
        sync = k == 1 or plan.syncs(batch_idx, k) or (plan.combined is None and
                                                      self.accelerator.gradient_state.end_of_dataloader)
        with self.accelerator.accumulate(model, sync=sync):
            outputs = training_step(batch, batch_idx)
            # The usual case (a 0-d loss tensor with a graph) is checked inline; loss_of handles the others.
            usual = isinstance(outputs, torch.Tensor) and outputs.ndim == 0 and outputs.requires_grad
            loss = outputs if usual else loss_of(outputs)
            if batch_idx % k == 0:  # a window's first batch: zero the gradients here, as Lightning 2.6 does
                self._zero_grad(batch_idx)
            if loss is None:  # Lightning: returning None skips this batch's backward; the window's optimizer
                if sync:  # step still runs (on what earlier batches accumulated) and counts
                    self._optimizer_step(batch_idx, None)
                return outputs, None
            if self.loss_check.active:
                self.loss_check.record(loss, batch_idx)
            self.strategy.backward(loss, None)  # Lightning's route (code and tests wrap Strategy.backward)
            if sync and self.profiler.records:
                with self.profiler.profile("optimizer_step"):
                    self._optimizer_step(batch_idx, loss)
            elif sync:
                self._optimizer_step(batch_idx, loss)
        return outputs, loss

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """A training step's backward (``manual_backward`` too): the hooks around the engine's or the module's
        ``backward``, all given the loss divided by the accumulation window (as Lightning)."""
        hooks = self._hooks
        assert hooks is not None
        k = self.config.accumulate_grad_batches or 1
        if k > 1 and not self.accelerator.backend.scales_loss:  # DeepSpeed's engine divides by its window itself
            loss = loss / k
        for hook in hooks.overriders["on_before_backward"]:
            hook(loss)
        if self.plan.custom_backward:
            self.module.backward(loss, *args, **kwargs)
        else:
            self.engine_backward(loss, *args, **kwargs)
        for hook in hooks.overriders["on_after_backward"]:
            hook()

    def log_value(self, name: str, value: Any, options: LogOptions) -> None:
        """One ``self.log`` call of the module (``trainer.host.ModuleHost``); nothing under ``barebones``."""
        if self.config.barebones:
            warnings.warn(f"You are trying to `self.log({name!r}, ...)` but `Trainer(barebones=True)` is configured: "
                          "nothing is logged.", UserWarning, stacklevel=3)
            return
        self.metric_logger.log(name, value, options)

    def module_optimizers(self) -> list[torch.optim.Optimizer]:
        """What ``module.optimizers()`` returns: the prepared optimizers (wrapped under manual optimisation)."""
        return self.plan.module_optimizers

    def _optimizer_step(self, batch_idx: int, loss: torch.Tensor | None) -> None:
        """Clip, step and count (``loss`` None: the batch's ``training_step`` returned None)."""
        hooks, plan, state, config, module = self._hooks, self.plan, self.state, self.config, self.attached.module
        assert hooks is not None and module is not None
        optimizer = plan.optimizers[0]
        if config.on_nonfinite_loss == "skip" and self.loss_check.should_skip():
            optimizer.zero_grad()  # the window's gradients hold the non-finite values: drop them with the step
            return
        for hook in hooks.overriders["on_before_optimizer_step"]:
            hook(optimizer)
        # Lightning's 16-mixed does not step the grad scaler after a skipped backward (the step still counts).
        unscaled = loss is None and getattr(optimizer, "scaler", None) is not None
        if plan.custom_clipping and not unscaled:
            module.configure_gradient_clipping(optimizer, gradient_clip_val=config.gradient_clip_val,
                                               gradient_clip_algorithm=config.gradient_clip_algorithm)
        elif plan.clip and not unscaled:
            clip_gradients(self.accelerator, optimizer, config.gradient_clip_val, config.gradient_clip_algorithm)
        # The module's optimizer_step / optimizer_zero_grad are only called when overridden (a call saved per step).
        if plan.custom_optimizer_step:
            module.optimizer_step(state.epoch, batch_idx, optimizer, lambda: loss)
        elif loss is not None or getattr(optimizer, "scaler", None) is None:
            optimizer.step()
        state.optimizer_stepped()
        if self.schedulers.per_step and not getattr(optimizer, "step_was_skipped", False):
            self.schedulers.after_optimizer_step(state.global_step)

    def _zero_grad(self, batch_idx: int) -> None:
        """``on_before_zero_grad`` and ``optimizer_zero_grad`` with the torch optimizer (as Lightning passes it):
        the engine's wrapper zeroes only on syncing micro-steps, and a window's first batch may not sync."""
        hooks, plan = self._hooks, self.plan
        optimizer = plan.torch_optimizer  # automatic optimisation has exactly one (NoOptimizer when none)
        assert hooks is not None and optimizer is not None
        for hook in hooks.overriders["on_before_zero_grad"]:
            hook(optimizer)
        if plan.custom_zero_grad:
            module = self.attached.module
            assert module is not None
            module.optimizer_zero_grad(self.state.epoch, batch_idx, optimizer)
        else:  # optimizer.zero_grad(), without torch's per-call profiler range when no profiler records
            clear_grads(optimizer, plan.plain_zero_grad)

    def _manual_before_step(self, optimizer: torch.optim.Optimizer) -> None:
        assert self._hooks is not None
        self._hooks.call("on_before_optimizer_step", optimizer)

    # -- the loop's decisions -------------------------------------------------------------------------------------
    def _fit_done(self) -> bool:
        if self.stop.fit_done(self.config, self.plan.num_training_batches):
            self._handle_interrupt()
            return True
        return False

    def _batch_boundary(self, stepped: bool) -> bool:
        """A training batch is completely done: run step-interval plateau schedulers, agree on stopping, write
        the checkpoints that waited for this point, and act on an interrupt. Returns whether to stop."""
        stop = False
        if stepped:
            if self.schedulers.plateau_per_step:  # after validation: they may monitor a validation metric
                self.schedulers.at_boundary(self.state.global_step)
            stop = self.stop.stop_now(self.config)
        self.checkpointer.flush(stepped)
        if stop:
            self._handle_interrupt()
        return stop

    def _handle_interrupt(self) -> None:
        """Save the exact position for a resume; after a preemption also finish the trackers and exit."""
        reason = self.stop.take_interrupt()
        if reason is None or (reason == "max_time" and not self.checkpointer.checkpoint_callbacks):
            return
        self.checkpointer.save_interrupted("max_time" if reason == "max_time" else "preempted", self)
        if reason != "max_time":
            self.stop.exit_preempted(reason == "requeue", self.checkpointer.newest(), self.trackers.finish,
                                     self.config.preemption_exit_code, self.cluster_environment)

    # -- validate / test / predict ------------------------------------------------------------------------------
    @accepts_model
    def validate(self, module: TrainModule | None = None, dataloaders: Any = None,
                 datamodule: DataModule | None = None, ckpt_path: str | None = None,
                 verbose: bool = True, weights_only: bool | None = None) -> list[dict[str, float]]:
        """Run the validation loop once; returns the epoch metrics, one dict per loader.

        ``ckpt_path`` (``"best"``, ``"last"`` or a checkpoint) loads the module's weights from it first; None
        without a module after ``fit``: ``"best"``, as in Lightning (``trainer/checkpoint/eval_choice.py``).
        """
        return self._evaluate_entry("validate", module, dataloaders, datamodule, ckpt_path, verbose, weights_only)

    @accepts_model
    def test(self, module: TrainModule | None = None, dataloaders: Any = None, datamodule: DataModule | None = None,
             ckpt_path: str | None = None, verbose: bool = True, weights_only: bool | None = None) -> list[dict[str, float]]:
        """Run the test loop once; returns the epoch metrics, one dict per loader."""
        return self._evaluate_entry("test", module, dataloaders, datamodule, ckpt_path, verbose, weights_only)

    @accepts_model
    def predict(self, module: TrainModule | None = None, dataloaders: Any = None,
                datamodule: DataModule | None = None, return_predictions: bool | None = None,
                ckpt_path: str | None = None, weights_only: bool | None = None) -> list[Any] | None:
        """``predict_step`` over the loader(s); returns the per-batch predictions of every process, in dataset
        order, without the samples repeated to even out the last batch (a list per loader when there are several).
        """
        resume = evaluation_resume(self.checkpointer, "predict", ckpt_path, module, self.module, self.config, weights_only)
        datamodule, dataloaders = eval_sources(datamodule, dataloaders, self.datamodule)
        with self._run("predict", module, datamodule) as hooks:
            assert self.module is not None
            self.plan.setup_eval("predict", self.config, self.module, self.datamodule, dataloaders)
            if resume is not None:
                load_weights(self.module, resume, "predict")
            results = self.evaluation.predict(hooks, return_predictions)
        if return_predictions is False:
            return None
        return results[0] if len(results) == 1 else results

    def _evaluate_entry(self, kind: str, module: TrainModule | None, dataloaders: Any, datamodule: Any,
                        ckpt_path: str | None, verbose: bool, weights_only: bool | None) -> list[dict[str, float]]:
        resume = evaluation_resume(self.checkpointer, kind, ckpt_path, module, self.module, self.config, weights_only)
        datamodule, dataloaders = eval_sources(datamodule, dataloaders, self.datamodule)
        with self._run(kind, module, datamodule) as hooks:
            assert self.module is not None
            self.plan.setup_eval(kind, self.config, self.module, self.datamodule, dataloaders)
            if resume is not None:  # the module's weights only: optimizers and data do not matter
                load_weights(self.module, resume, kind)
            self.trackers.start((self.module, self.datamodule))
            results = self.evaluation.run(kind, hooks)
        if verbose and self.accelerator.is_main_process:
            print_results(kind, results)
        return results

    # -- each run's set-up and tear-down ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _run(self, stage: str, module: TrainModule | None, datamodule: DataModule | None) -> Iterator[HookTable]:
        """Attach the module, resolve its hooks and run ``stage`` inside ``run_scope`` (set-up, tear-down, failure)."""
        module = lend_logging(self._attach(module, datamodule, stage), self.attached.callbacks)
        self._hooks = hooks = HookTable(self, module, self.attached.callbacks, TrainModule, self.profiler)
        self.state.fn, self.state.status, self.state.stage = TrainerFn(stage), TrainerStatus.RUNNING, RunningStage.of(stage)
        self.metric_logger.clear_results()  # as Lightning: each run starts without the last run's metrics
        try:
            with run_scope(stage, hooks, module, datamodule, self.accelerator, self.trackers,
                           self.checkpointer.newest, self.cluster_environment):
                yield hooks
            self.state.status = TrainerStatus.FINISHED
        except BaseException:
            self.state.status = TrainerStatus.INTERRUPTED
            raise
        finally:
            self._hooks = None  # drops the hook table's references to this trainer and the module
            self.state.stage = "idle"

    def _attach(self, module: TrainModule | None, datamodule: DataModule | None, stage: str = "fit") -> TrainModule:
        if module is None:
            module = self.attached.module
            if module is None:
                # Lightning's type and sentence first (code may match on it), then what to do.
                raise TypeError(f"`Trainer.{stage}()` requires a `LightningModule` when it hasn't been passed in a "
                                f"previous run: no module given and none attached before. Pass the module, e.g. "
                                f"trainer.{stage}(model, dataloaders).")
        module = self.plan.attach(module, self.config.compile, check_module)
        if module is not self.attached.module:
            self.attached.callbacks = module_callbacks(module, self.attached.callbacks)
        module._trainer_ref = weakref.ref(self)
        module._device_mesh = self.strategy.module_mesh
        if datamodule is not None:
            datamodule._trainer_ref = weakref.ref(self)
        self.module, self.datamodule = module, datamodule
        return module

    # -- checkpoints --------------------------------------------------------------------------------------------
    def _before_save(self) -> None:
        self.stop.update_time()  # time_elapsed is otherwise only current per step with max_time
        self.loss_check.check()  # never a checkpoint of weights a non-finite loss went into

    def save_checkpoint(self, filepath: str | Any, weights_only: bool = False, storage_options: Any = None, *,
                        async_save: bool = False) -> None:
        """Save a complete checkpoint at ``filepath``: a ``.ckpt`` file (a folder on sharded backends), atomically.

        Inside ``fit`` it is written at the next boundary (a resume continues exactly), elsewhere at once.
        ``weights_only=True``: only the module's weights, for inference. ``async_save=True``: in the background
        (``fit`` waits for it before returning). Every process must call it.
        """
        self.checkpointer.save(filepath, weights_only, storage_options, async_save)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Build the module in here: on the run's device, in a true precision's dtype (``strategy.tensor_init_context``)."""
        with self.strategy.tensor_init_context(empty_init=empty_init):
            yield

    def lr_find(self, module: TrainModule, **options: Any) -> Any:
        """A learning-rate search (``Tuner.lr_find``) on the training data of the fit in progress, for
        ``LearningRateFinder``; the module is attached to this trainer again afterwards."""
        from trainer.tuner import Tuner  # the tuner builds trainers: imported when a search runs

        return Tuner(self).search_lr(module, self.plan.train_source, **options)

    def scale_batch_size(self, module: TrainModule, method: str, **options: Any) -> int | None:
        """A batch-size search (``Tuner.search_batch_size``) on the run being set up, for ``BatchSizeFinder``."""
        from trainer.tuner import Tuner  # the tuner builds trainers: imported when a search runs

        return Tuner(self).search_batch_size(module, self.datamodule, method, **options)

    def run_at_boundary(self, fn: Any) -> None:
        """Call ``fn`` at the next checkpoint boundary of ``fit`` (see ``trainer.checkpoint.checkpointer``), or now outside it
        (``ModelCheckpoint`` uses it so a step's checkpoint is taken after that step's validation)."""
        self.checkpointer.run_at_boundary(fn)

    def state_dict(self) -> dict[str, Any]:
        """The trainer's part of a checkpoint: ``TrainState``, every callback's state, the data module's state."""
        return self.checkpointer.entry.trainer_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (callbacks matched by ``state_key``)."""
        self.checkpointer.entry.load_trainer_state(state_dict)

    # -- Lightning's read-only views (loggers, logger, precision, ...) are in trainer.compat.attributes ----------
    @property
    def should_stop(self) -> bool:
        """Whether training stops at the next step boundary. Setting it True on any process stops every process
        at the same step (through the engine's trigger)."""
        return self.stop.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.stop.request(value)

    def log_metrics(self, values: dict[str, Any], step: int | None = None) -> None:
        """For callbacks: ``values`` to the trackers at ``step`` (loggers: as Lightning's), into ``logged_metrics``."""
        self.metric_logger.logged_metrics.update(values)
        self.trackers.log(values, step, logger_step=step)


Trainer.__init__.__signature__ = keyword_signature()  # type: ignore[attr-defined]  # help(), IDEs, the config CLI
