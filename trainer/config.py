"""`TrainerConfig`: the Trainer's keyword arguments, validated once and frozen.

``Trainer.__init__`` keeps Lightning's keyword signature; every check of those keywords lives here, so a bad
value fails at construction, naming what was received and what to do. The config never changes during a run:
what does change (the accumulation factor under ``GradientAccumulationScheduler``, ``max_epochs`` raised for
a second ``fit``) is replaced through ``dataclasses.replace`` by the Trainer's setters, re-validated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainer import args as checks
from trainer.compiling import check_compile
from trainer.signals import check_signals

NONFINITE_CHOICES = ("raise", "skip", "ignore")


@dataclass(frozen=True)
class TrainerConfig:
    """Validated Trainer settings (see ``Trainer`` for what each one means; the longer stories are here).

    ``on_nonfinite_loss``: ``"raise"`` (default: every process stops with a ``FloatingPointError`` naming the
    step, rank, batch and value; no sync per step, no checkpoint holds the NaN), ``"skip"`` (drop such optimizer
    steps; one host sync per step) or ``"ignore"``; see ``trainer.loss_check.LossCheck``.

    ``preemption_signals`` / ``preemption_exit_code``: signals (default ``SIGTERM``; add ``signal.SIGUSR1`` for
    SLURM) on which fit, at the next optimizer step boundary on every process, saves a checkpoint (the first
    ``ModelCheckpoint``'s, else ``{project_dir}/checkpoints/preempted``), finishes the trackers and exits with
    ``preemption_exit_code`` (default 143 = 128 + SIGTERM; ``Preempted``); ``None``: no handler.

    Example:
        >>> config = TrainerConfig.from_keywords(max_epochs=3, fast_dev_run=2)
        >>> config.max_epochs, config.max_steps, config.limit_val_batches, config.num_sanity_val_steps
        (1, 2, 2, 0)
    """

    max_epochs: int | None = None
    min_epochs: int | None = None
    max_steps: int | None = None
    min_steps: int | None = None
    max_time: float | None = None
    max_epochs_defaulted: bool = False
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"
    precision: str | None = None
    val_check_interval: int | float = 1.0
    check_val_every_n_epoch: int | None = 1
    num_sanity_val_steps: int = 2
    limit_train_batches: int | float = 1.0
    limit_val_batches: int | float = 1.0
    limit_test_batches: int | float = 1.0
    limit_predict_batches: int | float = 1.0
    fast_dev_run: int = 0
    overfit_batches: int | float = 0.0
    log_every_n_steps: int = 50
    enable_checkpointing: bool = True
    detect_anomaly: bool = False
    on_nonfinite_loss: str = "raise"
    preemption_signals: tuple[int, ...] = ()
    preemption_exit_code: int = 143
    project_name: str = "ember"
    compile: dict[str, Any] | None = None  # torch.compile keyword arguments for the module's steps

    @classmethod
    def from_keywords(cls, *, max_epochs: int | None = None, min_epochs: int | None = None,
                      max_steps: int | None = None, min_steps: int | None = None, max_time: Any = None,
                      accumulate_grad_batches: int | None = None, gradient_clip_val: float | None = None,
                      gradient_clip_algorithm: str = "norm", mixed_precision: str | None = None,
                      precision: str | int | None = None, val_check_interval: float = 1.0,
                      check_val_every_n_epoch: int | None = 1, num_sanity_val_steps: int = 2,
                      limit_train_batches: float = 1.0, limit_val_batches: float = 1.0,
                      limit_test_batches: float = 1.0, limit_predict_batches: float = 1.0,
                      fast_dev_run: bool | int = False, overfit_batches: float = 0.0, log_every_n_steps: int = 50,
                      enable_checkpointing: bool = True, detect_anomaly: bool = False,
                      on_nonfinite_loss: str = "raise", preemption_signals: Any = None,
                      preemption_exit_code: int = 143, project_name: str = "ember",
                      compile: bool | dict[str, Any] = False) -> TrainerConfig:
        """Check every keyword and resolve the ones that set others (``fast_dev_run``, ``overfit_batches``).

        ``None`` means the default for the keywords whose Lightning default is ``None`` (configs pass ``null``).
        """
        limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches = (
            1.0 if v is None else v for v in (limit_train_batches, limit_val_batches, limit_test_batches,
                                              limit_predict_batches))
        val_check_interval = 1.0 if val_check_interval is None else val_check_interval
        num_sanity_val_steps = 2 if num_sanity_val_steps is None else num_sanity_val_steps
        log_every_n_steps = 50 if log_every_n_steps is None else log_every_n_steps
        gradient_clip_algorithm = gradient_clip_algorithm or "norm"
        enable_checkpointing = True if enable_checkpointing is None else enable_checkpointing
        seconds = checks.parse_max_time(max_time)
        max_epochs, max_steps, defaulted = checks.check_epochs_and_steps(max_epochs, max_steps, seconds)
        if gradient_clip_val is not None and (not isinstance(gradient_clip_val, (int, float))
                                              or isinstance(gradient_clip_val, bool) or gradient_clip_val < 0):
            raise ValueError(f"Trainer(gradient_clip_val=...) must be a number >= 0 or None. Received: "
                             f"{gradient_clip_val!r}.")
        interval = checks.check_val_check_interval(val_check_interval)
        every_n_epoch = checks.check_count("check_val_every_n_epoch", check_val_every_n_epoch, 1)
        if every_n_epoch is None and not checks.is_int(interval):
            raise ValueError(f"Trainer(check_val_every_n_epoch=None) counts val_check_interval in training batches "
                             f"across epochs, so it must be an int. Received: val_check_interval="
                             f"{val_check_interval!r}.")
        if not checks.is_int(preemption_exit_code) or not 0 <= preemption_exit_code <= 255:
            raise ValueError(f"Trainer(preemption_exit_code=...) must be an int in [0, 255]. Received: "
                             f"{preemption_exit_code!r}.")
        limits = {name: checks.check_limit(name, value) for name, value in (
            ("limit_train_batches", limit_train_batches), ("limit_val_batches", limit_val_batches),
            ("limit_test_batches", limit_test_batches), ("limit_predict_batches", limit_predict_batches))}
        overfit = checks.check_limit("overfit_batches", overfit_batches)
        sanity = checks.check_count("num_sanity_val_steps", num_sanity_val_steps, -1, False)
        fast = checks.check_fast_dev_run(fast_dev_run)
        if overfit:
            limits["limit_train_batches"] = limits["limit_val_batches"] = overfit
        if fast:
            limits = dict.fromkeys(limits, fast)
            max_epochs, max_steps, defaulted = 1, fast, False
            sanity, interval, every_n_epoch = 0, 1.0, 1
        config = cls(
            max_epochs=max_epochs, min_epochs=checks.check_count("min_epochs", min_epochs), max_steps=max_steps,
            min_steps=checks.check_count("min_steps", min_steps), max_time=seconds, max_epochs_defaulted=defaulted,
            accumulate_grad_batches=checks.check_count("accumulate_grad_batches", accumulate_grad_batches, 1) or 1,
            gradient_clip_val=gradient_clip_val or None,
            gradient_clip_algorithm=checks.check_choice("gradient_clip_algorithm", gradient_clip_algorithm,
                                                        ("norm", "value")),
            precision=checks.parse_precision(mixed_precision, precision), val_check_interval=interval,
            check_val_every_n_epoch=every_n_epoch, num_sanity_val_steps=sanity or 0, fast_dev_run=fast,
            overfit_batches=overfit, log_every_n_steps=checks.check_count("log_every_n_steps", log_every_n_steps, 1,
                                                                          False) or 1,
            enable_checkpointing=bool(enable_checkpointing), detect_anomaly=bool(detect_anomaly),
            on_nonfinite_loss=checks.check_choice("on_nonfinite_loss", on_nonfinite_loss, NONFINITE_CHOICES),
            preemption_signals=check_signals(preemption_signals), preemption_exit_code=int(preemption_exit_code),
            project_name=project_name, compile=check_compile(compile), **limits)
        return config.checked()

    def checked(self) -> TrainerConfig:
        """Checks across fields; returns ``self`` (also run after a setter replaced a field)."""
        if self.min_epochs is not None and self.max_epochs is not None and self.min_epochs > self.max_epochs:
            raise ValueError(f"Trainer(min_epochs={self.min_epochs}) is larger than max_epochs={self.max_epochs}: "
                             "raise max_epochs or lower min_epochs.")
        return self

    def replace(self, **changes: Any) -> TrainerConfig:
        """A copy with ``changes`` (already validated by the caller), checked across fields."""
        return dataclasses.replace(self, **changes).checked()
