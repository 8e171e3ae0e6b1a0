"""Sharded data loaders with an exact, restorable position (ENGINE.md 2.4 and 3).

``prepare_data_loader`` turns a user's DataLoader into a ``DataLoaderShard`` (each process reads its own share)
or a ``DataLoaderDispatcher`` (process 0 reads, everyone receives). Both are plain ``DataLoader`` subclasses
and both have ``state_dict()`` / ``load_state_dict()``: a loader restored in a fresh process continues with
exactly the batches an uninterrupted run would produce next, skipping at the index level.

>>> import torch
>>> from torch.utils.data import DataLoader
>>> loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=4), num_processes=1, process_index=0)
>>> [b.tolist() for b in loader]
[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from engine.data.dispatch import DataLoaderDispatcher, slice_tensors
from engine.data.lookahead import ahead_snapshots, collate_again
from engine.data.samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    _consume,
    _split_error,
)
from engine.data.state import _draw_loader_seed, _PreparedLoader, _user_worker_init
from engine.data.workers import DEFAULT_WORKER_TIMEOUT_S, check_worker_timeout
from engine.operations import send_to_device
from engine.state import PartialState

__all__ = ["BatchSamplerShard", "DataLoaderDispatcher", "DataLoaderShard", "IterableDatasetShard",
           "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "prepare_data_loader",
           "skip_first_batches", "slice_tensors"]

# The DataLoader settings a prepared loader takes over from the user's loader (the generator is replaced by the
# loader's own: see _PreparedLoader).
_FORWARDED = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
              "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")
_END = object()


class DataLoaderShard(_PreparedLoader):
    """A DataLoader that yields this process's share of the batches, on ``device``, with an exact position.

    It collates one batch ahead, as Accelerate's loader does, so that ``end_of_dataloader`` is True while the last
    batch is being used and random draws in collation come in Accelerate's order (engine/data/lookahead.py says
    how a resumed run gets the look-ahead batch again), registers itself as the GradientState's active loader
    while iterated, and synchronises ``rng_types`` across processes at the start of every epoch.

    Args:
        dataset: the dataset (already sharded, for an iterable one).
        device: where batches are moved; None leaves them where collate_fn put them.
        rng_types: generators to copy from process 0 at each epoch start (``"torch"``, ``"cuda"``, ``"generator"``).
        synchronized_generator: the generator ``"generator"`` refers to.
        skip_batches: batches to skip at the start of every pass.
        **kwargs: DataLoader arguments (``batch_sampler``, ``num_workers``, ...).
    """

    def __init__(self, dataset: Any, device: torch.device | None = None, rng_types: list[str] | None = None,
                 synchronized_generator: torch.Generator | None = None, skip_batches: int = 0,
                 _drop_last: bool = False, _non_blocking: bool = False, _seed: int | None = None,
                 _process_index: int | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, device=device, rng_types=rng_types, synchronized_generator=synchronized_generator,
                         skip_batches=skip_batches, _drop_last=_drop_last, _non_blocking=_non_blocking, _seed=_seed,
                         _process_index=_process_index, **kwargs)

    def begin(self) -> None:
        super().begin()
        self.remainder = self._padded_remainder()

    def __len__(self) -> int:
        return max(0, DataLoader.__len__(self) - self.skip_batches)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator; torch's stub names its own class
        start, replay = self._start_pass(self._rank)
        self._pass = token = object()
        device, non_blocking = self.device, self._non_blocking
        snapshot = ahead_snapshots(self, self.dataset)
        # DataLoader.__setattr__ costs ~1.5 us per assignment: per-batch fields are written to __dict__ directly.
        attrs = self.__dict__
        try:
            if self._is_iterable:
                batches = self._start_workers()
                skip = self.skip_batches + start
                if skip and replay is not None:  # read to the position without shifting the restored stream
                    collate_again(None, lambda: _consume(batches, skip))
                else:
                    _consume(batches, skip)  # an iterable dataset cannot skip without reading
            else:
                self._control.start = self.skip_batches + start
                batches = self._start_workers()
                self._control.start = 0
            if replay is not None and "ahead" in replay:
                # The interrupted run collated this batch before its checkpoint: again, under the same state.
                current = collate_again(replay["ahead"], lambda: next(batches, _END))
            else:
                current = next(batches, _END)
            if current is not _END:
                # In this process, once the first batch is read, the iterator's _next_data gives the same batches
                # as __next__ without its profiler range (which costs more than fetching a small batch, with no
                # profiler running), its yield counter (kept below) and its length warning for iterable datasets
                # (which go through __next__); with a profiler recording, __next__ runs as usual.
                next_data = batches._next_data if self.num_workers == 0 and not self._is_iterable else None
                while True:
                    if device is not None:
                        current = send_to_device(current, device, non_blocking=non_blocking)
                    # Accelerate's order: batch k+1 is collated before batch k is yielded (it is how the end of
                    # the loader is known), so its random draws precede batch k's training step.
                    if snapshot is not None:
                        attrs["_ahead_rng"] = snapshot()
                    try:
                        if next_data is not None and not _profiler_enabled():
                            upcoming = next_data()
                            batches._num_yielded += 1
                        else:
                            upcoming = next(batches)
                    except StopIteration:
                        break
                    attrs["_batches_yielded"] += 1
                    yield current
                    current = upcoming
                attrs["_ahead_rng"] = None
                self.end_of_dataloader = True
                attrs["_batches_yielded"] += 1
                yield current
            self._finish_pass()
        except RuntimeError as error:
            stuck = self._worker_timeout_error(error)
            if stuck is None:
                raise
            raise stuck from None  # DataLoader's own traceback says only "timed out"
        finally:
            # A pass abandoned by `break` ends when its generator is collected; if a newer pass started
            # meanwhile, the loader must stay registered for that one.
            if self._pass is token:
                self.end()

    def _skipped(self, num_batches: int) -> DataLoaderShard:
        # The skip is made at the index level (skip_batches), so batch numbers, and with them the per-batch
        # worker seeds, stay those of the full epoch: the view's batches are the ones the full pass would yield.
        new = DataLoaderShard(self.dataset, device=self.device, rng_types=self.rng_types,
                              synchronized_generator=self.synchronized_generator,
                              skip_batches=self.skip_batches + num_batches, _drop_last=self._drop_last,
                              _non_blocking=self._non_blocking, _seed=self._seed, _process_index=self._rank,
                              **self._batching_kwargs(), **self._dataloader_kwargs())
        self._copy_state_to(new, num_batches)
        return new


_profiler_enabled = torch._C._autograd._profiler_enabled




class SkipDataLoader(DataLoader):
    """A plain DataLoader over an iterable dataset that drops its first ``skip_batches`` batches."""

    def __init__(self, dataset: Any, skip_batches: int = 0, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator; torch's stub names its own class
        batches = super().__iter__()
        _consume(batches, self.skip_batches)
        yield from batches

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)


def _with_sampler(batch_sampler: Any, sampler: Any) -> Any:
    """``batch_sampler`` drawing from ``sampler`` instead, leaving the user's object untouched."""
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    replaced = copy.copy(batch_sampler)
    replaced.sampler = sampler
    return replaced


