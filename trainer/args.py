"""Validation of the Trainer's keyword arguments, so a bad value fails at construction, naming the fix."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from engine.precision.policy import Precision

DEFAULT_MAX_EPOCHS = 1000

# Lightning precision strings -> the engine's mixed_precision values.
_PRECISION = {"32": "no", "32-true": "no", "no": "no", "16-mixed": "fp16", "16": "fp16", "fp16": "fp16",
              "bf16-mixed": "bf16", "bf16": "bf16", "fp8": "fp8"}
# Lightning's true precisions: the parameters and floating inputs are in this dtype (no autocast).
_TRUE_PRECISION = {"64": "float64", "64-true": "float64", "16-true": "float16",
                   "bf16-true": "bfloat16"}
# Lightning's fp8 precisions run NVIDIA TransformerEngine (GPU-only); Ember's fp8 is torchao's (engine.precision.fp8).
_TRANSFORMER_ENGINE = ("transformer-engine", "transformer-engine-float16")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(name: str, value: Any, minimum: int = 0, allow_none: bool = True) -> int | None:
    """``value`` if it is an int >= ``minimum`` (or ``None`` when allowed); otherwise a clear error."""
    if value is None and allow_none:
        return None
    if not is_int(value) or value < minimum:
        raise ValueError(f"Trainer({name}=...) must be an int >= {minimum}{' or None' if allow_none else ''}. "
                         f"Received: {value!r}.")
    return int(value)


def check_limit(name: str, value: Any) -> int | float:
    """A ``limit_*_batches`` / ``overfit_batches`` value: an int >= 0 (batches) or a float in [0, 1] (fraction);
    a whole float above 1 (``1e50``) counts as that many batches, as in Lightning.

    Example:
        >>> check_limit("limit_val_batches", 0.25), check_limit("limit_val_batches", 3.0)
        (0.25, 3)
    """
    if is_int(value) and value >= 0:
        return int(value)
    if isinstance(value, float) and 0.0 <= value <= 1.0:
        return value
    if isinstance(value, float) and value > 1 and value % 1.0 == 0:
        return int(value)
    raise _invalid_limit(name, value, "an int >= 0 (a number of batches) or a float in [0.0, 1.0] (a fraction of "
                                      "the loader)")


def _invalid_limit(name: str, value: Any, expected: str) -> ValueError:
    from trainer.utilities.exceptions import MisconfigurationException  # a ValueError, as Lightning raises

    # Lightning's text first (code may match on it), then what Ember takes.
    return MisconfigurationException(f"You have passed invalid value {value} for {name}, it has to be in [0.0, 1.0] "
                                     f"or an int. Trainer({name}=...) must be {expected}. Received: {value!r}.")


def check_epochs_and_steps(max_epochs: Any, max_steps: Any, max_time: float | None) -> tuple[int | None, int | None,
                                                                                              bool]:
    """Validated ``(max_epochs, max_steps, defaulted)``; ``defaulted`` is True when ``max_epochs`` fell back to 1000.

    ``-1`` is Lightning's spelling of "no limit" and is accepted as ``None``; any other negative value raises.
    With neither limit (and no ``max_time``), training stops after ``DEFAULT_MAX_EPOCHS`` epochs, as in Lightning.
    """
    from trainer.utilities.exceptions import MisconfigurationException  # a ValueError, as Lightning raises

    for name, value in (("max_epochs", max_epochs), ("max_steps", max_steps)):
        if value is not None and (not is_int(value) or value < -1):
            # Lightning's sentence first (code may match on it), then what Ember takes.
            raise MisconfigurationException(f"`{name}` must be a non-negative integer or -1. Trainer({name}=...) "
                                            f"must be an int >= 0, or None (or -1) for no limit. Received: {value!r}.")
    explicit_unlimited = max_epochs == -1
    max_epochs = None if max_epochs == -1 else max_epochs
    max_steps = None if max_steps == -1 else max_steps
    if max_epochs is None and max_steps is None and max_time is None and not explicit_unlimited:
        return DEFAULT_MAX_EPOCHS, None, True
    return max_epochs, max_steps, False


def parse_precision(mixed_precision: Any, precision: Any) -> Precision | None:
    """The run's one ``Precision`` from either keyword (Accelerate's ``mixed_precision`` values, or Lightning's
    ``precision`` strings, true precisions such as ``"64"`` and ``"bf16-true"`` included); None when neither is
    given (a given Accelerator's precision applies).

    Example:
        >>> parse_precision(None, "bf16-true"), parse_precision("fp16", None).mixed_precision
        (Precision(kind='true', dtype=torch.bfloat16), 'fp16')
    """
    values: list[tuple[str, Any, Precision]] = []
    for name, value in (("mixed_precision", mixed_precision), ("precision", precision)):
        if value is None:
            continue
        key = str(value).lower()
        if name == "precision" and key in _TRUE_PRECISION:
            values.append((name, value, Precision.true(_TRUE_PRECISION[key])))
            continue
        if key in _TRANSFORMER_ENGINE:
            raise ValueError(f"Trainer({name}={value!r}) needs NVIDIA TransformerEngine, a GPU-only package Ember "
                             "does not use. Ember trains in fp8 through torchao: Trainer(precision='fp8') "
                             '(pip install "ember-train[fp8]"); see the "Big models" guide (docs/guides/big-models.md).')
        if key not in _PRECISION:
            choices = sorted(set(_PRECISION) | (set(_TRUE_PRECISION) if name == "precision" else set()))
            raise ValueError(f"Trainer({name}={value!r}) is not supported. Use one of {choices}.")
        values.append((name, value, Precision.from_mixed_precision(_PRECISION[key])))
    # mixed_precision cannot name a true precision: it agrees with one when it says "no" (what the engine does).
    if len(values) == 2 and values[0][2].mixed_precision != values[1][2].mixed_precision:
        raise ValueError(f"Trainer(mixed_precision={mixed_precision!r}, precision={precision!r}) disagree: pass only "
                         "one of them.")
    return values[-1][2] if values else None


def parse_max_time(value: Any) -> float | None:
    """``max_time`` in seconds from a ``"DD:HH:MM:SS"`` string, a ``timedelta``, a dict of timedelta keywords or
    a number of seconds.

    Example:
        >>> parse_max_time("00:01:30:00"), parse_max_time({"minutes": 2}), parse_max_time(5)
        (5400.0, 120.0, 5.0)
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, Mapping):
        try:
            seconds = timedelta(**value).total_seconds()
        except TypeError as error:
            raise ValueError(f"Trainer(max_time={value!r}): the dict must hold timedelta keywords (days, hours, "
                             f"minutes, seconds). {error}") from None
    elif isinstance(value, str):
        parts = value.split(":")
        if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"Trainer(max_time={value!r}) must be 'DD:HH:MM:SS', e.g. '00:12:00:00' for 12 hours.")
        days, hours, minutes, secs = (int(p) for p in parts)
        seconds = timedelta(days=days, hours=hours, minutes=minutes, seconds=secs).total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"Trainer(max_time=...) takes 'DD:HH:MM:SS', a timedelta, a dict or seconds. Received: "
                        f"{value!r}.")
    if seconds <= 0:
        raise ValueError(f"Trainer(max_time={value!r}) must be a positive duration.")
    return seconds


