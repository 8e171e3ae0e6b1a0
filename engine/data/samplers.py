"""Samplers that shard, reseed and skip batches of indices (ENGINE.md section 3).

Everything here works on *indices*: skipping never fetches a sample. ``iter_batches_from(batch_sampler, n)``
is the one entry point for "start this epoch's batches at batch ``n``"; it skips a torch ``BatchSampler`` by
consuming its sampler's indices and our own batch samplers by jumping over whole rounds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler

__all__ = ["BatchSamplerShard", "IterableDatasetShard", "SeedableRandomSampler", "SkipBatchSampler",
           "iter_batches_from"]


def _consume(iterator: Iterator[Any], n: int) -> None:
    """Advance ``iterator`` by ``n`` items (fewer if it ends) at C speed."""
    if n > 0:
        next(itertools.islice(iterator, n, n), None)


class _IndexCursor:
    """Batches of a torch ``BatchSampler``, able to skip batches by consuming sampler indices only.

    A ``BatchSampler`` groups consecutive indices of its sampler, so skipping ``n`` batches is skipping
    ``n * batch_size`` indices: no per-batch list is built for the skipped part.
    """

    def __init__(self, batch_sampler: BatchSampler) -> None:
        self._indices = iter(batch_sampler.sampler)
        self._size = batch_sampler.batch_size
        self._drop_last = batch_sampler.drop_last

    def skip(self, n: int) -> None:
        _consume(self._indices, n * self._size)

    def __iter__(self) -> _IndexCursor:
        return self

    def __next__(self) -> list[int]:
        batch = list(itertools.islice(self._indices, self._size))
        if not batch or (self._drop_last and len(batch) < self._size):
            raise StopIteration
        return batch


class _LazyCursor:
    """Batches from ``factory(start)``; skips requested before the first batch become the ``start``."""

    def __init__(self, factory: Callable[[int], Iterator[Any]]) -> None:
        self._factory = factory
        self._start = 0
        self._it: Iterator[Any] | None = None

    def skip(self, n: int) -> None:
        if self._it is None:
            self._start += n
        else:
            _consume(self._it, n)

    def __iter__(self) -> _LazyCursor:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._it = self._factory(self._start)
        return next(self._it)


def batch_cursor(batch_sampler: Iterable[Any]) -> _IndexCursor | _LazyCursor:
    """An iterator over ``batch_sampler``'s batches with a cheap ``skip(n)``."""
    iter_from = getattr(batch_sampler, "_iter_from", None)
    if iter_from is not None:  # our own samplers know how to start mid-epoch
        return _LazyCursor(iter_from)
    # Exact type only: a subclass may override __iter__, and then only its own batches are trustworthy.
    if type(batch_sampler) is BatchSampler:
        return _IndexCursor(batch_sampler)
    return _LazyCursor(lambda start: itertools.islice(iter(batch_sampler), start, None))


