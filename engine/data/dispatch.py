"""DataLoaderDispatcher: process 0 reads the data, every process receives its slice (ENGINE.md 2.4)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from engine.data.lookahead import ahead_snapshots, collate_again
from engine.data.samplers import _consume
from engine.data.state import _PreparedLoader
from engine.operations import (
    broadcast,
    broadcast_object_list,
    concatenate,
    find_batch_size,
    recursively_apply,
    send_to_device,
)
from engine.state import PartialState


@dataclass(frozen=True)
class _Spec:
    """Shape and dtype of one tensor of a dispatched batch (what the receiving processes allocate)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class _Failure:
    """Sent instead of a batch when process 0 could not read one, so the others raise instead of waiting."""

    message: str


def _describe(batch: Any) -> Any:
    def describe(t: torch.Tensor) -> _Spec:
        return _Spec(tuple(t.shape), t.dtype)

    try:
        return recursively_apply(describe, batch, error_on_other_type=True)
    except TypeError as error:
        raise TypeError(f"dispatch_batches=True can only send tensors (in lists, tuples or dicts) from process 0; "
                        f"this batch holds something else ({error}). Return tensors from collate_fn, or use "
                        "dispatch_batches=False.") from None


def _allocate(skeleton: Any, device: torch.device | None) -> Any:
    return recursively_apply(lambda s: torch.empty(s.shape, dtype=s.dtype, device=device), skeleton,
                             test_type=lambda x: isinstance(x, _Spec))


def _rows(data: Any, count: int) -> Any:
    """The first ``count`` rows of every tensor, repeating the rows that exist when there are fewer."""
    while (size := find_batch_size(data)) is not None and size < count:
        data = concatenate([data, data])
    return recursively_apply(lambda t: t[:count], data)


def slice_tensors(data: Any, tensor_slice: slice, process_index: int | None = None,
                  num_processes: int | None = None) -> Any:
    """``tensor[tensor_slice]`` for every tensor of a nested batch (the default ``slice_fn_for_dispatch``)."""
    return recursively_apply(lambda t: t[tensor_slice], data)


