"""`Trainer`: drives a `TrainModule` through fit / validate / test / predict, everything distributed via the engine."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from callbacks import Callback
from engine import Accelerator, set_seed
from trainer import args as checks
from trainer.datamodule import DataModule
from trainer.evaluation import EvaluationMixin
from trainer.hooks import HookTable
from trainer.metrics import MetricLogger
from trainer.module import TrainModule
from trainer.optim import SchedulerConfig
from trainer.resume import CheckpointMixin, TrainerCheckpointState
from trainer.runs import _UNSET, RunMixin
from trainer.signals import DEFAULT_EXIT_CODE, DEFAULT_SIGNALS, PreemptionHandler, check_signals
from trainer.state import TrainState
from trainer.stepping import NONFINITE_CHOICES, StepMixin, check_trainable, loss_of
from trainer.stopping import StopMixin
from trainer.views import TrainerViews


class Trainer(RunMixin, StepMixin, StopMixin, CheckpointMixin, EvaluationMixin, TrainerViews):
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
        mixed_precision / precision: ``"no"`` / ``"fp16"`` / ``"bf16"`` or Lightning's ``"32"``, ``"16-mixed"``,
            ``"bf16-mixed"``.
        val_check_interval: validate every N training batches (int) or fraction of the epoch (float).
        check_val_every_n_epoch: validate in every N-th epoch; ``None`` counts ``val_check_interval`` batches
            across epochs.
        num_sanity_val_steps: validation batches run before training to catch bugs early (-1: all).
        limit_{train,val,test,predict}_batches: an int number or a float fraction of each loader's batches.
        fast_dev_run: run N (``True``: 1) batches of each stage, one epoch, no trackers, no sanity check.
        overfit_batches: train and validate on the first N (or fraction of) training batches, unshuffled.
        log_every_n_steps: send step metrics to the trackers every N optimizer steps.
        enable_checkpointing: accepted for Lightning compatibility (add a ``ModelCheckpoint`` to save checkpoints).
        enable_progress_bar / enable_model_summary: add a ``ProgressBar`` / ``ModelSummary`` callback.
        callbacks: more ``Callback`` instances, called in this order.
        log_with / project_dir / project_name: trackers (default ``"csv"``), where they write (default
            ``"runs"``), and the run's project name.
        seed / deterministic: ``engine.set_seed(seed)`` now (seed the model's construction by building the
            Trainer first), and ``torch.use_deterministic_algorithms``.
        detect_anomaly: run fit under ``torch.autograd.set_detect_anomaly`` (slow; names the op making a NaN).
        on_nonfinite_loss: what a NaN / inf loss does, decided alike on every process before the optimizer step:
            ``"raise"`` (default) stops every process with a ``FloatingPointError`` naming the step, rank, batch
            and value (checked at each log interval, before each checkpoint and at epoch ends: no sync per
            step, and no checkpoint holds the NaN); ``"skip"`` checks before every optimizer step (one host
            sync each) and drops a step with a non-finite loss (gradients zeroed, a warning); ``"ignore"``.
        preemption_signals / preemption_exit_code: signals (default ``SIGTERM``; add ``signal.SIGUSR1`` for
            SLURM's ``--signal``) on which fit, at the next optimizer step boundary and on every process, saves
            a checkpoint (through the first ``ModelCheckpoint``, else into ``{project_dir}/checkpoints/preempted``),
            finishes the trackers and raises ``Preempted`` (a ``SystemExit``: the script exits with
            ``preemption_exit_code``, default 143 = 128 + SIGTERM). ``None`` installs no handler.

    Resuming: ``fit(..., ckpt_path="last")`` continues from the newest committed checkpoint (bitwise as if
    never stopped), or starts fresh when there is none yet, so one command serves the first start and every
    restart. An exception anywhere in a run calls the callbacks' ``on_exception``, finishes the trackers and,
    with several processes, destroys the process group, so the other ranks fail in their next collective
    instead of waiting for it (with NCCL, the launcher ends them once this process exits).

    Example:
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> class Regressor(TrainModule):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(3, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return torch.nn.functional.mse_loss(self.net(x), y)
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> data = DataLoader(TensorDataset(torch.randn(32, 3), torch.randn(32, 1)), batch_size=8)
        >>> trainer = Trainer(max_epochs=2, log_with=None, enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(Regressor(), data)
        >>> trainer.global_step, trainer.current_epoch
        (8, 2)
    """

    def __init__(self, *, accelerator: Accelerator | str | None = None, max_epochs: int | None = None,
                 min_epochs: int | None = None, max_steps: int | None = None, min_steps: int | None = None,
                 max_time: Any = None, accumulate_grad_batches: int | None = None,
                 gradient_clip_val: float | None = None, gradient_clip_algorithm: str = "norm",
                 mixed_precision: str | None = None, precision: str | int | None = None,
                 val_check_interval: float = 1.0, check_val_every_n_epoch: int | None = 1,
                 num_sanity_val_steps: int = 2, limit_train_batches: float = 1.0,
                 limit_val_batches: float = 1.0, limit_test_batches: float = 1.0,
                 limit_predict_batches: float = 1.0, fast_dev_run: bool | int = False,
                 overfit_batches: float = 0.0, log_every_n_steps: int = 50, enable_checkpointing: bool = True,
                 enable_progress_bar: bool = True, enable_model_summary: bool = True,
                 callbacks: Sequence[Callback] | Callback | None = None, log_with: Any = _UNSET,
                 project_dir: str | None = _UNSET, project_name: str = "ember", seed: int | None = None,
                 deterministic: bool = False, detect_anomaly: bool = False, on_nonfinite_loss: str = "raise",
                 preemption_signals: Any = DEFAULT_SIGNALS, preemption_exit_code: int = DEFAULT_EXIT_CODE) -> None:
        self.max_time = checks.parse_max_time(max_time)
        self.max_epochs, self.max_steps, defaulted = checks.check_epochs_and_steps(max_epochs, max_steps,
                                                                                 self.max_time)
        self.min_epochs = checks.check_count("min_epochs", min_epochs)
        self.min_steps = checks.check_count("min_steps", min_steps)
        self.accumulate_grad_batches = checks.check_count("accumulate_grad_batches", accumulate_grad_batches, 1)
        if gradient_clip_val is not None and (not isinstance(gradient_clip_val, (int, float)) or gradient_clip_val < 0):
            raise ValueError(f"Trainer(gradient_clip_val=...) must be a number >= 0 or None. Received: "
                             f"{gradient_clip_val!r}.")
        self.gradient_clip_val = gradient_clip_val or None
        self.gradient_clip_algorithm = checks.check_choice("gradient_clip_algorithm", gradient_clip_algorithm,
                                                           ("norm", "value"))
        self.val_check_interval = checks.check_val_check_interval(val_check_interval)
        self.check_val_every_n_epoch = checks.check_count("check_val_every_n_epoch", check_val_every_n_epoch, 1)
        if self.check_val_every_n_epoch is None and not checks.is_int(self.val_check_interval):
            raise ValueError(f"Trainer(check_val_every_n_epoch=None) counts val_check_interval in training batches "
                             f"across epochs, so it must be an int. Received: val_check_interval="
                             f"{val_check_interval!r}.")
        self.num_sanity_val_steps = checks.check_count("num_sanity_val_steps", num_sanity_val_steps, -1, False)
        self.limit_train_batches = checks.check_limit("limit_train_batches", limit_train_batches)
        self.limit_val_batches = checks.check_limit("limit_val_batches", limit_val_batches)
        self.limit_test_batches = checks.check_limit("limit_test_batches", limit_test_batches)
        self.limit_predict_batches = checks.check_limit("limit_predict_batches", limit_predict_batches)
        self.overfit_batches = checks.check_limit("overfit_batches", overfit_batches)
        self.log_every_n_steps = checks.check_count("log_every_n_steps", log_every_n_steps, 1, False)
        self.fast_dev_run = checks.check_fast_dev_run(fast_dev_run)
        if self.overfit_batches:
            self.limit_train_batches = self.limit_val_batches = self.overfit_batches
        if self.fast_dev_run:
            n = self.fast_dev_run
            self.limit_train_batches = self.limit_val_batches = n
            self.limit_test_batches = self.limit_predict_batches = n
            self.max_epochs, self.max_steps, defaulted = 1, n, False
            self.num_sanity_val_steps, self.val_check_interval, self.check_val_every_n_epoch = 0, 1.0, 1
        if self.min_epochs is not None and self.max_epochs is not None and self.min_epochs > self.max_epochs:
            raise ValueError(f"Trainer(min_epochs={self.min_epochs}) is larger than max_epochs={self.max_epochs}: "
                             "raise max_epochs or lower min_epochs.")
        self.enable_checkpointing = enable_checkpointing
        self.detect_anomaly = bool(detect_anomaly)
        self.on_nonfinite_loss = checks.check_choice("on_nonfinite_loss", on_nonfinite_loss, NONFINITE_CHOICES)
        self._preemption = PreemptionHandler(check_signals(preemption_signals))
        if not checks.is_int(preemption_exit_code) or not 0 <= preemption_exit_code <= 255:
            raise ValueError(f"Trainer(preemption_exit_code=...) must be an int in [0, 255]. Received: "
                             f"{preemption_exit_code!r}.")
        self.preemption_exit_code = int(preemption_exit_code)
        self.project_name = project_name
        self.accelerator = self._build_accelerator(accelerator, checks.parse_precision(mixed_precision, precision),
                                                   log_with, project_dir)
        if seed is not None:
            set_seed(seed, deterministic=deterministic)
        elif deterministic:
            torch.use_deterministic_algorithms(True)
        self.callbacks = self._build_callbacks(callbacks, enable_progress_bar, enable_model_summary)
        self._max_epochs_defaulted = defaulted

        self.state = TrainState()
        self._metrics = MetricLogger(self.accelerator.num_processes, self.accelerator.reduce, self.accelerator.gather)
        self.module: TrainModule | None = None
        self.datamodule: DataModule | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self._module_optimizers: list[torch.optim.Optimizer] = []
        self.train_dataloader: DataLoader | None = None
        self.val_dataloaders: list[DataLoader] = []
        self.test_dataloaders: list[DataLoader] = []
        self.predict_dataloaders: list[DataLoader] = []
        self.num_training_batches: int | None = 0
        self.num_val_batches: list[int | None] = []
        self.num_sanity_val_batches: list[int | None] = []
        self.num_test_batches: list[int | None] = []
        self.num_predict_batches: list[int | None] = []
        self._model: torch.nn.Module | None = None  # the prepared StepRouter around `module`
        self._model_for: tuple[TrainModule, bool] | None = None
        self._hooks: HookTable | None = None
        self._trackers_started = self._trackers_finished = False
        self._stop_requested = False
        self._interrupt: str | None = None  # "preempted" / "max_time" once every process agreed on it
        self._local_interrupts: set[str] = set()
        self._boundary_queue: list[Any] | None = None  # saves waiting for the next boundary, inside fit's loop
        self._last_save_position: tuple[int, int, int] | None = None
        self._prepared: list[str] = []  # what the trainer prepared, in order: a resume must match it
        self._unchecked: list[tuple[torch.Tensor, int, int, int]] = []  # losses not yet checked for NaN / inf
        self._val_every: int | None = None
        self._fit_clock = 0.0
        self._automatic = True
        self._custom_optimizer_step = self._custom_zero_grad = self._clip = False
        self._world = self.accelerator.num_processes
        self._training_step: Any = None  # through the prepared model, or the module's own when nothing wraps it
        self._step_schedulers_list: list[SchedulerConfig] = []  # interval "step", not ReduceLROnPlateau
        self._plateau_step_schedulers: list[SchedulerConfig] = []
        self._epoch_schedulers: list[SchedulerConfig] = []
        # The trainer's part of every engine checkpoint (TrainState, callbacks, trackers...): plain values only.
        self._checkpoint_state = TrainerCheckpointState(self._checkpoint_payload)
        self.accelerator.register_for_checkpointing(self._checkpoint_state)

    # -- fit ----------------------------------------------------------------------------------------------------
    def fit(self, module: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: DataModule | None = None, ckpt_path: str | None = None) -> None:
        """Train ``module`` on ``train_dataloaders`` (or ``datamodule``, or its own ``train_dataloader()``).

        ``ckpt_path``: ``"last"`` resumes from the newest committed checkpoint of the project (and starts fresh,
        saying so, when there is none), a folder path resumes from that checkpoint; a path that does not exist
        raises before anything runs. The resumed run continues exactly where the checkpoint was taken.
        """
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        check_trainable(module, self.accumulate_grad_batches, self.gradient_clip_val, self.on_nonfinite_loss)
        resume_from = self._resolve_ckpt_path(ckpt_path, "fit")
        if self._max_epochs_defaulted and self.accelerator.is_main_process:
            warnings.warn(f"Neither max_epochs nor max_steps (nor max_time) was set: training stops after "
                          f"{checks.DEFAULT_MAX_EPOCHS} epochs. Pass max_epochs=N or max_steps=N (max_epochs=-1 "
                          "trains until stopped).", UserWarning, stacklevel=2)
        anomaly = torch.autograd.set_detect_anomaly(True) if self.detect_anomaly else contextlib.nullcontext()
        with self._run("fit", module, datamodule), self._preemption, anomaly:
            self._setup_fit(train_dataloaders, val_dataloaders)
            if resume_from is not None:
                self._restore(resume_from)  # before the trackers start: they reopen the saved runs
            self._start_trackers()
            self._fit_loop(sanity_check=resume_from is None)

    def _fit_loop(self, sanity_check: bool) -> None:
        state, hooks, metrics = self.state, self._hooks, self._metrics
        assert hooks is not None and self._model is not None
        hooks.call("on_fit_start")
        if sanity_check and any(n is None or n > 0 for n in self.num_sanity_val_batches):
            self._evaluate("sanity_check")
        metrics.set_stage("train")
        metrics.set_epoch_hook(True)
        self._set_stage("train")
        hooks.call("on_train_start")
        with self._boundaries():  # checkpoints are written where a resume continues exactly
            while not self._fit_done():
                self._model.train()
                metrics.reset_epoch()
                self._set_epoch()
                hooks.call("on_train_epoch_start")
                self.accelerator.gradient_accumulation_steps = self.accumulate_grad_batches or 1
                metrics.set_epoch_hook(False)
                for batch_idx, batch in self._batches(self.train_dataloader, self.num_training_batches,
                                                      state.batch_in_epoch):
                    size = metrics.new_batch(batch)
                    if hooks.call("on_train_batch_start", batch, batch_idx) == -1:
                        break  # Lightning: the module returning -1 ends the epoch early
                    steps_before = state.global_step
                    outputs = self._train_step(batch, batch_idx)
                    state.batch_in_epoch, state.micro_step = batch_idx + 1, state.micro_step + 1
                    state.samples_seen += size * self._world
                    hooks.call("on_train_batch_end", outputs, batch, batch_idx)
                    stepped = state.global_step != steps_before
                    every = self.log_every_n_steps
                    if stepped and state.global_step // every != steps_before // every:
                        self._check_losses()  # no NaN reaches the trackers unnoticed; one sync per interval
                        self._log_to_trackers(metrics.step_values())
                    if self._val_every is not None and self._val_due(batch_idx):
                        self._evaluate("validate")
                    if self._batch_boundary(stepped):  # schedulers, the agreed stop, waiting checkpoints
                        break
                if self._val_every is None and self._val_in_epoch():
                    self._evaluate("validate")  # a loader without a length: validate once it is exhausted
                metrics.set_epoch_hook(True)
                self._check_losses()
                self._epoch_end("on_train_epoch_end")
                self._step_schedulers(self._epoch_schedulers)
                state.epoch += 1
                state.batch_in_epoch = 0
                self._update_time()
                self._flush_boundary(stepped=True)  # epoch-end checkpoints resume at the next epoch's start
            self._check_losses()
        hooks.call("on_train_end")
        self._set_stage("idle")
        hooks.call("on_fit_end")

    def _train_step(self, batch: Any, batch_idx: int) -> Any:
        """One batch: forward, backward and, on the last micro-batch of an accumulation window, the optimizer step."""
        acc, training_step = self.accelerator, self._training_step
        if not self._automatic:
            outputs = training_step(batch, batch_idx)
            if self.on_nonfinite_loss != "ignore":
                self._check_manual_loss(outputs, batch_idx)
            return outputs
        k = self.accumulate_grad_batches or 1
        # The window position comes from the stored batch index, so accumulation lines up after a resume, and the
        # last batch of a limited epoch still steps (the engine forces that only at the loader's real end).
        acc.step = k - 1 if batch_idx + 1 == self.num_training_batches else batch_idx % k
        with acc.accumulate(self._model):
            outputs = training_step(batch, batch_idx)
            # The usual case (a 0-d loss tensor with a graph) is checked inline; loss_of handles the others.
            usual = isinstance(outputs, torch.Tensor) and outputs.ndim == 0 and outputs.requires_grad
            loss = outputs if usual else loss_of(outputs)
            if loss is None:
                return None  # Lightning: returning None skips this batch's backward and step
            if self.on_nonfinite_loss != "ignore":
                self._record_loss(loss, batch_idx)
            self._backward(loss)
            if acc.sync_gradients:
                self._optimizer_step(batch_idx, loss)
        # As in Lightning, the batch-end hooks get a dict whose tensors are detached.
        if isinstance(outputs, torch.Tensor):
            return {"loss": loss.detach()}
        return {key: v.detach() if isinstance(v, torch.Tensor) else v for key, v in outputs.items()}
