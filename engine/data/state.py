"""Exact data position for prepared loaders: the resumable index stream, worker seeding, and the shared base.

A prepared loader owns the random state that decides its data: the sampler's generator (its state at the start
of the epoch is saved), a private generator for DataLoader's per-iterator seed, and a seed from which worker
processes derive per-batch seeds. An epoch start makes exactly the global-RNG draws Accelerate's loader makes
there (so an uninterrupted run's random stream matches Accelerate's); a pass restored mid-epoch makes none, so
restoring a loader in a fresh process leaves the global random stream where an uninterrupted run would have it.
"""

from __future__ import annotations

import itertools
import random
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from engine.data.lookahead import as_saved
from engine.data.samplers import SeedableRandomSampler, SkipBatchSampler, batch_cursor, length_of
from engine.data.worker_start import announce_start, guarded_start, keep_random_states
from engine.data.workers import (
    DEFAULT_WORKER_TIMEOUT_S,
    LoaderWorkerTimeout,
    StackTarget,
    WorkerStacks,
    is_worker_timeout,
    register_stack_dump,
    starts_by_fork,
    timeout_error,
    worker_timeout_of,
)
from engine.random import RawRNGState, synchronize_rng_states
from engine.state import GradientState, PartialState

_M64 = (1 << 64) - 1
_LOADER_SALT = 0x6C6F61646572  # separates the DataLoader-seed stream from the worker streams
_WORKER_SALT = 0x776F726B6572


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """A well-mixed 64-bit seed from integers (``derive_seed(seed, epoch, rank, n)``); cheap, no RNG touched."""
    out = 0
    for part in parts:
        out = _splitmix64(out ^ (part & _M64))
    return out


def _seed_process_rngs(seed: int) -> None:
    """Seed torch, ``random`` and numpy of *this* process (only ever called inside DataLoader workers)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)


def _reseed_and_unwrap(indices: Any, seed: int) -> Any:
    _seed_process_rngs(seed)
    return indices


class _SeededIndices:
    """A batch of indices bound for a worker process, with the seed its samples must be drawn with.

    Unpickling happens inside the worker right before it fetches this batch (``index_queue.get()`` then
    ``fetch``), so ``__reduce__`` is the one per-batch hook that runs there without patching DataLoader. It
    reseeds the worker from (seed, epoch, rank, batch number): augmentation then depends on the batch's position
    only, not on which worker fetched it nor on what that worker fetched before, which is what lets a resumed
    run reproduce it without fetching the skipped batches.
    """

    __slots__ = ("indices", "seed")

    def __init__(self, indices: Any, seed: int) -> None:
        self.indices = indices
        self.seed = seed

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, int]]:
        return _reseed_and_unwrap, (self.indices, self.seed)


class _WorkerInit:
    """``worker_init_fn`` wrapper: seeds the worker from (seed, epoch, rank, worker id), makes it write its stacks
    on request (engine/data/workers.py), then runs the user's."""

    def __init__(self, user_fn: Callable[[int], None] | None, seed: int, rank: int) -> None:
        self.user_fn = user_fn
        self.seed = seed
        self.rank = rank
        self.epoch = 0  # set by the loader before it starts workers for an epoch
        self.stacks: StackTarget | None = None  # likewise: where the workers write their stacks when asked
        self.started: tuple[int, int] | None = None  # while forking a pass's workers: the fork guard's pipe
        self._stack_file: Any = None  # in a worker: the open file faulthandler writes to

    def __getstate__(self) -> dict[str, Any]:
        # an open file does not pickle (spawn, forkserver), and the guard's pipe is for forked workers only
        return {**self.__dict__, "_stack_file": None, "started": None}

    def __call__(self, worker_id: int) -> None:
        if self.started is not None:  # first: the rank waits for this (engine/data/worker_start.py)
            announce_start(self.started, worker_id)
            self.started = None
        if self.stacks is not None:
            self._stack_file = register_stack_dump(self.stacks, worker_id)
        _seed_process_rngs(derive_seed(self.seed, self.epoch, self.rank, worker_id, _WORKER_SALT))
        if self.user_fn is not None:
            self.user_fn(worker_id)


