"""Lightning's run-status names (``lightning.pytorch.trainer.states``): ``TrainerFn``, ``TrainerStatus``,
``RunningStage``.

They are ``str`` enums whose values are the strings Ember already uses (``trainer.state.stage`` is ``"train"``,
``"sanity_check"``, ``"validate"``, ``"test"``, ``"predict"``, or ``"idle"`` between runs), so both spellings
compare equal: ``trainer.state.stage == RunningStage.TRAINING`` and ``trainer.state.stage == "train"``.
``trainer.state.fn`` (the entry point running or last run) and ``trainer.state.status`` are kept by the Trainer
next to the counters of ``TrainState``, but are not part of a checkpoint: they describe this process's call, not
the resume position.

Example:
    >>> RunningStage.TRAINING == "train", TrainerFn("fit") is TrainerFn.FITTING
    (True, True)
    >>> TrainerStatus.INTERRUPTED.stopped, RunningStage.SANITY_CHECKING.dataloader_prefix
    (True, 'val')
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class LightningEnum(str, Enum):
    """A ``str`` enum compared case-insensitively with plain strings (``TrainerFn.FITTING == "FIT"``)."""

    @classmethod
    def from_str(cls, value: str) -> LightningEnum:
        """The member whose name or value is ``value`` (any case); ``ValueError`` naming the choices otherwise."""
        for member in cls:
            if value.lower() in (member.value.lower(), member.name.lower()):
                return member
        raise ValueError(f"{cls.__name__} has no member {value!r}. Choose one of {[m.value for m in cls]}.")

    def __eq__(self, other: object) -> bool:
        other = other.value if isinstance(other, Enum) else other
        return isinstance(other, str) and self.value.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.value.lower())

    def __str__(self) -> str:
        return self.value


class TrainerFn(LightningEnum):
    """The Trainer entry point running (or last run): ``trainer.state.fn``."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class TrainerStatus(LightningEnum):
    """How the Trainer's last call went: ``trainer.state.status``."""

    INITIALIZING = "initializing"  # built, nothing run yet
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"  # ended by an exception (KeyboardInterrupt, a preemption, an error)

    @property
    def stopped(self) -> bool:
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class RunningStage(LightningEnum):
    """The loop running inside an entry point: ``trainer.state.stage`` (fit runs sanity check, train, validate)."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @classmethod
    def of(cls, fn: str) -> RunningStage:
        """The stage an entry point starts in (``"fit"``: training), set before its ``setup`` hooks, as Lightning.

        >>> RunningStage.of("fit").value, RunningStage.of("test").value
        ('train', 'test')
        """
        return cls.TRAINING if fn == "fit" else cls(fn)

    @property
    def dataloader_prefix(self) -> str:
        """The prefix of the loader hooks of this stage (``val_dataloader`` for validation and sanity check)."""
        if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING):
            return "val"
        return self.value


@dataclass
class TrainerState:
    """Lightning's ``TrainerState``: ``status``, ``fn`` and ``stage`` of a run. It compares equal to a trainer's
    ``trainer.state`` holding the same three (Ember's stage ``"idle"`` between runs is Lightning's ``None``).

    Example:
        >>> TrainerState() == TrainerState(status=TrainerStatus.INITIALIZING, fn=None, stage=None)
        True
        >>> TrainerState(status=TrainerStatus.FINISHED).finished
        True
    """

    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        return self.status.stopped

    def __eq__(self, other: object) -> bool:
        if not all(hasattr(other, name) for name in ("status", "fn", "stage")):
            return NotImplemented
        theirs: Any = other
        stage = None if theirs.stage == "idle" else theirs.stage
        return (self.status, self.fn, self.stage) == (theirs.status, theirs.fn, stage)

    # Unhashable (mutable, as Lightning's dataclass): defining __eq__ leaves __hash__ None, and @dataclass keeps it.


__all__ = ["LightningEnum", "RunningStage", "TrainerFn", "TrainerState", "TrainerStatus"]