def check_val_check_interval(value: Any) -> Any:
    """An int number of training batches (>= 1), a float fraction of the epoch in (0, 1], or a training time
    (``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of its keywords: see ``val_check_seconds``), kept as given."""
    if is_int(value) and value >= 1:
        return int(value)
    if isinstance(value, float) and 0.0 < value <= 1.0:
        return value
    if isinstance(value, float) and value > 1 and value % 1.0 == 0:
        return int(value)
    if val_check_seconds(value) is not None:
        return value
    raise _invalid_limit("val_check_interval", value, "an int >= 1 (training batches), a float in (0.0, 1.0] (a "
                         "fraction of the epoch) or a time ('DD:HH:MM:SS', a timedelta or a dict such as "
                         "{'minutes': 30})")


def val_check_seconds(value: Any) -> float | None:
    """Seconds of training between validations when ``val_check_interval`` is a time, else None.

    Example:
        >>> val_check_seconds("00:00:05:00"), val_check_seconds({"seconds": 2}), val_check_seconds(0.5)
        (300.0, 2.0, None)
    """
    if not isinstance(value, (str, dict, timedelta)):
        return None
    try:
        seconds = parse_max_time(value)
    except ValueError:
        seconds = None
    if seconds is None or seconds <= 0:
        raise ValueError(f"Trainer(val_check_interval={value!r}) must be a positive time: 'DD:HH:MM:SS', a timedelta "
                         "or a dict of timedelta keywords.")
    return seconds


def check_fast_dev_run(value: Any) -> int:
    """Batches per stage for ``fast_dev_run`` (``True`` is 1, ``False`` / 0 is off)."""
    if isinstance(value, bool):
        return int(value)
    if is_int(value) and value >= 0:
        return int(value)
    from trainer.utilities.exceptions import MisconfigurationException  # a ValueError, as Lightning raises

    raise MisconfigurationException(f"fast_dev_run={value!r} is not a valid configuration. It should be >= 0. "
                                    f"Trainer(fast_dev_run=...) must be a bool or an int >= 0 (batches per stage). "
                                    f"Received: {value!r}.")


def check_gradient_clip(value: Any, algorithm: Any) -> str | None:
    """Check ``gradient_clip_val`` and return ``gradient_clip_algorithm`` lower-cased (Lightning takes ``"Norm"``),
    or None when not given. Lightning's exception types and sentences come first, then what Ember takes.

    Example:
        >>> check_gradient_clip(0.5, "Value"), check_gradient_clip(None, None)
        ('value', None)
    """
    from trainer.utilities.exceptions import MisconfigurationException  # a ValueError, as Lightning raises

    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise TypeError(f"`gradient_clip_val` should be an int or a float. Trainer(gradient_clip_val=...) must be a "
                        f"number >= 0 or None. Received: {value!r}.")
    if value is not None and value < 0:
        raise ValueError(f"Trainer(gradient_clip_val=...) must be a number >= 0 or None. Received: {value!r}.")
    if algorithm is None:
        return None
    choices = ("norm", "value")
    if not isinstance(algorithm, str) or algorithm.lower() not in choices:
        raise MisconfigurationException(f"`gradient_clip_algorithm` {algorithm} is invalid. "
                                        f"Trainer(gradient_clip_algorithm=...) must be one of {choices}. "
                                        f"Received: {algorithm!r}.")
    return algorithm.lower()


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"Trainer({name}=...) must be one of {choices}. Received: {value!r}.")
    return str(value)
