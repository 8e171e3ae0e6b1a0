"""Several training loaders at once: how ``fit`` iterates a ``CombinedLoader`` whose loaders the engine prepared,
and how such a run resumes exactly.

Each loader is prepared on its own (sharded, seeded, its position saved by the engine like a single loader's);
``CombinedTrainData`` walks them in the combined loader's mode and hands the loop one batch per step, shaped as the
collection was given. A single ``DataLoader`` never comes here (``fit``'s one-loader path is unchanged).

Exact resume. A checkpoint taken mid-epoch holds every loader's own position, so a resumed run continues each where
it was; the combined walk then only needs the epoch's batch number (which loaders are already exhausted in
``"max_size"`` mode, or have ended once in ``"max_size_cycle"`` mode, follows from it and their lengths). At an
epoch's end, the passes of shorter loaders that a ``"max_size_cycle"`` epoch left half-read (and any pass a limit
or a stop cut) are finished at the index level, without fetching a batch, before the next epoch starts: in the
run that goes on and, from the checkpoint, in the resumed run alike, so both start the next epoch from the same
sampler states.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from trainer.loop.data import limit_batches, loader_length, without_shuffle
from trainer.utilities.combined_loader import CombinedLoader, combined_length
from trainer.utilities.tree import unflatten

TRAIN_MODES = ("min_size", "max_size_cycle", "max_size")
_END = object()


def training_combination(given: Any) -> CombinedLoader | None:
    """The ``CombinedLoader`` ``fit`` iterates for training data ``given`` (a dict, list or tuple of loaders is
    combined in ``"max_size_cycle"`` mode, as in Lightning), or None for a single loader (the one-loader path).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> training_combination([DataLoader(range(2))]).mode
        'max_size_cycle'
        >>> training_combination(DataLoader(range(2))) is None
        True
    """
    if isinstance(given, CombinedLoader):
        return given
    if isinstance(given, (dict, list, tuple)):
        return CombinedLoader(given, "max_size_cycle")
    return None


def check_train_mode(combined: CombinedLoader) -> None:
    """Refuse a mode ``fit`` cannot train in (``"sequential"``: one loader's batch at a time)."""
    if combined.mode not in TRAIN_MODES:
        # Lightning's text first (tests match on it), then the fix.
        raise ValueError(f'`_FitLoop` does not support the `CombinedLoader(mode="{combined.mode}")` mode. The '
                         f"available modes are: {list(TRAIN_MODES)}. Received mode={combined.mode!r}: fit takes one "
                         "batch of every loader per step; sequential mode is for validate, test and predict.")


def prepare_combined(combined: CombinedLoader, prepare: Callable[[Any], Any], overfit: float,
                     limit: float) -> tuple[CombinedTrainData, int | None]:
    """Prepare each of ``combined``'s loaders with ``prepare`` (the engine), put them in its place, and return
    the loop's iterable and the epoch's batch count (``limit_train_batches`` applies to each loader, then the
    mode combines the counts, as in Lightning; None when unknown)."""
    # The loaders were checked where they were requested (request_loaders): DataLoaders, whose positions the engine
    # saves for an exact resume, or other iterables of batches, read as they are.
    sources = [without_shuffle(loader) if overfit else loader for loader in combined.flattened]
    prepared = [prepare(loader) for loader in sources]
    combined.flattened = prepared
    counts = [limit_batches(loader_length(p), limit, "limit_train_batches") for p in prepared]
    total = combined_length(combined, [float("inf") if n is None else n for n in counts])
    count = None if total == float("inf") else int(total)
    if count == 0 and limit != 0 and combined.mode in TRAIN_MODES:
        raise ValueError(f"The combined training data yields no batch: its loaders have {counts} batches "
                         f"(mode={combined.mode!r}). Give every loader at least one batch.")
    return CombinedTrainData(combined, sources), count


class CombinedTrainData:
    """The training loop's iterable over a ``CombinedLoader`` of prepared loaders: yields one combined batch per
    step (``len()`` is the whole epoch, before ``limit_train_batches``).

    Args:
        combined: the user's combined loader, its ``flattened`` already replaced by the prepared loaders.
        sources: its loaders as given (before preparing): what ``trainer.train_dataloader`` shows in one process.
    """

    def __init__(self, combined: CombinedLoader, sources: list[Any] | None = None) -> None:
        self.combined = combined
        self.sources = list(combined.flattened) if sources is None else sources
        self.loaders = list(combined.flattened)
        self.lengths = [loader_length(loader) for loader in self.loaders]
        self.mode = combined.mode
        self._start = 0  # a resumed epoch's batch number (set by line_up, used by the next pass)
        self._resumed_mid_epoch = False

    def __len__(self) -> int:
        total = combined_length(self.combined, [float("inf") if n is None else n for n in self.lengths])
        if total == float("inf"):
            raise TypeError("The combined training data has no length: one of its loaders has none (an iterable "
                            "dataset) and decides it.")
        return int(total)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: finish the passes the previous epoch left open, then set every loader's epoch
        (not for an epoch resumed mid-way, whose loaders continue from their restored positions)."""
        if self._resumed_mid_epoch:
            self._resumed_mid_epoch = False
            return
        for loader in self.loaders:
            finish_open_pass(loader)
            set_epoch = getattr(loader, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def line_up(self, batch_in_epoch: int, count: int | None) -> None:
        """After a resume at batch ``batch_in_epoch`` of an epoch of ``count`` batches (see
        ``RunPlan.line_up_loaders``): mid-epoch, the loaders continue from their restored positions; at an epoch
        boundary, the passes left open are finished as the uninterrupted run finishes them."""
        if batch_in_epoch == 0 or (count is not None and batch_in_epoch >= count):
            for loader in self.loaders:
                finish_open_pass(loader)
            return
        self._start, self._resumed_mid_epoch = batch_in_epoch, True

    def __iter__(self) -> Iterator[Any]:
        start, self._start = self._start, 0
        shape = self.combined.shape
        known = all(n is not None for n in self.lengths)
        remaining = len(self) - start if known else None
        iterators = [iter(loader) for loader in self.loaders]
        if self.mode == "min_size":
            steps = _min_size(iterators)
        elif self.mode == "max_size":
            steps = _max_size(iterators, self.lengths, start)
        else:
            steps = _max_size_cycle(iterators, self.loaders, self.lengths, start)
        for _ in range(remaining) if remaining is not None else iter(int, 1):
            batches = next(steps, None)  # the steps yield lists: None is their end
            if batches is None:
                return
            yield unflatten(batches, shape)


def _min_size(iterators: list[Iterator[Any]]) -> Iterator[list[Any]]:
    while True:
        batches = [next(iterator, _END) for iterator in iterators]
        if any(batch is _END for batch in batches):
            return
        yield batches


def _max_size(iterators: list[Iterator[Any]], lengths: list[int | None], start: int) -> Iterator[list[Any]]:
    # A loader already exhausted (known from its length after a resume, else from its end) gives None.
    done = [n is not None and start >= n for n in lengths]
    while True:
        batches: list[Any] = []
        for i, iterator in enumerate(iterators):
            batch = _END if done[i] else next(iterator, _END)
            done[i] = batch is _END
            batches.append(None if batch is _END else batch)
        if all(done):
            return
        yield batches


def _max_size_cycle(iterators: list[Iterator[Any]], loaders: list[Any], lengths: list[int | None],
                    start: int) -> Iterator[list[Any]]:
    # An exhausted loader starts over until every loader has ended once (with known lengths the epoch is cut at
    # the combined length first, so no pass is started only to be dropped).
    ended = [n is not None and start >= n for n in lengths]
    while True:
        batches = []
        for i in range(len(iterators)):
            batch = next(iterators[i], _END)
            if batch is _END:
                ended[i] = True
                if all(ended):
                    return
                iterators[i] = iter(loaders[i])
                batch = next(iterators[i], _END)
                if batch is _END:
                    return  # an empty loader: nothing to cycle
            batches.append(batch)
        yield batches


def finish_open_pass(loader: Any) -> None:
    """Bring a prepared loader whose pass was left half-read to that pass's end, at the index level (its sampler
    reads the rest of the epoch, no batch is fetched): the state the next epoch starts from."""
    state_dict = getattr(loader, "state_dict", None)
    length = loader_length(loader)
    if not callable(state_dict) or length is None:
        return
    position = state_dict()
    if 0 < position["batches_yielded"] < length:
        loader.load_state_dict({**position, "batches_yielded": length})
        for _ in loader:
            raise AssertionError("a loader restored at its end yielded a batch")

