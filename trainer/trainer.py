"""`Trainer`: drives a `TrainModule` through fit / validate / test / predict, everything distributed via the engine."""

from __future__ import annotations

import time
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
from trainer.hooks import HookTable, overrides
from trainer.metrics import MetricLogger
from trainer.module import TrainModule
from trainer.optim import SchedulerConfig
from trainer.runs import _UNSET, RunMixin
from trainer.state import TrainState
from trainer.views import TrainerViews


class Trainer(RunMixin, EvaluationMixin, TrainerViews):
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
        enable_checkpointing: accepted for Lightning compatibility (checkpoint callbacks arrive separately).
        enable_progress_bar / enable_model_summary: add a ``ProgressBar`` / ``ModelSummary`` callback.
        callbacks: more ``Callback`` instances, called in this order.
        log_with / project_dir / project_name: trackers (default ``"csv"``), where they write (default
            ``"runs"``), and the run's project name.
        seed / deterministic: ``engine.set_seed(seed)`` now (seed the model's construction by building the
            Trainer first), and ``torch.use_deterministic_algorithms``.

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
                 deterministic: bool = False) -> None:
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
        self._trackers_started = False
        self._stop_requested = False
        self._val_every: int | None = None
        self._fit_clock = 0.0
        self._automatic = True
        self._custom_optimizer_step = self._custom_zero_grad = self._clip = False
        self._world = self.accelerator.num_processes
        self._training_step: Any = None  # through the prepared model, or the module's own when nothing wraps it
        self._step_schedulers_list: list[SchedulerConfig] = []  # interval "step", not ReduceLROnPlateau
        self._plateau_step_schedulers: list[SchedulerConfig] = []
        self._epoch_schedulers: list[SchedulerConfig] = []

    # -- fit ----------------------------------------------------------------------------------------------------
    def fit(self, module: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: DataModule | None = None, ckpt_path: str | None = None) -> None:
        """Train ``module`` on ``train_dataloaders`` (or ``datamodule``, or its own ``train_dataloader()``).

        ``ckpt_path`` (resuming) is not available yet: passing one raises instead of silently starting over.
        """
        if ckpt_path is not None:
            raise NotImplementedError(f"fit(ckpt_path={ckpt_path!r}): resuming from checkpoints is not available "
                                      "in this version; call fit without ckpt_path.")
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        _check_trainable(module, self.accumulate_grad_batches, self.gradient_clip_val)
        if self._max_epochs_defaulted and self.accelerator.is_main_process:
            warnings.warn(f"Neither max_epochs nor max_steps (nor max_time) was set: training stops after "
                          f"{checks.DEFAULT_MAX_EPOCHS} epochs. Pass max_epochs=N or max_steps=N (max_epochs=-1 "
                          "trains until stopped).", UserWarning, stacklevel=2)
        with self._run("fit", module, datamodule):
            self._setup_fit(train_dataloaders, val_dataloaders)
            self._fit_loop()

    def _fit_loop(self) -> None:
        state, hooks, metrics = self.state, self._hooks, self._metrics
        assert hooks is not None and self._model is not None
        hooks.call("on_fit_start")
        if any(n is None or n > 0 for n in self.num_sanity_val_batches):
            self._evaluate("sanity_check")
        metrics.set_stage("train")
        metrics.set_epoch_hook(True)
        self._set_stage("train")
        hooks.call("on_train_start")
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
                if stepped and state.global_step // self.log_every_n_steps != steps_before // self.log_every_n_steps:
                    self._log_to_trackers(metrics.step_values())
                if self._val_every is not None and self._val_due(batch_idx):
                    self._evaluate("validate")
                if stepped:
                    if self._plateau_step_schedulers:  # after validation: they may monitor a validation metric
                        self._step_schedulers(self._plateau_step_schedulers)
                    if self._stop_now():
                        break
            if self._val_every is None and self._val_in_epoch():
                self._evaluate("validate")  # a loader without a length: validate once it is exhausted
            metrics.set_epoch_hook(True)
            self._epoch_end("on_train_epoch_end")
            self._step_schedulers(self._epoch_schedulers)
            state.epoch += 1
            state.batch_in_epoch = 0
            self._update_time()
        hooks.call("on_train_end")
        self._set_stage("idle")
        hooks.call("on_fit_end")

    def _train_step(self, batch: Any, batch_idx: int) -> Any:
        """One batch: forward, backward and, on the last micro-batch of an accumulation window, the optimizer step."""
        acc, training_step = self.accelerator, self._training_step
        if not self._automatic:
            return training_step(batch, batch_idx)
        k = self.accumulate_grad_batches or 1
        # The window position comes from the stored batch index, so accumulation lines up after a resume, and the
        # last batch of a limited epoch still steps (the engine forces that only at the loader's real end).
        acc.step = k - 1 if batch_idx + 1 == self.num_training_batches else batch_idx % k
        with acc.accumulate(self._model):
            outputs = training_step(batch, batch_idx)
            # The usual case (a 0-d loss tensor with a graph) is checked inline; _loss_of handles the others.
            usual = isinstance(outputs, torch.Tensor) and outputs.ndim == 0 and outputs.requires_grad
            loss = outputs if usual else _loss_of(outputs)
            if loss is None:
                return None  # Lightning: returning None skips this batch's backward and step
            self._backward(loss)
            if acc.sync_gradients:
                self._optimizer_step(batch_idx, loss)
        # As in Lightning, the batch-end hooks get a dict whose tensors are detached.
        if isinstance(outputs, torch.Tensor):
            return {"loss": loss.detach()}
        return {key: v.detach() if isinstance(v, torch.Tensor) else v for key, v in outputs.items()}

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        hooks = self._hooks
        assert hooks is not None
        # The per-step hooks loop over their (usually empty) tuples of overriders: no call when nobody overrides.
        for hook in hooks.overriders["on_before_backward"]:
            hook(loss)
        self.accelerator.backward(loss, *args, **kwargs)
        for hook in hooks.overriders["on_after_backward"]:
            hook()

    def _optimizer_step(self, batch_idx: int, loss: torch.Tensor) -> None:
        hooks, module, state = self._hooks, self.module, self.state
        assert hooks is not None and module is not None
        optimizer = self.optimizers[0]
        for hook in hooks.overriders["on_before_optimizer_step"]:
            hook(optimizer)
        if self._clip:
            module.configure_gradient_clipping(optimizer, self.gradient_clip_val, self.gradient_clip_algorithm)
        # The module's optimizer_step / optimizer_zero_grad are only called when overridden (a call saved per step).
        if self._custom_optimizer_step:
            module.optimizer_step(state.epoch, batch_idx, optimizer, lambda: loss)
        else:
            optimizer.step()
        for hook in hooks.overriders["on_before_zero_grad"]:
            hook(optimizer)
        if self._custom_zero_grad:
            module.optimizer_zero_grad(state.epoch, batch_idx, optimizer)
        else:
            optimizer.zero_grad()
        state.global_step += 1
        if self._step_schedulers_list and not getattr(optimizer, "step_was_skipped", False):
            self._step_schedulers(self._step_schedulers_list)

    def _step_schedulers(self, configs: list[SchedulerConfig]) -> None:
        """Step each of ``configs`` that is due (empty under manual optimisation: the module steps them)."""
        for config in configs:
            count = self.state.global_step if config.interval == "step" else self.state.epoch + 1
            if count % config.frequency:
                continue
            metric = None
            if config.monitor is not None:
                metric = self._metrics.callback_metrics.get(config.monitor)
                if metric is None:
                    logged = sorted(self._metrics.callback_metrics)
                    message = (f"The scheduler {type(config.scheduler).__name__} monitors {config.monitor!r}, which "
                               f"was never logged. Logged metrics: {logged}. Log it with self.log({config.monitor!r}"
                               ", ...) or change 'monitor'")
                    if config.strict:
                        raise KeyError(message + " (or set 'strict': False to skip the step).")
                    warnings.warn(message + "; skipping this scheduler step.", UserWarning, stacklevel=2)
                    continue
            self.module.lr_scheduler_step(config.scheduler, metric)  # type: ignore[union-attr]

    # -- stopping and validation timing -----------------------------------------------------------------------
    def _fit_done(self) -> bool:
        state = self.state
        if self.num_training_batches == 0:
            return True  # limit_train_batches=0 turns training off (the sanity check still runs), as in Lightning
        if self.max_epochs is not None and state.epoch >= self.max_epochs:
            return True
        if self.max_steps is not None and state.global_step >= self.max_steps:
            return True
        return self._stop_now()

    def _stop_now(self) -> bool:
        """Whether to stop at this step boundary; every process reaches the same answer at the same step."""
        state = self.state
        if self.max_steps is not None and state.global_step >= self.max_steps:
            return True
        # The clock is only read per step when max_time needs it (a clock read can be a syscall in a VM).
        if self.max_time is not None and self._update_time() >= self.max_time and not self._stop_requested:
            self.should_stop = True
        # Only a rank that asked can know a stop is pending in a single process; with several, ask everyone.
        if (self._stop_requested or self._world > 1) and self.accelerator.check_trigger():
            self._stop_requested = False
            if state.epoch >= (self.min_epochs or 0) and state.global_step >= (self.min_steps or 0):
                state.should_stop = True
            else:
                warnings.warn(f"A stop was requested at epoch {state.epoch}, step {state.global_step}, before "
                              f"min_epochs={self.min_epochs} / min_steps={self.min_steps}: training goes on.",
                              UserWarning, stacklevel=2)
        return state.should_stop

    def _update_time(self) -> float:
        """Bring ``state.time_elapsed`` up to date (per step with ``max_time``, else at epoch ends) and return it."""
        self.state.time_elapsed = time.monotonic() - self._fit_clock
        return self.state.time_elapsed

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