def _user_worker_init(fn: Any) -> Callable[[int], None] | None:
    return fn.user_fn if isinstance(fn, _WorkerInit) else fn


class _StreamControl:
    """What the next pass over the index stream must do; set by the loader around ``DataLoader.__iter__``."""

    __slots__ = ("keep_first", "seed_base", "seen", "start")

    def __init__(self) -> None:
        self.start = 0  # batches to skip (index level)
        self.keep_first = 0  # batches from the epoch start to yield before skipping (dispatcher padding)
        self.seed_base: int | None = None  # set: tag batches with per-batch worker seeds
        self.seen: list[Any] | None = None  # set: every index batch drawn in the current pass, in order


class _IndexStream:
    """The loader's ``_index_sampler``: its batch sampler (or sampler) from the position it was told."""

    def __init__(self, source: Iterable[Any], control: _StreamControl) -> None:
        self.source = source
        self.control = control

    def __len__(self) -> int:
        return length_of(self.source)

    def __iter__(self) -> Iterator[Any]:
        # DataLoader may call iter() more than once per pass (the worker iterator does, in __init__ and in
        # _reset) and drop the first: so read the settings now, but draw nothing until the first batch is asked.
        c = self.control
        # chain.from_iterable asks _batches for its iterator on the first draw only, then reads it in C: lazy
        # without a Python generator frame per batch.
        return itertools.chain.from_iterable(self._batches(c.start, c.keep_first, c.seed_base))

    def _batches(self, start: int, keep: int, seed_base: int | None) -> Iterator[Iterator[Any]]:
        """Yields one item: the iterator of this pass's index batches (built when the first one is drawn)."""
        head = 0
        if start == 0:
            batches: Iterator[Any] = iter(self.source)
        else:
            cursor = batch_cursor(self.source)
            first = list(itertools.islice(cursor, min(keep, start)))
            head = len(first)
            cursor.skip(start - head)
            batches = itertools.chain(first, cursor)
        seen = self.control.seen
        if seen is not None:  # a new pass starts drawing: record its batches only (off by default: no cost)
            seen.clear()
            batches = _recorded(batches, seen)
        if seed_base is None:
            yield batches
            return
        numbers = itertools.chain(range(head), itertools.count(start)) if start else itertools.count()
        yield (_SeededIndices(batch, _splitmix64(seed_base + number)) for number, batch in zip(numbers, batches))


def _recorded(batches: Iterator[Any], seen: list[Any]) -> Iterator[Any]:
    for batch in batches:
        seen.append(batch)
        yield batch


def _draw_loader_seed(num_processes: int) -> int:
    """One draw from the global torch RNG (at prepare time), made identical on every rank.

    The broadcast happens only when the loader is sharded across this run's processes, i.e. when every rank
    prepares it (as ``Accelerator.prepare`` does); a loader prepared on one rank alone must not wait for others.
    """
    seed = torch.empty((), dtype=torch.int64).random_()
    state = PartialState()
    if state.use_distributed and num_processes == state.num_processes:
        from engine.operations import broadcast

        seed = broadcast(seed.to(state.device)).cpu()
    return int(seed.item())