def prepare_data_loader(dataloader: DataLoader, device: torch.device | None = None, num_processes: int | None = None,
                        process_index: int | None = None, split_batches: bool = False, put_on_device: bool = False,
                        rng_types: list[str] | None = None, dispatch_batches: bool | None = None,
                        even_batches: bool = True, slice_fn_for_dispatch: Callable[..., Any] | None = None,
                        use_seedable_sampler: bool = False, data_seed: int | None = None,
                        non_blocking: bool = False,
                        worker_timeout: float | None = DEFAULT_WORKER_TIMEOUT_S) -> DataLoader:
    """A new loader yielding this process's share of ``dataloader``'s batches (ENGINE.md 2.4).

    The prepared loader owns its random state: a sampler without a generator gets one. When sharding, it is
    seeded from one draw of the global torch RNG made here, as Accelerate does (broadcast from process 0, so
    call it on every process, as ``Accelerator.prepare`` does); otherwise from the global draw Accelerate's
    sampler makes at each epoch start. The global RNG is consumed exactly as Accelerate consumes it.
    ``worker_timeout``: seconds to wait for a loader worker's batch when the loader sets no ``timeout``
    (``DataLoaderConfiguration.worker_timeout``; None: no limit).
    """
    worker_timeout = check_worker_timeout(worker_timeout)
    dataset = dataloader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = put_on_device and is_iterable
    if dispatch_batches and not put_on_device:
        raise ValueError("dispatch_batches=True needs put_on_device=True (process 0 sends every batch to each "
                         "process's device), got put_on_device=False: pass put_on_device=True "
                         "(Accelerator(device_placement=True)), or dispatch_batches=False.")
    if num_processes is None or process_index is None:
        state = PartialState()
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
    batch_sampler_as_sampler = isinstance(dataloader.sampler, BatchSampler)
    batch_sampler: Any = dataloader.sampler if batch_sampler_as_sampler else dataloader.batch_sampler
    batch_size = dataloader.batch_size if dataloader.batch_size is not None else \
        getattr(batch_sampler, "batch_size", None)
    if split_batches and batch_size is not None and batch_size % num_processes != 0:
        raise ValueError(_split_error(batch_size, num_processes))
    sharding = num_processes > 1 and not dispatch_batches
    seed: int | None = None  # None: the loaders fall back to torch.initial_seed() (no draw)
    epoch_seeded: torch.Generator | None = None
    sampler: Any = dataloader.sampler
    synchronized_generator: torch.Generator | None = None

    if isinstance(dataset, IterableDataset):  # is_iterable (spelled out for the type checker)
        if sharding:
            if not split_batches and getattr(dataset, "n_shards", 0) >= num_processes and hasattr(dataset, "shard"):
                dataset = dataset.shard(num_shards=num_processes, index=process_index)  # HF datasets
            else:
                dataset = IterableDatasetShard(dataset, batch_size=batch_size if batch_size is not None else 1,
                                               drop_last=dataloader.drop_last, num_processes=num_processes,
                                               process_index=process_index, split_batches=split_batches)
            generator = getattr(dataloader.dataset, "generator", None)
            synchronized_generator = generator if isinstance(generator, torch.Generator) else None
    else:
        sampler = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else dataloader.sampler
        if use_seedable_sampler and type(sampler) is RandomSampler:
            sampler = SeedableRandomSampler(sampler.data_source, sampler.replacement, sampler._num_samples,
                                            generator=sampler.generator, data_seed=data_seed)
            if batch_sampler is not None:
                batch_sampler = _with_sampler(batch_sampler, sampler)
        elif not use_seedable_sampler and hasattr(sampler, "generator"):
            if sampler.generator is None:
                sampler.generator = torch.Generator()
                if sharding:  # as Accelerate: one global draw, here broadcast so every process shuffles alike
                    seed = _draw_loader_seed(num_processes)
                    sampler.generator.manual_seed(seed)
                else:
                    # Accelerate leaves it unset and the sampler draws a seed from the global RNG every epoch;
                    # the loader makes that same draw at each epoch start into this generator, so the order
                    # matches and is part of the saved position (a resumed run could not reproduce the draw).
                    epoch_seeded = sampler.generator
            if num_processes > 1:
                synchronized_generator = sampler.generator
        if sharding:
            if batch_sampler is None:
                raise ValueError("A DataLoader with batch_size=None and no batch_sampler cannot be sharded across "
                                 f"{num_processes} processes: give it a batch_size or a batch_sampler.")
            batch_sampler = BatchSamplerShard(batch_sampler, num_processes, process_index, split_batches,
                                              even_batches)

    if synchronized_generator is None:
        rng_types = [t for t in (rng_types or []) if str(getattr(t, "value", t)) != "generator"]
    kwargs: dict[str, Any] = {name: getattr(dataloader, name) for name in _FORWARDED if hasattr(dataloader, name)}
    kwargs["worker_init_fn"] = _user_worker_init(kwargs.get("worker_init_fn"))
    if is_iterable:
        per_process = batch_size // num_processes if sharding and split_batches and batch_size else batch_size
        batching: dict[str, Any] = {"batch_size": batch_size if dispatch_batches else per_process,
                                    "drop_last": dataloader.drop_last}
    elif batch_sampler_as_sampler or batch_sampler is None:
        batching = {"sampler": batch_sampler if batch_sampler_as_sampler else sampler, "batch_size": None}
    else:
        batching = {"batch_sampler": batch_sampler}
    common: dict[str, Any] = {"rng_types": rng_types, "synchronized_generator": synchronized_generator,
              "_drop_last": dataloader.drop_last, "_non_blocking": non_blocking, "_seed": seed}
    prepared: _PreparedLoader
    if dispatch_batches:
        prepared = DataLoaderDispatcher(dataset, split_batches=split_batches, slice_fn=slice_fn_for_dispatch,
                                        device=device, **common, **batching, **kwargs)
    else:
        prepared = DataLoaderShard(dataset, device=device if put_on_device else None, _process_index=process_index,
                                   **common, **batching, **kwargs)
        prepared._iterator_seed_source = dataloader.generator  # Accelerate's dispatcher drops it
    prepared._epoch_seeded_generator = epoch_seeded
    prepared._worker_timeout = worker_timeout
    return prepared


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader over the same data that starts ``num_batches`` (per-process) batches later.

    Skipping happens at the index level for map-style datasets. A prepared loader keeps its device, random
    state, epoch and ``remainder`` (so ``gather_for_metrics`` still drops padding); ``len()`` is what it yields.

    >>> [b.tolist() for b in skip_first_batches(DataLoader(list(range(6)), batch_size=2), 2)]
    [[4, 5]]
    """
    if num_batches < 0:
        raise ValueError(f"skip_first_batches needs num_batches >= 0, got {num_batches}.")
    if isinstance(dataloader, _PreparedLoader):
        return dataloader._skipped(num_batches)
    kwargs = {name: getattr(dataloader, name) for name in _FORWARDED if hasattr(dataloader, name)}
    kwargs["generator"] = dataloader.generator
    if isinstance(dataloader.dataset, IterableDataset):
        return SkipDataLoader(dataloader.dataset, skip_batches=num_batches, batch_size=dataloader.batch_size,
                              drop_last=dataloader.drop_last, **kwargs)
    if dataloader.batch_sampler is None:
        return DataLoader(dataloader.dataset, sampler=SkipBatchSampler(dataloader.sampler, num_batches),
                          batch_size=None, **kwargs)
    return DataLoader(dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches),
                      **kwargs)
