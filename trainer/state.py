"""`TrainState`: every counter of a run in one dataclass, saved whole in each checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainer.states import TrainerFn, TrainerStatus

STAGES = ("idle", "train", "sanity_check", "validate", "test", "predict")


@dataclass
class TrainState:
    """Where a run is. The resume position is read from here, never inferred from other objects.

    Attributes:
        stage: what the trainer runs right now: ``"idle"``, ``"train"``, ``"sanity_check"``, ``"validate"``,
            ``"test"`` or ``"predict"`` (``"validate"`` also while fit validates). A running stage reads as
            Lightning's ``RunningStage`` (a ``str`` enum equal to those strings, with ``.value``: the places that
            start a stage set one); a checkpoint holds the plain string (nothing to unpickle).
        epoch: the training epoch in progress (0-based); after an epoch's end hooks it moves to the next one.
        batch_in_epoch: training batches of ``epoch`` already processed (the next one has this index).
        global_step: optimizer steps taken (with gradient accumulation, one per ``accumulate_grad_batches``
            batches; with manual optimisation, one per ``optimizer.step()`` call).
        micro_step: training batches processed since the start of the run, over all epochs.
        samples_seen: training samples processed over all processes (batch size x number of processes per
            batch, so the few samples that even out the last batch across processes are counted too).
        should_stop: set when all processes agreed to stop (through the engine's trigger).
        time_elapsed: seconds spent inside ``fit`` over all runs of this state (``max_time`` counts against it);
            brought up to date at every step when ``max_time`` is set, otherwise at each epoch end.
        stopped_at: ``(epoch, batch_in_epoch)`` where the last ``fit`` stopped inside an epoch (``max_steps``,
            ``max_time``, a stop request), before that epoch's end hooks ran. As in Lightning, ``epoch`` then moves
            on to the next epoch when ``fit`` returns; a checkpoint of this state holds ``stopped_at`` as its position,
            so it continues at the next batch of the stopped epoch, as every checkpoint does (Lightning's would
            start a new epoch). ``None`` otherwise; cleared when ``fit`` starts.
        batch_open: a training batch has been drawn and is not done yet (its counters not moved on): a complete
            checkpoint taken now (after an exception inside the batch) could not continue exactly.
        fn / status: Lightning's ``trainer.state.fn`` (the entry point running or last run, a ``TrainerFn``) and
            ``trainer.state.status`` (a ``TrainerStatus``). They describe this process's call, not the resume
            position, so checkpoints do not hold them (``state_dict`` leaves them out, ``==`` ignores them).

    Example:
        >>> state = TrainState(epoch=2, global_step=40)
        >>> TrainState.from_state_dict(state.state_dict()) == state
        True
    """

    stage: str = "idle"
    epoch: int = 0
    batch_in_epoch: int = 0
    global_step: int = 0
    micro_step: int = 0
    samples_seen: int = 0
    should_stop: bool = False
    time_elapsed: float = 0.0
    stopped_at: tuple[int, int] | None = field(default=None, compare=False, metadata={"saved": False})
    batch_open: bool = field(default=False, compare=False, metadata={"saved": False})
    fn: TrainerFn | None = field(default=None, compare=False, metadata={"saved": False})
    status: TrainerStatus = field(default=TrainerStatus.INITIALIZING, compare=False, metadata={"saved": False})

    # -- the loop's counter arithmetic: one call where each moment happens ------------------------------------------
    def open_batch(self) -> None:
        """A training batch was drawn: until ``finish_batch``, no complete checkpoint of this state exists."""
        self.batch_open = True

    def drop_batch(self) -> None:
        """The drawn batch will not run (``on_train_batch_start`` returned -1): the counters stay where they are."""
        self.batch_open = False

    def finish_batch(self, batch_idx: int, samples: int) -> None:
        """Batch ``batch_idx`` of the epoch ran, on ``samples`` samples over all processes.

        Example:
            >>> state = TrainState()
            >>> state.open_batch(); state.finish_batch(0, samples=8); state.finish_batch(1, samples=8)
            >>> state.batch_in_epoch, state.micro_step, state.samples_seen, state.batch_open
            (2, 2, 16, False)
        """
        self.batch_in_epoch, self.micro_step = batch_idx + 1, self.micro_step + 1
        self.samples_seen += samples
        self.batch_open = False

    def optimizer_stepped(self) -> None:
        """One optimizer step was taken (once per accumulation window; per ``optimizer.step()`` when manual)."""
        self.global_step += 1

    def stop_in_epoch(self, cut: bool) -> None:
        """``fit`` stops after the current batch: ``cut`` when batches of the epoch were left (see ``stopped_at``)."""
        self.stopped_at = (self.epoch, self.batch_in_epoch) if cut else None

    def finish_epoch(self) -> None:
        """The epoch's end hooks ran: the next epoch starts at its first batch."""
        self.epoch += 1
        self.batch_in_epoch = 0

    @property
    def finished(self) -> bool:
        """Whether the last call returned normally (Lightning's ``trainer.state.finished``)."""
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        """Whether the last call ended, normally or by an exception."""
        return self.status.stopped

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every saved field; the position is ``stopped_at`` when fit stopped inside an epoch.

        Example:
            >>> state = TrainState(epoch=1, global_step=6, micro_step=6, stopped_at=(0, 6))
            >>> saved = state.state_dict()
            >>> saved["epoch"], saved["batch_in_epoch"], saved["global_step"]
            (0, 6, 6)
        """
        values = {name: getattr(self, name) for name in _saved_fields()}
        values["stage"] = str(values["stage"])  # the plain string: a .ckpt loads with weights_only=True
        if self.stopped_at is not None:
            values["epoch"], values["batch_in_epoch"] = self.stopped_at
        return values

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Set every saved field from ``state_dict``; unknown or missing keys raise (a checkpoint from another
        version)."""
        names = set(_saved_fields())
        unknown, missing = set(state_dict) - names, names - set(state_dict)
        if unknown or missing:
            raise KeyError(f"TrainState.load_state_dict got unknown keys {sorted(unknown)} and misses "
                           f"{sorted(missing)}: the checkpoint was written by a different version of the trainer.")
        if state_dict["stage"] not in STAGES:
            raise ValueError(f"TrainState stage must be one of {STAGES}. Received: {state_dict['stage']!r}.")
        for name in names:
            setattr(self, name, state_dict[name])

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any]) -> TrainState:
        """A new state holding ``state_dict``."""
        state = cls()
        state.load_state_dict(state_dict)
        return state


def _saved_fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(TrainState) if f.metadata.get("saved", True))