class _PreparedLoader(DataLoader):
    """What DataLoaderShard and DataLoaderDispatcher share: epoch, position, random state, GradientState."""

    def __init__(self, dataset: Any, device: torch.device | None = None, rng_types: list[str] | None = None,
                 synchronized_generator: torch.Generator | None = None, skip_batches: int = 0,
                 _drop_last: bool = False, _non_blocking: bool = False, _seed: int | None = None,
                 _process_index: int | None = None, **kwargs: Any) -> None:
        user_init = _user_worker_init(kwargs.pop("worker_init_fn", None))
        super().__init__(dataset, worker_init_fn=user_init, **kwargs)
        self.device = device
        self.rng_types = [str(getattr(t, "value", t)) for t in (rng_types or [])]
        self.synchronized_generator = synchronized_generator
        self.skip_batches = skip_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.iteration = 0
        self.end_of_dataloader = False
        self.remainder = -1
        # Without a seed from prepare, `initial_seed` is deterministic under set_seed and draws nothing.
        self._seed = int(_seed) if _seed is not None else torch.initial_seed()
        self._rank = _process_index if _process_index is not None else PartialState().process_index
        # DataLoader draws a per-iterator seed from `generator` (else from the *global* RNG) every epoch; a private
        # generator reseeded from (seed, epoch) keeps that draw off both the global and the sampler's stream.
        self._iter_generator = torch.Generator()
        self.generator = self._iter_generator
        if self.num_workers > 0:
            self.worker_init_fn = _WorkerInit(user_init, self._seed, self._rank)
        # How long a pass waits for a worker's batch when the user's DataLoader sets no timeout (set by
        # prepare_data_loader), where the workers' stacks go, and the pass's worker iterator, for the error.
        self._worker_timeout: float | None = DEFAULT_WORKER_TIMEOUT_S
        self._worker_stacks = WorkerStacks()
        self._workers_iter: weakref.ReferenceType[Any] | None = None
        self._control = _StreamControl()
        # torch's _index_sampler (its _auto_collation is `batch_sampler is not None`)
        index_sampler = self.batch_sampler if self.batch_sampler is not None else self.sampler
        self._stream = _IndexStream(index_sampler, self._control)
        self._is_iterable = isinstance(dataset, IterableDataset)
        self._pending = 0  # batches of the current epoch already consumed before a restore
        # A restored position is consumed once, by whichever comes first: the next pass over this loader, or a
        # skip_first_batches view of it (Accelerate's resume pattern). `_restored` says it is still unclaimed.
        self._restored = False
        self._resume_first = False  # a view whose first pass continues a restored epoch (no epoch-start draws)
        self._parent: weakref.ReferenceType[_PreparedLoader] | None = None  # the loader this is a skip view of
        self._view_offset = 0  # batches the view starts after its parent's epoch start
        self._active_view: weakref.ReferenceType[_PreparedLoader] | None = None
        self._batches_yielded = 0
        # RNG states from just before the pending look-ahead batch (and, for the dispatcher, the epoch's first
        # step) were collated, while a pass keeps them (engine/data/lookahead.py); `_replay` holds those a
        # checkpoint restored, for the resumed pass to collate those batches again under.
        self._ahead_rng: RawRNGState | torch.Tensor | None = None
        self._first_rng: RawRNGState | torch.Tensor | None = None
        self._replay: dict[str, torch.Tensor] = {}
        self._epoch_active = False
        self._epoch_start_states: list[torch.Tensor] = []
        self._pass: object | None = None
        self._gradient_state = GradientState()
        # Set by prepare_data_loader: where Accelerate's loader draws its per-iterator seed (the user's loader
        # generator, None = the global RNG), and the sampler generator Accelerate would leave unset (reseeded
        # from the global RNG every epoch, as RandomSampler does without one). See _draw_epoch_seeds.
        self._iterator_seed_source: torch.Generator | None = None
        self._epoch_seeded_generator: torch.Generator | None = None

    @property
    def _index_sampler(self) -> Any:
        # DataLoader's iterators read their indices from here; the stream starts at the restored position.
        return self._stream

    # -- Accelerate's DataLoaderStateMixin -------------------------------------------------------------------
    def begin(self) -> None:
        """Reset the end-of-epoch flags and become the GradientState's active loader."""
        self.end_of_dataloader = False
        self.remainder = -1
        self._gradient_state._add_dataloader(self)

    def end(self) -> None:
        """Stop being the GradientState's active loader."""
        self._gradient_state._remove_dataloader(self)

    def record_batch_indices(self, enabled: bool = True) -> list[Any] | None:
        """Record the index batches each following pass draws (Lightning's ``seen_batch_indices``).

        Returns the list that every pass refills from its start, in drawing order (batch ``i`` of the pass is
        item ``i``, also with look-ahead and worker prefetching); ``enabled=False`` stops recording. Used by
        prediction writers to name the dataset indices of each batch. Iterable datasets draw no indices.
        """
        self._control.seen = [] if enabled else None
        return self._control.seen

    # -- sampler access --------------------------------------------------------------------------------------
    def _batch_sampler_like(self) -> Any:
        return self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler

    def get_sampler(self) -> Any:
        """The sampler that orders the samples (inside the batch sampler, if there is one)."""
        holder = self._batch_sampler_like()
        return self.sampler if holder is None else getattr(holder, "sampler", None)

    def set_sampler(self, sampler: Any) -> None:
        """Replace the sampler inside the batch sampler."""
        holder = self._batch_sampler_like()
        if holder is None:
            raise ValueError("set_sampler needs a loader with a batch sampler; this one has batch_size=None: "
                             "build a new DataLoader with the sampler and prepare it instead.")
        holder.sampler = sampler

    def _generators(self) -> list[torch.Generator]:
        """Every generator that decides this loader's order, each once, in a fixed order."""
        holders = [self.get_sampler(), self._batch_sampler_like()]
        if self._is_iterable:  # an iterable dataset's generator decides its order (a map-style one's does not)
            holders += [self.dataset, getattr(self.dataset, "dataset", None)]
        found = [getattr(h, "generator", None) for h in holders] + [self.synchronized_generator]
        out: list[torch.Generator] = []
        for gen in found:
            if isinstance(gen, torch.Generator) and all(gen is not g for g in out):
                out.append(gen)
        return out

    def _seedable_sampler(self) -> SeedableRandomSampler | None:
        sampler = self.get_sampler()
        return sampler if isinstance(sampler, SeedableRandomSampler) else None

    def set_epoch(self, epoch: int) -> None:
        """Set ``iteration`` and forward ``set_epoch`` to the samplers (or, failing that, the dataset)."""
        self.iteration = epoch
        holder = self._batch_sampler_like()
        targets: list[Any] = [self.sampler] if holder is None else []
        while holder is not None:  # batch sampler, its sampler, the batch sampler it wraps, ...
            targets += [holder, getattr(holder, "sampler", None)]
            holder = getattr(holder, "batch_sampler", None)
        targets = [t for i, t in enumerate(targets) if hasattr(t, "set_epoch")
                   and all(t is not u for u in targets[:i])]
        if not targets and hasattr(self.dataset, "set_epoch"):
            targets = [self.dataset]
        for target in targets:
            target.set_epoch(epoch)

    # -- sizes -----------------------------------------------------------------------------------------------
    def unpadded_size(self, batch_number: int) -> int | None:
        """Samples of this process's batch ``batch_number`` (of a pass) that are real, not ``even_batches``
        padding repeated from the dataset's start; ``None`` when all of them are (or it cannot be known: an
        iterable dataset, batches dispatched from process 0)."""
        holder = self._batch_sampler_like()
        real_count = getattr(holder, "real_count", None)
        return real_count(batch_number + self.skip_batches) if callable(real_count) else None

    @property
    def total_batch_size(self) -> int | None:
        """Samples per step across all processes (None for variable-size batch samplers)."""
        holder = self._batch_sampler_like()
        while isinstance(holder, SkipBatchSampler):
            holder = holder.batch_sampler
        size, split, procs = getattr(holder, "batch_size", None), getattr(holder, "split_batches", False), \
            getattr(holder, "num_processes", 1)
        if self._is_iterable and hasattr(self.dataset, "num_processes"):  # IterableDatasetShard
            shard = self.dataset
            size, split, procs = (getattr(shard, name) for name in ("batch_size", "split_batches", "num_processes"))
        if size is None:
            return None
        return size if split else size * procs

    @property
    def total_dataset_length(self) -> int:
        """Samples in the whole dataset (all processes together)."""
        total = getattr(self.dataset, "total_length", None)
        return int(total) if total is not None else length_of(self.dataset)

    def _padded_remainder(self) -> int:
        """Real samples in the last global batch (``-1`` when unknown or nothing is padded: drop_last)."""
        total = self.total_batch_size
        if self._drop_last or not total:
            return -1
        try:
            return self.total_dataset_length % total
        except TypeError:  # an iterable dataset without __len__: documented as unknown
            return -1

    # -- one pass --------------------------------------------------------------------------------------------
    def _start_pass(self, seed_rank: int) -> tuple[int, dict[str, torch.Tensor] | None]:
        """Everything that happens before the first batch of a pass.

        Returns the batches to skip and, for a pass that continues a restored epoch (else None), the RNG states
        batches it reads again were first collated under (``"ahead"``: the first batch it yields; ``"first"``:
        the epoch's first step, which a dispatcher reads again for its padding rows; either may be absent).
        """
        start, self._pending = self._pending, 0
        resuming, self._resume_first, self._restored = start > 0 or self._resume_first, False, False
        replay, self._replay = (self._replay if resuming else None), {}
        self._ahead_rng = None
        self._first_rng = replay.get("first") if replay else None
        self._active_view = None  # a pass of this loader supersedes any view's
        parent = self._parent() if self._parent is not None else None
        if parent is not None:  # the parent's checkpoints report this pass (save_state holds the parent)
            parent._active_view = weakref.ref(self)
        if self.rng_types:
            self._synchronize_rngs(resuming=resuming)
        self.set_epoch(self.iteration)
        if not resuming:
            self._draw_epoch_seeds()
        self._epoch_start_states = [g.get_state() for g in self._generators()]
        self._iter_generator.manual_seed(derive_seed(self._seed, self.iteration, _LOADER_SALT))
        if isinstance(self.worker_init_fn, _WorkerInit):
            self.worker_init_fn.epoch = self.iteration
            self.worker_init_fn.stacks = self._worker_stacks.start_pass(
                self.persistent_workers, self.num_workers, starts_by_fork(self.multiprocessing_context))
            if not self._is_iterable:
                self._control.seed_base = derive_seed(self._seed, self.iteration, seed_rank)
        self._batches_yielded = start
        self._epoch_active = True
        self.begin()
        return start, replay

    def _start_workers(self) -> Any:
        """``DataLoader.__iter__`` for a pass, watched; forked workers are seen to start (the fork guard of
        engine/data/worker_start.py: a worker stuck inside fork is replaced, from the same random states)."""
        init = self.worker_init_fn
        forks = (isinstance(init, _WorkerInit) and starts_by_fork(self.multiprocessing_context)
                 and not (self.persistent_workers and self._iterator is not None))
        if not forks:
            return self._watch_workers(DataLoader.__iter__(self))
        assert isinstance(init, _WorkerInit)
        restore_draws = keep_random_states([self._iter_generator, *self._generators()])

        def start(pipe: tuple[int, int]) -> Any:
            init.started = pipe
            try:
                return DataLoader.__iter__(self)
            finally:
                init.started = None

        def restore() -> None:
            restore_draws()
            self._iterator = None  # persistent workers: the next start makes new ones

        return self._watch_workers(guarded_start(start, restore))

    def _watch_workers(self, batches: Any) -> Any:
        """Give a pass's worker iterator its time limit (engine/data/workers.py) and keep it for the error."""
        if self.num_workers > 0:
            # DataLoader reads `timeout` once, into its iterator: setting it there leaves the user's loader (and
            # `self.timeout`, which views and re-built loaders copy) as the user made it.
            batches._timeout = worker_timeout_of(self.timeout, self._worker_timeout)
            self._workers_iter = weakref.ref(batches)
        return batches

    def _worker_timeout_error(self, error: RuntimeError) -> LoaderWorkerTimeout | None:
        """For DataLoader's "timed out" error: the error to raise instead, with the workers' stacks; else None."""
        workers = self._workers_iter() if self._workers_iter is not None else None
        if workers is None or not is_worker_timeout(error):
            return None
        return timeout_error(self._worker_stacks, workers, workers._timeout, user_set=self.timeout > 0)

    def _reads_sampler(self) -> bool:
        return True

    def _draw_epoch_seeds(self) -> None:
        """Make the draws Accelerate's loader makes when an epoch starts, so the random stream after it matches.

        DataLoader draws its per-iterator seed (from the user's loader generator, else the global RNG); then a
        RandomSampler without a generator draws its seed from the global RNG, which here seeds the loader's own
        generator instead, so the epoch's order is part of the saved position. A pass resumed mid-epoch skips
        them: the restored global RNG is already past them.
        """
        torch.empty((), dtype=torch.int64).random_(generator=self._iterator_seed_source)
        if self._epoch_seeded_generator is not None and self._reads_sampler():
            self._epoch_seeded_generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))

    def _synchronize_rngs(self, resuming: bool) -> None:
        # Mid-epoch, the global RNGs were just restored per rank and must stay as they are; the collectives
        # still run so that every rank issues the same ones wherever it resumed.
        saved = {t: torch.get_rng_state() if t == "torch" else torch.cuda.get_rng_state()
                 for t in self.rng_types if resuming and t in ("torch", "cuda")}
        synchronize_rng_states(self.rng_types, self.synchronized_generator)
        for kind, value in saved.items():
            if kind == "torch":
                torch.set_rng_state(value)
            else:
                torch.cuda.set_rng_state(value)

    def _finish_pass(self) -> None:
        self.iteration += 1
        self._epoch_active = False
        self._ahead_rng = self._first_rng = None
        parent = self._parent() if self._parent is not None else None
        if parent is not None and parent._active_view is not None and parent._active_view() is self:
            # The view ran the parent's epoch: the parent's next pass is the next epoch.
            parent.iteration = self.iteration
            parent._active_view = None

    # -- exact position --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Epoch, batches already yielded in it, and the random states its coming batches depend on.

        ``generator_states`` holds the sampler generators' states at the epoch's start, then the process's RNG
        states its look-ahead batch (and, for a dispatcher, the epoch's first step) was collated under, named in
        order by ``lookahead`` (none where collation cannot draw: engine/data/lookahead.py). Restoring it into a
        freshly prepared loader continues with exactly the batches an uninterrupted run would produce next.
        Values are ints, lists and tensors (``torch.load(weights_only=True)``-safe).
        """
        view = self._active_view() if self._active_view is not None else None
        if view is not None and view._epoch_active:
            state = view.state_dict()
            return {**state, "batches_yielded": state["batches_yielded"] + view._view_offset}
        active = self._epoch_active
        iteration = self.iteration
        if active and self.end_of_dataloader:
            # Every batch of the epoch was handed out: the position is the next epoch's start, and the generators
            # (read to the epoch's end) are where that epoch starts from. Saved this way, both resume patterns
            # (`load_state` alone, or with `skip_first_batches(dl, 0)` for the next epoch) agree on it.
            active, iteration = False, iteration + 1
        states = self._epoch_start_states if active else [g.get_state() for g in self._generators()]
        replay = {"ahead": as_saved(self._ahead_rng), "first": as_saved(self._first_rng)} if active else self._replay
        lookahead = [name for name in ("ahead", "first") if replay.get(name) is not None]
        seedable = self._seedable_sampler()
        return {"iteration": iteration,
                "batches_yielded": self._batches_yielded if active else self._pending,
                "seed": self._seed,
                "generator_states": [s.clone() for s in states] + [replay[name] for name in lookahead],
                "sampler_seed": seedable.initial_seed if seedable is not None else None,
                "lookahead": lookahead}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (see ``state_dict``): the next pass starts at the saved batch."""
        generators = self._generators()
        lookahead = list(state.get("lookahead", []))  # absent in checkpoints from before the look-ahead states
        states = list(state["generator_states"])
        replay = states[len(states) - len(lookahead):] if lookahead else []
        states = states[:len(states) - len(replay)]
        if len(states) != len(generators):
            raise ValueError(f"This data loader's state holds {len(states)} generator state(s) but the loader has "
                             f"{len(generators)} generator(s): prepare the same DataLoader (same sampler, shuffle "
                             "and dataset) as the run that saved it before loading.")
        for gen, value in zip(generators, states):
            gen.set_state(value.cpu() if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.uint8))
        seedable = self._seedable_sampler()
        if seedable is not None and state.get("sampler_seed") is not None:
            seedable.initial_seed = int(state["sampler_seed"])
        self._seed = int(state["seed"])
        if isinstance(self.worker_init_fn, _WorkerInit):
            self.worker_init_fn.seed = self._seed
        self.iteration = int(state["iteration"])
        self._pending = int(state["batches_yielded"])
        self._replay = dict(zip(lookahead, replay))
        self._epoch_active = False
        self._restored = True
        self._active_view = None

    def _claim_restored_position(self, num_batches: int) -> bool:
        """For ``skip_first_batches(self, num_batches)``: take over a restored position, if one is unclaimed.

        Returns whether the view's first pass continues the restored epoch. A count that disagrees with the
        restored position would skip batches twice (or replay them), so it is refused.
        """
        if not self._restored:
            return False
        pending = self._pending
        if num_batches != pending:
            raise ValueError(
                f"skip_first_batches(dataloader, {num_batches}) after load_state, but the loaded checkpoint put this "
                f"loader at batch {pending} of epoch {self.iteration}: the skip would not continue where the run "
                f"stopped. Pass num_batches={pending} (the resumed epoch's remaining batches follow), or iterate the "
                "dataloader itself without skip_first_batches (load_state already restored its position).")
        self._pending, self._restored = 0, False
        return pending > 0

    def _batching_kwargs(self) -> dict[str, Any]:
        """How this loader forms batches, as DataLoader arguments."""
        if self._is_iterable:
            return {"batch_size": self.batch_size, "drop_last": self.drop_last}
        if self.batch_sampler is None:
            return {"sampler": self.sampler, "batch_size": None}
        return {"batch_sampler": self.batch_sampler}

    def _dataloader_kwargs(self) -> dict[str, Any]:
        """The DataLoader arguments to build an equivalent loader (skip_first_batches)."""
        return {"num_workers": self.num_workers, "collate_fn": self.collate_fn, "pin_memory": self.pin_memory,
                "timeout": self.timeout, "worker_init_fn": _user_worker_init(self.worker_init_fn),
                "multiprocessing_context": self.multiprocessing_context, "prefetch_factor": self.prefetch_factor,
                "persistent_workers": self.persistent_workers, "pin_memory_device": self.pin_memory_device,
                "in_order": self.in_order}

    def _skipped(self, num_batches: int) -> _PreparedLoader:
        """A view of this loader that starts ``num_batches`` batches later (``skip_first_batches``)."""
        raise NotImplementedError(f"{type(self).__name__} defines no skip view.")  # each subclass builds its own

    def _copy_state_to(self, other: _PreparedLoader, num_batches: int) -> None:
        """Make ``other`` (a view skipping ``num_batches`` more) continue this loader's epoch and random state."""
        replay = self._replay
        other._resume_first = self._claim_restored_position(num_batches)
        if other._resume_first:  # the view's first pass continues the restored epoch: it collates those batches
            other._replay, self._replay = replay, {}
        other._parent = weakref.ref(self)
        other._view_offset = num_batches
        other.iteration = self.iteration
        other._seed = self._seed
        other._iterator_seed_source = self._iterator_seed_source
        other._epoch_seeded_generator = self._epoch_seeded_generator
        other._worker_timeout = self._worker_timeout
        if isinstance(other.worker_init_fn, _WorkerInit):
            other.worker_init_fn.seed = self._seed