def iter_batches_from(batch_sampler: Iterable[Any], start: int) -> Iterator[Any]:
    """The batches of ``batch_sampler`` from batch number ``start`` on, skipping at the index level.

    The sampler is still iterated from the beginning (so random draws happen exactly as in a full epoch), but
    skipped batches are never materialised where the sampler allows it.

    >>> list(iter_batches_from(BatchSampler(range(10), 3, drop_last=False), 2))
    [[6, 7, 8], [9]]
    """
    if start == 0:
        return iter(batch_sampler)
    cursor = batch_cursor(batch_sampler)
    cursor.skip(start)
    return cursor


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose permutation depends only on ``initial_seed + epoch``.

    Each ``__iter__`` reseeds its own generator with ``initial_seed + epoch``, yields a permutation, then
    advances ``epoch``; ``set_epoch(e)`` replays epoch ``e`` exactly. Nothing is drawn from the global RNG.

    >>> s = SeedableRandomSampler(range(5), data_seed=7)
    >>> first = list(s); s.set_epoch(0); first == list(s)
    True
    """

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: torch.Generator | None = None, data_seed: int | None = None) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples,
                         generator=generator if generator is not None else torch.Generator())
        # `data_seed=0` is a valid seed; only None falls back to the seed the run was started with.
        self.initial_seed = int(data_seed) if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        assert self.generator is not None
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)



def _set_sampler(batch_sampler: Any, sampler: Any) -> None:
    """Give the wrapped batch sampler (any object: the user's) a new ``sampler``, as Accelerate's wrappers do."""
    batch_sampler.sampler = sampler


def length_of(sampler: object) -> int:
    """``len(sampler)``, with len()'s ``TypeError`` for a sampler without a length (some callers allow that)."""
    if not isinstance(sampler, Sized):
        raise TypeError(f"object of type '{type(sampler).__name__}' has no len()")
    return len(sampler)

class BatchSamplerShard(BatchSampler):
    """The share of ``batch_sampler``'s batches that belongs to one process (ENGINE.md section 3).

    Without ``split_batches`` global batch ``i`` goes to process ``i % num_processes``; with it, every batch is
    cut into ``num_processes`` contiguous slices. With ``even_batches`` (and ``drop_last=False``) the last round
    is completed with indices from the start, so every process gets the same number of full batches.

    >>> [list(BatchSamplerShard(BatchSampler(range(8), 2, False), 2, r)) for r in (0, 1)]
    [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    """

    # BatchSampler.__init__ is not called on purpose: it insists on an int batch size, while a variable-size
    # batch sampler (batch_size=None) is a supported input here. The attributes it would set are set below.
    def __init__(self, batch_sampler: Iterable[list[int]], num_processes: int = 1, process_index: int = 0,
                 split_batches: bool = False, even_batches: bool = True) -> None:
        if num_processes < 1 or not 0 <= process_index < num_processes:
            raise ValueError(f"BatchSamplerShard needs 0 <= process_index < num_processes, got process_index="
                             f"{process_index}, num_processes={num_processes}.")
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        # None for a variable-size batch sampler (see SkipBatchSampler.batch_size).
        self.batch_size: int | None = getattr(  # type: ignore[assignment]  # torch's stub: int only
            batch_sampler, "batch_size", None)
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        if split_batches:
            if self.batch_size is None:
                raise ValueError("split_batches=True needs a batch sampler with a fixed `batch_size`, got a "
                                 f"{type(batch_sampler).__name__} without one: use split_batches=False.")
            if self.batch_size % num_processes != 0:
                raise ValueError(_split_error(self.batch_size, num_processes))

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @sampler.setter
    def sampler(self, sampler: Any) -> None:
        _set_sampler(self.batch_sampler, sampler)

    def __len__(self) -> int:
        length = length_of(self.batch_sampler)
        if self.split_batches:
            return length  # over-reports for ranks that get an empty slice with even_batches=False (as Accelerate)
        rounds, extra = divmod(length, self.num_processes)
        if extra == 0 or self.drop_last:
            return rounds
        if self.even_batches or self.process_index < extra:
            return rounds + 1
        return rounds

    def real_count(self, batch_number: int) -> int | None:
        """How many samples of this process's batch ``batch_number`` are not padding; ``None``: all of them.

        ``even_batches`` completes the last round with samples from the start of the dataset; an exact
        evaluation drops those repeats (the Trainer trims them off before the step). Known for a plain
        ``torch.utils.data.BatchSampler`` (consecutive full batches, then the short last one); for any other
        batch sampler only whole padding batches are recognised.

        >>> shard = BatchSamplerShard(BatchSampler(range(5), 2, False), 2, 1)
        >>> list(shard), [shard.real_count(j) for j in range(2)]
        ([[2, 3], [1, 2]], [None, 0])
        """
        if not self.even_batches or self.drop_last:
            return None
        procs, rank = self.num_processes, self.process_index
        number = batch_number if self.split_batches else batch_number * procs + rank  # its global batch number
        if type(self.batch_sampler) is BatchSampler and self.batch_size is not None:
            total, size = length_of(self.batch_sampler.sampler), self.batch_size
            if self.split_batches:
                per = size // procs
                real = min(per, max(0, total - number * size - rank * per))
                return None if real == per else real
            real = min(size, max(0, total - number * size))
            return None if real == size else real
        try:
            batches = length_of(self.batch_sampler)
        except TypeError:
            return None
        return 0 if number >= batches else None

    def __iter__(self) -> Iterator[list[int]]:
        return self._iter_from(0)

    def _iter_from(self, start: int) -> Iterator[list[int]]:
        """This process's batches from its batch number ``start`` on."""
        return self._iter_split(start) if self.split_batches else self._iter_whole(start)

    # -- split: every process gets a slice of every batch ------------------------------------------------------
    def _iter_split(self, start: int) -> Iterator[list[int]]:
        assert self.batch_size is not None
        size, per = self.batch_size, self.batch_size // self.num_processes
        lo, hi = self.process_index * per, (self.process_index + 1) * per
        cursor = batch_cursor(self.batch_sampler)
        first = next(cursor, None)
        if first is None:
            return
        cursor.skip(max(0, start - 1))  # the first batch is kept: the last one may be padded from it
        to_drop = min(start, 1)
        for batch in itertools.chain([first], cursor):
            if len(batch) < size:  # only the last batch can be short
                if self.even_batches:
                    padded = list(batch)
                    while len(padded) < size:
                        padded += first
                    batch = padded
                elif not batch[lo:hi]:
                    continue
            if to_drop:
                to_drop -= 1
                continue
            yield batch[lo:hi]

    # -- whole batches, dealt round-robin --------------------------------------------------------------------
    def _rounds_to_jump(self, start: int) -> int:
        """Rounds after the first that can be skipped unseen: complete, and none holding the (maybe short) last batch."""
        if start <= 1:
            return 0
        try:
            length = length_of(self.batch_sampler)
        except TypeError:
            return 0
        return max(0, min(start, (length - 1) // self.num_processes) - 1)

    def _iter_whole(self, start: int) -> Iterator[list[int]]:
        procs, rank, size = self.num_processes, self.process_index, self.batch_size
        cursor = batch_cursor(self.batch_sampler)
        jump = self._rounds_to_jump(start)
        to_drop = start
        initial: list[list[int]] = []  # the first round, reused to pad the last one
        mine: list[int] | None = None
        last: list[int] = []
        idx = -1
        for batch in cursor:
            idx += 1
            if idx < procs:
                initial.append(batch)
            if idx % procs == rank:
                mine = batch
            last = batch
            # A round is handed out only once it is complete and its last batch is full, so every process
            # gets a full batch in every round.
            if idx % procs == procs - 1 and (size is None or len(batch) == size):
                if to_drop:
                    to_drop -= 1
                else:
                    assert mine is not None  # this round's batch number `rank` was seen: rank < procs
                    yield mine
                mine = None
                if idx == procs - 1 and jump:
                    cursor.skip(jump * procs)
                    idx += jump * procs
                    to_drop -= jump
        if self.drop_last or idx < 0:
            return
        for batch in self._last_round(idx, last, mine, initial):
            if to_drop:
                to_drop -= 1
            else:
                yield batch

    def _last_round(self, idx: int, last: list[int], mine: list[int] | None,
                    initial: list[list[int]]) -> list[list[int]]:
        """This process's batches of the unfinished last round (``idx`` is the last batch's number)."""
        procs, rank, size = self.num_processes, self.process_index, self.batch_size
        if not self.even_batches:
            return [mine] if mine else []
        out: list[list[int]] = []
        if size is None:
            # Variable-size batches: whole batches are the unit; missing ones are the first batches again.
            if mine:
                out.append(mine)
            for k, pos in enumerate(range(idx + 1, procs * math.ceil((idx + 1) / procs))):
                if pos % procs == rank:
                    out.append(initial[k % len(initial)])
            return out
        if mine is not None and len(mine) == size:
            out.append(mine)
        pool = [i for batch in initial for i in batch]
        while len(pool) < procs * size:  # a dataset smaller than one round: repeat it
            pool += pool
        # Top up the short last batch (if any), then make full batches until the round is complete.
        batch, pos = (list(last), idx) if len(last) < size else ([], idx + 1)
        taken = 0
        while pos % procs != 0 or batch:
            need = size - len(batch)
            batch += pool[taken:taken + need]
            taken += need
            if pos % procs == rank:
                out.append(batch)
            batch, pos = [], pos + 1
        return out


def _split_error(batch_size: int, num_processes: int) -> str:
    return (f"split_batches=True needs a batch size that is a multiple of the number of processes, got "
            f"batch_size={batch_size} and num_processes={num_processes}: use a batch size of "
            f"{num_processes * max(1, math.ceil(batch_size / num_processes))} (or another multiple of "
            f"{num_processes}), or split_batches=False.")


class SkipBatchSampler(BatchSampler):
    """``batch_sampler`` without its first ``skip_batches`` batches (skipped at the index level).

    ``batch_size`` and ``drop_last`` are those of the wrapped sampler, so a loader built on it still knows how
    many samples the last batch padded (``remainder``).

    >>> list(SkipBatchSampler(BatchSampler(range(6), 2, False), 2))
    [[4, 5]]
    """

    # No BatchSampler.__init__: this wraps a batch sampler rather than a sampler (see BatchSamplerShard).
    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int = 0) -> None:
        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}.")
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    @property
    def batch_size(self) -> int | None:  # type: ignore[override]  # torch says int; a variable-size sampler's is None
        return getattr(self.batch_sampler, "batch_size", None)

    @property
    def drop_last(self) -> bool:  # type: ignore[override]  # read-only: the wrapped sampler's (torch: an attribute)
        return bool(getattr(self.batch_sampler, "drop_last", False))

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @sampler.setter
    def sampler(self, sampler: Any) -> None:
        _set_sampler(self.batch_sampler, sampler)

    @property
    def total_length(self) -> int:
        return length_of(self.batch_sampler)

    def __len__(self) -> int:
        return max(0, length_of(self.batch_sampler) - self.skip_batches)

    def __iter__(self) -> Iterator[list[int]]:
        return iter_batches_from(self.batch_sampler, self.skip_batches)

    def _iter_from(self, start: int) -> Iterator[list[int]]:
        return iter_batches_from(self.batch_sampler, self.skip_batches + start)


class IterableDatasetShard(IterableDataset):
    """The share of an iterable dataset's samples that belongs to one process.

    Samples are buffered in "real batches" of ``batch_size * num_processes`` (or ``batch_size`` with
    ``split_batches``); each process takes its contiguous slice. Unless ``drop_last``, a short last buffer is
    padded with the first full one (or with itself).

    >>> list(IterableDatasetShard(range(10), batch_size=2, num_processes=2, process_index=1))
    [2, 3, 6, 7, 0, 1]
    """

    def __init__(self, dataset: Iterable[Any], batch_size: int = 1, drop_last: bool = False,
                 num_processes: int = 1, process_index: int = 0, split_batches: bool = False) -> None:
        if split_batches and batch_size % num_processes != 0:
            raise ValueError(_split_error(batch_size, num_processes))
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    @property
    def _real_batch_size(self) -> int:
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def _process_batch_size(self) -> int:
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    @property
    def total_length(self) -> int:
        return length_of(self.dataset)

    def __len__(self) -> int:
        rounds = length_of(self.dataset) / self._real_batch_size
        return (math.floor(rounds) if self.drop_last else math.ceil(rounds)) * self._process_batch_size

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)
        real, per = self._real_batch_size, self._process_batch_size
        lo, hi = self.process_index * per, (self.process_index + 1) * per
        first: list[Any] | None = None
        buffer: list[Any] = []
        for item in self.dataset:
            buffer.append(item)
            if len(buffer) == real:
                yield from buffer[lo:hi]
                if first is None:
                    first = buffer
                buffer = []
        if buffer and not self.drop_last:
            pad = first if first is not None else list(buffer)
            while len(buffer) < real:
                buffer += pad
            yield from buffer[lo:hi]
