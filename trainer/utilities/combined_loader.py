"""``CombinedLoader``: iterate several data loaders (a dict, list or tuple of them, nested too) together.

Lightning's ``lightning.pytorch.utilities.CombinedLoader``. ``fit`` combines training loaders given as a
collection in ``"max_size_cycle"`` mode; validation, test and predict loaders run one after the other
(``"sequential"``). Pass a ``CombinedLoader`` yourself to choose another mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from trainer.utilities.combined_modes import MODES, Item, ModeIterator, Sequential, sized_len
from trainer.utilities.tree import Shape, flatten, map_shape, unflatten

Mode = Literal["min_size", "max_size_cycle", "max_size", "sequential"]


class CombinedLoader(Iterable[Item]):
    """Iterate a collection of iterables together, in one of four modes.

    Iteration yields ``(batch, batch_idx, dataloader_idx)``. In ``"min_size"`` (the default), ``"max_size_cycle"``
    and ``"max_size"`` mode ``batch`` has the collection's shape with one batch of each iterable, and
    ``dataloader_idx`` is 0:

    * ``"min_size"``: ends with the shortest iterable;
    * ``"max_size_cycle"``: ends with the longest; shorter ones start over when exhausted;
    * ``"max_size"``: ends with the longest; exhausted ones give ``None``;
    * ``"sequential"``: each iterable in turn, ``batch`` one iterable's batch, ``batch_idx`` from 0 for each and
      ``dataloader_idx`` its position in ``flattened``.

    ``len()`` is the number of items (after ``iter()``, as in Lightning).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loaders = {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}
        >>> combined = CombinedLoader(loaders, "max_size_cycle")
        >>> for batch, batch_idx, dataloader_idx in combined:
        ...     print({k: v.tolist() for k, v in batch.items()}, batch_idx, dataloader_idx)
        {'a': [0, 1, 2, 3], 'b': [0, 1, 2, 3, 4]} 0 0
        {'a': [4, 5], 'b': [5, 6, 7, 8, 9]} 1 0
        {'a': [0, 1, 2, 3], 'b': [10, 11, 12, 13, 14]} 2 0
        >>> len(combined)
        3
    """

    def __init__(self, iterables: Any, mode: Mode = "min_size") -> None:
        if mode not in MODES:
            # Lightning's text first (tests match on it), then the fix.
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}. Received mode="
                             f"{mode!r}: pass one of these strings.")
        self._iterables = iterables
        self._flattened, self._shape = flatten(iterables)
        self._mode: Mode = mode
        self._iterator: ModeIterator | None = None
        self._limits: list[int | float] | None = None

    @property
    def mode(self) -> Mode:
        """How the iterables are walked (see the class docstring)."""
        return self._mode

    @property
    def iterables(self) -> Any:
        """The collection of iterables, in the shape it was given."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list (dict insertion order, depth first)."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ValueError(f"Mismatch in flattened length ({len(flattened)}) and existing length "
                             f"({len(self._flattened)}): give one replacement per iterable.")
        self._iterables = unflatten(flattened, self._shape)
        self._flattened = list(flattened)

    @property
    def sampler(self) -> Any:
        """Each iterable's ``sampler`` (``None`` where it has none), in the collection's shape."""
        return map_shape(lambda it: getattr(it, "sampler", None), self._flattened, self._shape)

    @property
    def batch_sampler(self) -> Any:
        """Each iterable's ``batch_sampler`` (``None`` where it has none), in the collection's shape."""
        return map_shape(lambda it: getattr(it, "batch_sampler", None), self._flattened, self._shape)

    @property
    def limits(self) -> list[int | float] | None:
        """Optional number of batches per iterable: they shorten ``len()`` (and each iterable in sequential
        mode); one number applies to all."""
        return self._limits

    @limits.setter
    def limits(self, limits: float | list[int | float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of iterables "
                             f"({len(self._flattened)}): give one limit per iterable, or one number for all.")
        self._limits = limits

    @property
    def shape(self) -> Shape:
        """How ``flattened`` is put back in the collection's shape (``trainer.utilities.tree``)."""
        return self._shape

    def __iter__(self) -> Iterator[Item]:
        self._iterator = MODES[self._mode](self._flattened, self._limits).start()
        return self

    def __next__(self) -> Item:
        if self._iterator is None:
            raise TypeError("CombinedLoader is not an iterator until iter() is called on it: use "
                            "`for batch, batch_idx, dataloader_idx in combined_loader` or iter(combined_loader).")
        batches, batch_idx, dataloader_idx = next(self._iterator)
        if isinstance(self._iterator, Sequential):
            return batches, batch_idx, dataloader_idx
        return unflatten(batches, self._shape), batch_idx, dataloader_idx

    def __len__(self) -> int:
        """The number of items an iteration yields (limits applied)."""
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first. (len() of a CombinedLoader is known once "
                               "an iteration started, as in Lightning.)")
        return len(self._iterator)

    def reset(self) -> None:
        """Forget the current iteration and shut down the worker processes of the loaders' iterators."""
        if self._iterator is not None:
            self._iterator.reset()
            self._iterator = None
        for iterable in self._flattened:
            iterator = getattr(iterable, "_iterator", None)
            if isinstance(iterator, _MultiProcessingDataLoaderIter):
                iterator._shutdown_workers()

    def __repr__(self) -> str:
        return f"CombinedLoader(mode={self._mode!r}, iterables={len(self._flattened)})"


def combined_length(loader: CombinedLoader, lengths: list[int | float]) -> int | float:
    """The combined number of batches of ``loader``'s mode for the iterables' ``lengths`` (``inf`` unknown)."""
    if not lengths:
        return 0
    return MODES[loader.mode].combine(lengths)


__all__ = ["CombinedLoader", "combined_length", "sized_len"]
