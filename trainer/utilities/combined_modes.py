"""How ``CombinedLoader`` walks its iterables in each mode: one small iterator class per mode.

Each yields ``(batches, batch_idx, dataloader_idx)``: ``batches`` is a list with one item per iterable (the
loader puts it back in the shape it was given), except in ``"sequential"`` mode, where each item is one iterable's
batch on its own. ``limits`` (optional, one per iterable) shorten ``len()``; only ``"sequential"`` also stops
each iterable at its limit while iterating (the trainer cuts the other modes at ``len()`` itself), as in Lightning.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any

Item = tuple[Any, int, int]  # batch(es), batch_idx, dataloader_idx


def sized_len(iterable: Any) -> int | float:
    """``len(iterable)``, or ``inf`` for an iterable without a length (an iterable dataset)."""
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return float("inf")


class ModeIterator(Iterator[Item]):
    """What the modes share: the iterables, their iterators, the running batch index and the limits."""

    @staticmethod
    def combine(lengths: list[int | float]) -> int | float:
        """How the iterables' lengths (none empty) make the combined length: the longest."""
        return max(lengths)

    def __init__(self, iterables: list[Iterable[Any]], limits: list[int | float] | None = None) -> None:
        if limits is not None and len(limits) != len(iterables):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of iterables "
                             f"({len(iterables)}): give one limit per iterable.")
        self.iterables = iterables
        self.limits = limits
        self.iterators: list[Iterator[Any]] = []
        self.index = 0

    def start(self) -> ModeIterator:
        self.iterators = [iter(iterable) for iterable in self.iterables]
        self.index = 0
        return self

    def __iter__(self) -> ModeIterator:
        return self

    @abstractmethod
    def __next__(self) -> Item:
        """The next ``(batches, batch_idx, dataloader_idx)``: each mode's own walk (the class cannot be built)."""

    def lengths(self) -> list[int | float]:
        lengths = [sized_len(iterable) for iterable in self.iterables]
        if self.limits is None:
            return lengths
        return [min(length, limit) for length, limit in zip(lengths, self.limits)]

    def __len__(self) -> int:
        total = self.combine(self.lengths()) if self.iterables else 0
        if total == float("inf"):
            raise TypeError("The combined length is unknown: an iterable without a length (an iterable dataset) "
                            "decides it. Set limits, or use min_size with a sized iterable.")
        return int(total)

    def _step(self) -> tuple[int, int]:
        item = (self.index, 0)
        self.index += 1
        return item

    def reset(self) -> None:
        self.iterators = []
        self.index = 0


class MinSize(ModeIterator):
    """One batch of every iterable per step; ends with the shortest."""

    @staticmethod
    def combine(lengths: list[int | float]) -> int | float:
        """The shortest."""
        return min(lengths)

    def __next__(self) -> Item:
        batches = [next(iterator) for iterator in self.iterators]
        return (batches, *self._step())


class MaxSizeCycle(ModeIterator):
    """One batch of every iterable per step; an exhausted iterable starts over until every one has ended once."""

    def start(self) -> MaxSizeCycle:
        super().start()
        self.ended = [False] * len(self.iterables)
        return self

    def __next__(self) -> Item:
        batches = []
        for i, iterator in enumerate(self.iterators):
            try:
                batches.append(next(iterator))
            except StopIteration:
                self.ended[i] = True
                if all(self.ended):
                    raise
                self.iterators[i] = iter(self.iterables[i])
                batches.append(next(self.iterators[i]))
        return (batches, *self._step())


class MaxSize(ModeIterator):
    """One batch of every iterable per step, ``None`` for those already exhausted; ends with the longest."""

    def __next__(self) -> Item:
        batches: list[Any] = []
        for iterator in self.iterators:
            batches.append(next(iterator, _END))
        if all(batch is _END for batch in batches):
            raise StopIteration
        return ([None if batch is _END else batch for batch in batches], *self._step())


class Sequential(ModeIterator):
    """Every batch of the first iterable, then of the second, ...: ``batch_idx`` restarts at 0 for each and
    ``dataloader_idx`` says which one. Only one iterator is open at a time (one set of worker processes)."""

    @staticmethod
    def combine(lengths: list[int | float]) -> int | float:
        """All of them, one after the other."""
        return sum(lengths)

    def start(self) -> Sequential:
        self.current = 0
        self.index = 0
        self.iterators = [iter(self.iterables[0])] if self.iterables else []
        return self

    def __next__(self) -> Item:
        while self.current < len(self.iterables):
            limit = self.limits[self.current] if self.limits is not None else None
            if limit is None or self.index < limit:
                batch = next(self.iterators[0], _END)
                if batch is not _END:
                    item = (batch, self.index, self.current)
                    self.index += 1
                    return item
            self._advance()
        raise StopIteration

    def _advance(self) -> None:
        self.current += 1
        self.index = 0
        self.iterators = [iter(self.iterables[self.current])] if self.current < len(self.iterables) else []

    def reset(self) -> None:
        super().reset()
        self.current = 0


_END = object()

MODES: dict[str, type[ModeIterator]] = {"min_size": MinSize, "max_size_cycle": MaxSizeCycle, "max_size": MaxSize,
                                        "sequential": Sequential}