def _check_trainable(module: Any, accumulate: int | None, clip: float | None) -> None:
    """Fail before any set-up work when ``module`` cannot be trained as configured."""
    if not isinstance(module, TrainModule):
        raise TypeError(f"The trainer runs TrainModule subclasses. Received: {type(module).__name__}: derive your "
                        "model from trainer.TrainModule.")
    name = type(module).__name__
    if not overrides(module, TrainModule, "training_step"):
        raise NotImplementedError(f"{name} has no training_step: add `def training_step(self, batch, batch_idx)` "
                                  "returning the loss.")
    if not overrides(module, TrainModule, "configure_optimizers"):
        raise NotImplementedError(f"{name} has no configure_optimizers: add `def configure_optimizers(self): return "
                                  "torch.optim.AdamW(self.parameters(), lr=1e-3)`.")
    if not module.automatic_optimization and ((accumulate or 1) > 1 or clip is not None):
        raise ValueError(f"{name} uses manual optimisation, which does its own accumulation and clipping: remove "
                         f"Trainer(accumulate_grad_batches={accumulate}, gradient_clip_val={clip}) and do them in "
                         "training_step.")


def _loss_of(outputs: Any) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned (a tensor, a dict with ``"loss"``, or ``None``)."""
    if isinstance(outputs, torch.Tensor):
        loss = outputs
    elif isinstance(outputs, dict) and "loss" in outputs:
        loss = outputs["loss"]
    elif outputs is None:
        return None
    else:
        keys = f" with keys {sorted(outputs)}" if isinstance(outputs, dict) else ""
        raise TypeError(f"training_step returned {type(outputs).__name__}{keys}; return the loss tensor, a dict with "
                        "a 'loss' key, or None to skip the batch.")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        raise ValueError(f"training_step's loss must be a scalar tensor that requires grad. Received: {loss!r:.100}."
                         " Return the loss before .item() / .detach(), computed outside torch.no_grad().")
    return loss