class DataLoaderDispatcher(_PreparedLoader):
    """A DataLoader that iterates on process 0 only and sends each process its slice of every batch.

    Per step process 0 reads one batch (``split_batches``) or ``num_processes`` batches concatenated, and every
    process takes rows ``[r*b, (r+1)*b)``. A last step that does not divide evenly is padded with rows from the
    start of the epoch's first batch (unless ``drop_last``); ``remainder`` then says how many rows are real.
    """

    def __init__(self, dataset: Any, split_batches: bool = False, skip_batches: int = 0, _drop_last: bool = False,
                 _non_blocking: bool = False, slice_fn: Callable[..., Any] | None = None,
                 device: torch.device | None = None, rng_types: list[str] | None = None,
                 synchronized_generator: torch.Generator | None = None, _seed: int | None = None,
                 **kwargs: Any) -> None:
        # Only process 0 fetches, so worker seeds use rank 0 whatever the process.
        super().__init__(dataset, device=device, rng_types=rng_types, synchronized_generator=synchronized_generator,
                         skip_batches=skip_batches, _drop_last=_drop_last, _non_blocking=_non_blocking, _seed=_seed,
                         _process_index=0, **kwargs)
        self.split_batches = split_batches
        self.slice_fn = slice_fn if slice_fn is not None else slice_tensors
        self.state = PartialState()
        if self.device is None:
            self.device = self.state.device
        self._snapshot: Callable[[], Any] | None = None  # this pass's look-ahead RNG snapshots (process 0)

    def _reads_sampler(self) -> bool:
        return self.state.process_index == 0

    @property
    def _per_step(self) -> int:
        return 1 if self.split_batches else self.state.num_processes

    @property
    def total_batch_size(self) -> int | None:
        size = getattr(self._batch_sampler_like(), "batch_size", None)
        if size is None:
            return None
        return size if self.split_batches else size * self.state.num_processes

    def __len__(self) -> int:
        raw = DataLoader.__len__(self)
        procs = self.state.num_processes
        steps = raw if self.split_batches else (raw // procs if self._drop_last else math.ceil(raw / procs))
        return max(0, steps - self.skip_batches)

    def _open(self, start: int, replay: dict[str, torch.Tensor] | None) -> tuple[Iterator[Any], Any, Any]:
        """Process 0: the raw batches after the resume point, the padding rows when the epoch's start is skipped,
        and the first step to send (None: the epoch is over).

        Reading a pass that continues a restored epoch (``replay`` not None) leaves the restored random stream as
        it is: the epoch's first step and the first step to send are collated under the states the interrupted
        run collated them under, where those were saved (engine/data/lookahead.py).
        """
        skip = (self.skip_batches + start) * self._per_step
        if not self._is_iterable:
            # Index-level skip, keeping the epoch's first step: the last step is padded with its rows.
            self._control.start = skip
            self._control.keep_first = self._per_step if skip else 0
        raw = self._start_workers()
        self._control.start = self._control.keep_first = 0
        first = None
        if skip:
            def head() -> list[Any]:
                return list(itertools.islice(raw, self._per_step))

            if replay is not None:
                read = collate_again(replay.get("first"), head)
            else:
                if self._snapshot is not None:
                    self._first_rng = self._snapshot()
                read = head()
            if read:
                first = _rows(read[0] if len(read) == 1 else concatenate(read), self.state.num_processes)
            if self._is_iterable:  # an iterable dataset cannot skip without reading
                if replay is not None:
                    collate_again(None, lambda: _consume(raw, skip - len(read)))
                else:
                    _consume(raw, skip - len(read))
        if replay is not None and "ahead" in replay:
            current = collate_again(replay["ahead"], lambda: self._next_step(raw))
        else:
            if not skip and self._snapshot is not None:
                self._first_rng = self._snapshot()
            current = self._next_step(raw)
        return raw, first, current

    def _next_step(self, raw: Iterator[Any]) -> Any:
        parts = list(itertools.islice(raw, self._per_step))
        if not parts or (self._drop_last and len(parts) < self._per_step):
            return None
        batch = parts[0] if len(parts) == 1 else concatenate(parts)
        return send_to_device(batch, self.device, non_blocking=self._non_blocking)

    def _fail(self, error: Exception) -> None:
        """Process 0: tell the waiting processes that reading failed (the caller then re-raises)."""
        if self.state.use_distributed:
            broadcast_object_list([_Failure(f"{type(error).__name__}: {error}")])

    def _share(self, batch: Any, is_last: bool, first: Any) -> tuple[Any, int, bool] | None:
        """Send process 0's step to everyone (padded to a multiple of the process count); None at the end."""
        procs, main = self.state.num_processes, self.state.process_index == 0
        meta: Any = None
        if main and batch is not None:
            observed = find_batch_size(batch) or 0
            short = observed % procs
            if short and not self._drop_last:
                batch = concatenate([batch, _rows(first, procs - short)])
            meta = (_describe(batch), observed, is_last)
        if self.state.use_distributed:
            meta = broadcast_object_list([meta])[0]
            if isinstance(meta, _Failure):
                raise RuntimeError(f"Process 0 failed to read the next batch of a DataLoaderDispatcher: {meta.message}")
            if meta is None:
                return None
            if not main:
                batch = _allocate(meta[0], self.device)
            broadcast(batch)
        elif meta is None:
            return None
        return batch, meta[1], meta[2]

    def _main_reads(self, read: Callable[[], Any]) -> Any:
        """Process 0: ``read()``, telling the waiting processes if it fails (they would wait forever)."""
        try:
            return read()
        except RuntimeError as error:
            stuck = self._worker_timeout_error(error)
            self._fail(stuck or error)
            if stuck is None:
                raise
            raise stuck from None  # DataLoader's own traceback says only "timed out"
        except Exception as error:
            self._fail(error)
            raise

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator; torch's stub names its own class
        start, replay = self._start_pass(0)
        self._pass = token = object()
        procs, rank = self.state.num_processes, self.state.process_index
        self._snapshot = ahead_snapshots(self, self.dataset) if rank == 0 else None
        attrs = self.__dict__  # per-step fields written past DataLoader.__setattr__ (~1.5 us each)
        try:
            raw: Iterator[Any] = iter(())
            first, current = None, None
            if rank == 0:
                raw, first, current = self._main_reads(lambda: self._open(start, replay))
                if first is None and current is not None:
                    first = _rows(current, procs)
            while True:
                # Process 0 reads one step ahead (as Accelerate's dispatcher) so that every process learns which
                # step is the last; the state it reads it under is kept for a checkpoint taken meanwhile.
                if current is not None and self._snapshot is not None:
                    attrs["_ahead_rng"] = self._snapshot()
                nxt = self._main_reads(lambda: self._next_step(raw)) if current is not None else None
                if nxt is None:
                    attrs["_ahead_rng"] = None
                shared = self._share(current, nxt is None, first)
                if shared is None:
                    break
                batch, observed, last = shared
                if procs > 1:
                    per = observed // procs + (1 if observed % procs and not self._drop_last else 0)
                    batch = self.slice_fn(batch, slice(rank * per, (rank + 1) * per), process_index=rank,
                                          num_processes=procs)
                if last:
                    self.end_of_dataloader = True
                    self.remainder = observed
                self._batches_yielded += 1
                yield batch
                if last:
                    break
                current = nxt
            self._finish_pass()
        finally:
            if self._pass is token:
                self.end()

    def _skipped(self, num_batches: int) -> DataLoaderDispatcher:
        new = DataLoaderDispatcher(self.dataset, split_batches=self.split_batches,
                                   skip_batches=self.skip_batches + num_batches, _drop_last=self._drop_last,
                                   _non_blocking=self._non_blocking, slice_fn=self.slice_fn, device=self.device,
                                   rng_types=self.rng_types, synchronized_generator=self.synchronized_generator,
                                   _seed=self._seed, **self._batching_kwargs(), **self._dataloader_kwargs())
        self._copy_state_to(new, num_batches)
        return new
