"""`TrainerConfig`: every ``Trainer`` keyword with its default, checked once and frozen.

This is the one place where the Trainer's keywords and their defaults are written: ``Trainer(**keywords)``
builds a ``TrainerConfig`` from its keywords (the Trainer's signature is generated from these fields), and
``Trainer.from_config(config)`` builds a trainer from one (the Tuner and the config CLI do). Checking a keyword
resolves it to the value the trainer uses (``max_time`` in seconds, ``fast_dev_run``'s limits, Lightning's
``precision`` strings as one ``engine.precision.Precision``...) in ``__post_init__``; that resolution is
idempotent, so ``dataclasses.replace(config, max_epochs=5)`` checks the result again and keeps every other value.

The Lightning-only keywords (``strategy``, ``devices``, ``logger``, ``benchmark``...) are kept as given here and
resolved, with their side effects, by ``trainer.compat.keywords`` when a Trainer is built.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from callbacks import Callback
from callbacks.exceptions import MisconfigurationException
from engine import Accelerator
from engine.keywords import keyword_error
from engine.precision.policy import Precision
from trainer import args as checks
from trainer.loop.signals import DEFAULT_EXIT_CODE, DEFAULT_SIGNALS, check_signals
from trainer.profiling import Profiler
from trainer.tools.compiling import check_compile

NONFINITE_CHOICES = ("raise", "skip", "ignore")


class _Unset:
    """A keyword's "not given" (distinct from an explicit None): ``log_with`` and ``project_dir`` conflict with
    other keywords only when given."""

    def __repr__(self) -> str:
        return "<not given>"


UNSET: Any = _Unset()


def nonfinite_policy(given: Any, callbacks: Any) -> str:
    """``Trainer(on_nonfinite_loss=...)`` resolved: the given choice, else ``"raise"``; but a ``SpikeDetection``
    callback is the run's own policy for loss anomalies (its ``finite_only`` says whether a NaN / inf is one), so
    with one attached and nothing given the trainer leaves non-finite losses to it, as in Lightning."""
    if given is not UNSET:
        return checks.check_choice("on_nonfinite_loss", given, NONFINITE_CHOICES)
    from callbacks.spike import SpikeDetection

    listed = callbacks if isinstance(callbacks, Sequence) else [callbacks]
    return "ignore" if any(isinstance(c, SpikeDetection) for c in listed) else "raise"


_T = TypeVar("_T")


@dataclass(frozen=True)
class TrainerConfig:
    """The Trainer's settings (see ``Trainer`` for what each one means; the longer stories are here).

    ``on_nonfinite_loss``: ``"raise"`` (default: every process stops with a ``FloatingPointError`` naming the
    step, rank, batch and value; no sync per step, no checkpoint holds the NaN), ``"skip"`` (drop such optimizer
    steps; one host sync per step) or ``"ignore"``; see ``trainer.loop.loss_check.LossCheck``. Not given, with a
    ``SpikeDetection`` callback attached: ``"ignore"``, the callback decides (``nonfinite_policy``).

    ``preemption_signals`` / ``preemption_exit_code``: signals (default ``SIGTERM``; add ``signal.SIGUSR1`` for
    SLURM) on which fit, at the next optimizer step boundary on every process, saves a checkpoint (the first
    ``ModelCheckpoint``'s, else ``{project_dir}/checkpoints/preempted``), finishes the trackers and exits with
    ``preemption_exit_code`` (default 143 = 128 + SIGTERM; ``Preempted``); ``None``: no handler.

    Example:
        >>> config = TrainerConfig(max_epochs=3, fast_dev_run=2)
        >>> config.max_epochs, config.max_steps, config.limit_val_batches, config.num_sanity_val_steps
        (1, 2, 2, 0)
        >>> dataclasses.replace(config, fast_dev_run=False, max_steps=None).max_steps is None
        True
    """

    accelerator: Accelerator | str | None = None  # or "auto" / "cpu" / "gpu" / "cuda"
    max_epochs: int | None = None
    min_epochs: int | None = None
    max_steps: int | None = None
    min_steps: int | None = None
    max_time: Any = None  # resolved to seconds (float)
    accumulate_grad_batches: int | None = None  # resolved to an int >= 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None  # None: by norm; kept None (Lightning's trainer attribute)
    mixed_precision: str | None = None  # resolved to the engine's name ("no" / "fp16" / "bf16" / "fp8") of ...
    precision: str | int | None = None  # ... `resolved_precision`, from either keyword; this one kept as given
    val_check_interval: float | None = 1.0
    check_val_every_n_epoch: int | None = 1
    num_sanity_val_steps: int | None = None  # None: 2 (Lightning's default), 0 with barebones
    limit_train_batches: float | None = 1.0
    limit_val_batches: float | None = 1.0
    limit_test_batches: float | None = 1.0
    limit_predict_batches: float | None = 1.0
    fast_dev_run: bool | int = False  # resolved to the number of batches per stage (0: off)
    overfit_batches: float = 0.0
    log_every_n_steps: int | None = 50
    enable_checkpointing: bool | None = None  # None: True (False with barebones)
    enable_progress_bar: bool | None = None
    enable_model_summary: bool | None = None
    callbacks: Sequence[Callback] | Callback | None = None
    log_with: Any = UNSET  # tracker names or GeneralTracker objects; not given: Lightning's default logger
    project_dir: str | None = UNSET  # not given: "runs"
    project_name: str = "ember"
    seed: int | None = None
    deterministic: bool = False
    detect_anomaly: bool = False
    on_nonfinite_loss: str = UNSET  # not given: "raise", unless a SpikeDetection callback decides (nonfinite_policy)
    preemption_signals: Any = DEFAULT_SIGNALS  # resolved to a tuple of signal numbers
    preemption_exit_code: int = DEFAULT_EXIT_CODE
    strategy: Any = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    logger: Any = None
    default_root_dir: str | None = None
    benchmark: bool | None = None
    inference_mode: bool = True
    use_distributed_sampler: bool = True
    profiler: Profiler | str | None = None
    barebones: bool = False
    plugins: Any = None
    sync_batchnorm: bool = False
    reload_dataloaders_every_n_epochs: int = 0
    enable_autolog_hparams: bool = True
    model_registry: str | None = None
    compile: Any = False  # resolved to torch.compile's keyword arguments, or None
    # Resolved, not keywords (carried by dataclasses.replace): max_epochs fell back to 1000 because no limit was
    # given (fit warns); max_epochs=-1 asked for no limit at all (stored as None).
    max_epochs_defaulted: bool = field(default=False, repr=False)
    max_epochs_unlimited: bool = field(default=False, repr=False)
    # The run's one Precision, from `mixed_precision` or `precision` (None: neither given; a given Accelerator's
    # applies). The engine gets its mixed_precision; a true precision's conversions go through the same value.
    resolved_precision: Precision | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the checked values replace the given ones, here only
        for name, default in (("limit_train_batches", 1.0), ("limit_val_batches", 1.0), ("limit_test_batches", 1.0),
                              ("limit_predict_batches", 1.0), ("val_check_interval", 1.0), ("log_every_n_steps", 50)):
            if getattr(self, name) is None:  # configs pass null for "the default"
                set_(self, name, default)
        seconds = checks.parse_max_time(self.max_time)
        unlimited = self.max_epochs == -1 or (self.max_epochs is None and self.max_epochs_unlimited)
        max_epochs, max_steps, defaulted = checks.check_epochs_and_steps(-1 if unlimited else self.max_epochs,
                                                                         self.max_steps, seconds)
        # A replace() keeps a default once made: max_epochs still at it, and still no other limit.
        defaulted = defaulted or (self.max_epochs_defaulted and max_epochs == checks.DEFAULT_MAX_EPOCHS
                                  and max_steps is None and seconds is None)
        clip_algorithm = checks.check_gradient_clip(self.gradient_clip_val, self.gradient_clip_algorithm)
        interval = checks.check_val_check_interval(self.val_check_interval)
        if self.check_val_every_n_epoch is not None and not checks.is_int(self.check_val_every_n_epoch):
            # Lightning's sentence first (code may match on it), then what Ember takes.
            raise MisconfigurationException(
                f"`check_val_every_n_epoch` should be an integer, found {self.check_val_every_n_epoch!r}. "
                f"Trainer(check_val_every_n_epoch=...) must be an int >= 1 or None. Received: "
                f"{self.check_val_every_n_epoch!r}.")
        every_n_epoch = checks.check_count("check_val_every_n_epoch", self.check_val_every_n_epoch, 1)
        if every_n_epoch is None and not checks.is_int(interval) and checks.val_check_seconds(interval) is None:
            raise MisconfigurationException(
                f"Trainer(check_val_every_n_epoch=None, val_check_interval={interval!r}): `val_check_interval` should be "
                "an integer or a time-based duration (str 'DD:HH:MM:SS', datetime.timedelta, or dict kwargs for "
                "timedelta) when `check_val_every_n_epoch=None`. It then counts training batches (or time) across "
                "epochs.")
        code = self.preemption_exit_code
        if not checks.is_int(code) or not 0 <= code <= 255:
            raise ValueError(f"Trainer(preemption_exit_code=...) must be an int in [0, 255]. Received: {code!r}.")
        limits = {name: checks.check_limit(name, getattr(self, name)) for name in (
            "limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")}
        overfit = checks.check_limit("overfit_batches", self.overfit_batches)
        switches = self._switches()
        sanity = checks.check_count("num_sanity_val_steps", switches["num_sanity_val_steps"], -1, False)
        fast = checks.check_fast_dev_run(self.fast_dev_run)
        if overfit:
            limits["limit_train_batches"] = limits["limit_val_batches"] = overfit
        if fast:
            limits = dict.fromkeys(limits, fast)
            max_epochs, max_steps, defaulted = 1, fast, False
            sanity, interval, every_n_epoch = 0, 1.0, 1
        precision = checks.parse_precision(self.mixed_precision, self.precision)  # one value; the engine's name
        resolved = dict(
            max_epochs=max_epochs, min_epochs=checks.check_count("min_epochs", self.min_epochs), max_steps=max_steps,
            min_steps=checks.check_count("min_steps", self.min_steps), max_time=seconds,
            max_epochs_defaulted=defaulted, max_epochs_unlimited=unlimited and not fast,
            accumulate_grad_batches=checks.check_count("accumulate_grad_batches", self.accumulate_grad_batches,
                                                       1) or 1,
            gradient_clip_val=self.gradient_clip_val or None,
            # Not given stays None, as Lightning's trainer.gradient_clip_algorithm: clipping is then by norm, and
            # TrainModule.clip_gradients accepts any algorithm (a given one must match, as in Lightning).
            gradient_clip_algorithm=clip_algorithm,
            resolved_precision=precision, mixed_precision=None if precision is None else precision.mixed_precision,
            val_check_interval=interval,
            check_val_every_n_epoch=every_n_epoch, num_sanity_val_steps=sanity or 0, fast_dev_run=fast,
            overfit_batches=overfit,
            log_every_n_steps=0 if self.barebones else (  # Lightning's barebones: 0, nothing is logged
                checks.check_count("log_every_n_steps", self.log_every_n_steps, 1, False) or 1),
            enable_checkpointing=bool(switches["enable_checkpointing"]),
            enable_progress_bar=bool(switches["enable_progress_bar"]),
            enable_model_summary=bool(switches["enable_model_summary"]),
            detect_anomaly=bool(self.detect_anomaly),
            on_nonfinite_loss=nonfinite_policy(self.on_nonfinite_loss, self.callbacks),
            preemption_signals=check_signals(self.preemption_signals), preemption_exit_code=int(code),
            compile=check_compile(self.compile), **limits)
        for name, value in resolved.items():
            set_(self, name, value)
        if self.min_epochs is not None and self.max_epochs is not None and self.min_epochs > self.max_epochs:
            raise ValueError(f"Trainer(min_epochs={self.min_epochs}) is larger than max_epochs={self.max_epochs}: "
                             "raise max_epochs or lower min_epochs.")

    def _switches(self) -> dict[str, Any]:
        """The features ``barebones`` turns off, resolved (``None`` is Lightning's default: on, 2 sanity steps).

        Asking for one of them as well as ``barebones=True`` is an error, as in Lightning.
        """
        given = {"enable_checkpointing": self.enable_checkpointing, "enable_progress_bar": self.enable_progress_bar,
                 "enable_model_summary": self.enable_model_summary, "num_sanity_val_steps": self.num_sanity_val_steps}
        if not self.barebones:
            return {name: (2 if name == "num_sanity_val_steps" else True) if value is None else value
                    for name, value in given.items()}
        off = {"enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
               "num_sanity_val_steps": 0}
        conflicts: dict[str, Any] = {k: v for k, v in given.items()
                                     if v not in (None, False, 0) and v is not off[k]}
        if self.logger not in (None, False):
            conflicts["logger"] = self.logger
        # log_every_n_steps: 50 is also the dataclass default, so only another value is known to be asked for.
        if self.log_every_n_steps not in (None, 0, 50):
            conflicts["log_every_n_steps"] = self.log_every_n_steps
        if self.fast_dev_run:
            conflicts["fast_dev_run"] = self.fast_dev_run
        if self.detect_anomaly:
            conflicts["detect_anomaly"] = True
        if self.profiler is not None:
            conflicts["profiler"] = self.profiler
        if conflicts:
            name, value = next(iter(conflicts.items()))
            raise ValueError(f"`Trainer(barebones=True, {name}={value!r})` was passed: barebones turns {name} off. "
                             f"Remove {name}=, or barebones=True.")
        return off

    def keywords(self) -> dict[str, Any]:
        """The keywords that build this config again (``Trainer(**config.keywords())``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in KEYWORDS}

    # The resolved values, typed. The fields keep the types a caller may pass (None: "the default") because they
    # are the Trainer's signature (help(), the CLI); __post_init__ has replaced every None in these, so a None
    # read here means the config was changed around its checks.
    @property
    def accumulation(self) -> int:
        """``accumulate_grad_batches``, resolved: batches per optimizer step (>= 1)."""
        return _resolved(self, "accumulate_grad_batches", self.accumulate_grad_batches)

    @property
    def log_interval(self) -> int:
        """``log_every_n_steps``, resolved (0 with ``barebones``: nothing is logged)."""
        return _resolved(self, "log_every_n_steps", self.log_every_n_steps)

    @property
    def val_interval(self) -> float:
        """``val_check_interval``, resolved (a time is kept as given: see ``args.val_check_seconds``)."""
        return _resolved(self, "val_check_interval", self.val_check_interval)

    def limit(self, stage: str) -> float:
        """``limit_{stage}_batches``, resolved: an int count or a float fraction (``stage``: ``"train"``,
        ``"val"``, ``"test"`` or ``"predict"``)."""
        name = f"limit_{stage}_batches"
        return _resolved(self, name, getattr(self, name))


def _resolved(config: TrainerConfig, name: str, value: _T | None) -> _T:
    if value is None:
        raise RuntimeError(f"TrainerConfig.{name} is None after the config resolved it: set fields through "
                           f"dataclasses.replace(config, {name}=...), which resolves them again.")
    return value


# The Trainer's keywords, in the order of its signature (every field but the resolved-only ones).
KEYWORDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainerConfig) if f.repr)


def check_keywords(owner: str, keywords: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` naming an unknown keyword and the closest accepted one (``max_epoch`` -> ``max_epochs``).

    Example:
        >>> check_keywords("Trainer", {"max_epoch": 3})
        Traceback (most recent call last):
        engine.keywords.UnexpectedKeywordError: Trainer.__init__() got an unexpected keyword argument 'max_epoch'. Did you mean 'max_epochs'?
    """
    for name in keywords:
        if name not in KEYWORDS:
            # Python's own wording for a class's unknown keyword ("Trainer.__init__() got ..."), plus the match.
            raise keyword_error(f"{owner}.__init__", name, KEYWORDS, docs="help(Trainer)")


def keyword_signature() -> inspect.Signature:
    """The Trainer's signature: one keyword-only parameter per ``KEYWORDS`` entry, with its default and type."""
    hints = typing.get_type_hints(TrainerConfig)
    defaults = {f.name: f.default for f in dataclasses.fields(TrainerConfig)}
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults[name],
                                     annotation=hints[name]) for name in KEYWORDS]
    return inspect.Signature(parameters, return_annotation=None)
