"""Where each run's data loaders come from (arguments, data module, or the module) and how many batches to use."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, IterableDataset, SequentialSampler

from engine.operations import send_to_device
from trainer.datamodule import DataModule
from trainer.loop.hooks import overrides
from trainer.module import TrainModule
from trainer.utilities.combined_loader import CombinedLoader
from trainer.utilities.exceptions import MisconfigurationException
from trainer.utilities.rank_zero import rank_zero_warn
from trainer.utilities.tree import Shape, flatten
from trainer.utilities.warnings import PossibleUserWarning

KINDS = {"train": "train_dataloaders", "val": "val_dataloaders", "test": "dataloaders", "predict": "dataloaders"}


class NoDataError(MisconfigurationException, TypeError):
    """Nothing provides a stage's data: none was passed, and no data module or module hook gives any.

    Lightning raises a ``TypeError`` ("An invalid dataloader was passed to ... Found None") where the hook is switched
    off (set to None) and a ``MisconfigurationException`` where it is not implemented; this one error is both."""


def no_data(kind: str, entry: str, module: TrainModule) -> NoDataError:
    """The error for a run of ``entry`` (``"fit"``, ``"validate"``, ...) that has no ``kind`` data at all."""
    argument = KINDS[kind] if entry == "fit" else "dataloaders"
    what = "training" if kind == "train" else kind
    call = "fit(model, train_dataloaders=...)" if entry == "fit" else f"trainer.{entry}(model, dataloaders=...)"
    # Lightning's words first (its tests match them), then what to do.
    return NoDataError(f"An invalid dataloader was passed to `Trainer.{entry}({argument}=...)`. Found None. No "
                       f"{what} data: pass {call}, datamodule=..., or define {type(module).__name__}.{kind}_dataloader().")


# Iterables whose items are single values, not batches: refused early (the usual mistake is passing raw values or a
# tensor where a DataLoader over them was meant). A list / tuple of plain values reaches here as one leaf (see flatten).
_SINGLE_VALUES = (str, bytes, range, list, tuple, torch.Tensor)


def is_batch_iterable(loader: Any) -> bool:
    """Whether ``loader`` can be a stage's data: a ``DataLoader``, or any other iterable of batches (a wrapper
    without ``__len__``, an infinite one), as Lightning accepts; not ``None``, not a non-iterable, and not one of
    ``_SINGLE_VALUES``.

    Example:
        >>> is_batch_iterable(DataLoader(range(4))), is_batch_iterable(iter([1])), is_batch_iterable(range(3))
        (True, True, False)
    """
    if isinstance(loader, DataLoader):
        return True  # no iter() call: a DataLoader's may start worker processes
    if loader is None or isinstance(loader, _SINGLE_VALUES):
        return False
    try:
        iter(loader)
    except TypeError:
        return False
    return True


def _empty_collection(given: Any) -> bool:
    """An empty list, tuple or dict given as a stage's whole data: no loaders."""
    return isinstance(given, (list, tuple, dict)) and not given


def request_loaders(kind: str, given: Any, datamodule: DataModule | None, module: TrainModule,
                    entry: str | None = None) -> Any:
    """The data of ``kind`` (``"train"``, ``"val"``, ``"test"``, ``"predict"``) as given: passed in, else the data
    module's ``{kind}_dataloader()``, else the module's; None when none of them provides any. A hook that returns
    None, and anything in the data that is not an iterable of batches (see ``is_batch_iterable``), is refused here,
    naming where it came from: the argument of ``Trainer.{entry}`` (default: ``fit`` for train / val data, else the
    kind's own entry point) or the hook that returned it."""
    method = f"{kind}_dataloader"
    entry = entry or ("fit" if kind in ("train", "val") else kind)
    if given is not None and datamodule is not None:
        raise ValueError(f"Both {KINDS[kind]}= and datamodule= were given: pass the loaders through one of them.")
    origin = f"passed to `Trainer.{entry}({KINDS[kind] if entry == 'fit' else 'dataloaders'}=...)`"
    if given is None and datamodule is not None and overrides(datamodule, DataModule, method):
        given, origin = getattr(datamodule, method)(), f"returned from `{type(datamodule).__name__}.{method}()`"
    elif given is None and overrides(module, TrainModule, method):
        given, origin = getattr(module, method)(), f"returned from `{type(module).__name__}.{method}()`"
    elif given is None:
        return None
    if kind != "train" and _empty_collection(given):
        return given  # no loaders, as in Lightning: the stage runs no batches (an empty list is not a dataset here)
    for loader in given.flattened if isinstance(given, CombinedLoader) else flatten(given)[0]:
        if not is_batch_iterable(loader):  # Lightning's words first, then what to do
            found = "None" if loader is None else type(loader).__name__
            raise TypeError(f"An invalid dataloader was {origin}. Found {found}: the {kind} data must be a "
                            "torch.utils.data.DataLoader (or another iterable of batches), a dict / list / tuple of "
                            "them, or a CombinedLoader. Wrap the dataset: DataLoader(dataset, batch_size=...).")
    return given


def resolve_loaders(kind: str, given: Any, datamodule: DataModule | None, module: TrainModule) -> list[DataLoader]:
    """The loaders of ``kind`` (``"val"``, ``"test"``, ``"predict"``; see ``request_loaders``) as a flat list, in
    order: a dict, list or tuple (nested too) or a ``CombinedLoader`` in ``"sequential"`` mode gives its loaders one
    after the other, as in Lightning; an empty list when nothing provides any.

    Example:
        >>> import torch
        >>> loader = DataLoader(torch.arange(4.0), batch_size=2)
        >>> resolve_loaders("val", [loader, loader], None, TrainModule())  == [loader, loader]
        True
        >>> resolve_loaders("val", {"a": loader}, None, TrainModule())  == [loader]
        True
    """
    return resolve_shaped(kind, given, datamodule, module)[0]


def resolve_shaped(kind: str, given: Any, datamodule: DataModule | None, module: TrainModule,
                   entry: str | None = None) -> tuple[list[DataLoader], Shape | None]:
    """``resolve_loaders``, and the shape the loaders were given in (``trainer.val_dataloaders`` & co. show them
    in it; None when nothing provides any). ``entry``: the Trainer method the loaders were passed to."""
    given = request_loaders(kind, given, datamodule, module, entry)
    if given is None:
        return [], None
    if _empty_collection(given):
        kind_of = "dict" if isinstance(given, dict) else "tuple" if isinstance(given, tuple) else "list"
        return [], Shape(kind_of, type(given))
    if isinstance(given, CombinedLoader):
        if given.mode != "sequential":
            stage = {"val": "validate", "test": "test", "predict": "predict"}.get(kind, kind)
            raise ValueError(f"`trainer.{stage}()` only supports the `CombinedLoader(mode=\"sequential\")` mode. "
                             f"Received mode={given.mode!r}: pass the loaders as a list or dict (run one after the "
                             "other) or CombinedLoader(..., mode=\"sequential\").")
        loaders, shape = list(given.flattened), given.shape
    else:
        loaders, shape = flatten(given)
    return loaders, shape


def check_val_loop(val: list[DataLoader], given: Any, datamodule: DataModule | None,
                   module: TrainModule) -> list[DataLoader]:
    """``fit``'s validation loaders, or none when the module has no ``validation_step``; Lightning 2.6's warnings
    (observed) when only one of the step and the data is defined. "Defined" is Lightning's: passed in, or a
    ``val_dataloader`` method (of the data module or the module), whatever ``limit_val_batches`` says."""
    name = type(module).__name__
    has_step = overrides(module, TrainModule, "validation_step")
    defined = given is not None or overrides(module, TrainModule, "val_dataloader") or (
        datamodule is not None and overrides(datamodule, DataModule, "val_dataloader"))
    if defined and not has_step:
        rank_zero_warn(f"You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop: {name} "
                       f"has no validation_step, so validation is skipped. Define {name}.validation_step to validate.",
                       stacklevel=7)
        return []
    if has_step and not defined:
        rank_zero_warn(f"You defined a `validation_step` but have no `val_dataloader`. Skipping val loop: pass "
                       f"fit(model, train_dataloaders, val_dataloaders) or define {name}.val_dataloader() to "
                       "validate.", category=PossibleUserWarning, stacklevel=7)
    return val


def check_loaders(kind: str, given: Any) -> Any:
    """The one loader of the one-loader training path (``given`` is neither a collection nor combined)."""
    if not is_batch_iterable(given):
        raise TypeError(f"The {kind} data must be a torch.utils.data.DataLoader (or another iterable of batches), a "
                        f"dict / list / tuple of them, or a CombinedLoader. Received: {type(given).__name__}. Wrap the "
                        "dataset: DataLoader(dataset, batch_size=...).")
    return given


class PlacedBatches:
    """An iterable of batches that is not a ``DataLoader`` (the engine prepares only those), its batches moved to
    ``device`` as the engine's loaders move theirs. It has a length when the iterable has one. Such data is read
    as it is: not sharded across processes, and a resumed run starts its epoch from the iterable's start.

    Example:
        >>> batches = PlacedBatches([torch.zeros(2)], torch.device("cpu"))
        >>> [b.device.type for b in batches], len(batches)
        (['cpu'], 1)
    """

    def __init__(self, iterable: Iterable[Any], device: torch.device) -> None:
        self.iterable = iterable
        self.device = device

    def __len__(self) -> int:
        return len(cast(Sized, self.iterable))  # a TypeError / NotImplementedError says it has none (loader_length)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.iterable:
            yield send_to_device(batch, self.device)


def warn_unresumable(loaders: list[Any], batch_in_epoch: int) -> None:
    """Say so when a run resumed inside an epoch reads training data that does not restore its position (an iterable
    that is not a ``DataLoader``): that data starts again from its beginning, the resume is not exact."""
    plain = [type(loader.iterable if isinstance(loader, PlacedBatches) else loader).__name__ for loader in loaders
             if not isinstance(loader, DataLoader)]  # the engine prepared every DataLoader: each saves its place
    if batch_in_epoch > 0 and plain:
        rank_zero_warn(f"Resuming inside epoch at batch {batch_in_epoch}: the training data ({', '.join(plain)}) is not "
                       "a torch.utils.data.DataLoader, so it cannot restore its position and is read again from its "
                       "beginning for the rest of the epoch. Pass a DataLoader for an exact resume.", stacklevel=2)


def loader_length(loader: Any) -> int | None:
    """``len(loader)`` in batches, or ``None`` for loaders without a length (iterable datasets; a sampler whose
    ``__len__`` raises ``NotImplementedError``)."""
    try:
        return len(loader)
    except (TypeError, NotImplementedError):
        return None


def limit_batches(length: int | None, limit: float, name: str) -> int | None:
    """How many batches ``limit`` (``limit_*_batches``: an int count or a float fraction) allows of a loader of
    ``length`` batches; ``None`` means all of an unknown number.

    Example:
        >>> limit_batches(10, 0.25, "limit_val_batches"), limit_batches(10, 3, "limit_val_batches")
        (2, 3)
    """
    if isinstance(limit, int):
        return limit if length is None else min(limit, length)
    if limit == 1.0:
        return length
    if length is None:  # Lightning's words first (its tests match them), then what was received and what to do
        stage = name.split("_")[1]
        raise MisconfigurationException(
            f"When using an `IterableDataset`, `Trainer({name})` must be `1.0` or an int. An int specifies "
            f"`num_{stage}_batches` to use. Received {name}={limit}, a fraction of a loader without a length (an "
            "iterable dataset, or an iterable without __len__): pass an int number of batches instead.")
    count = int(length * limit)
    if count == 0 and limit > 0:
        raise ValueError(f"{name}={limit} of {length} batches is less than one batch: raise {name} to at least "
                         f"{1 / length:.4g}, or pass an int.")
    return count


def without_shuffle(loader: DataLoader) -> DataLoader:
    """The same loader with a sequential sampler (``overfit_batches`` must see the same batches every epoch)."""
    # As Lightning: any sampler but a sequential one (a RandomSampler, a custom Sampler) is replaced.
    if isinstance(loader.sampler, SequentialSampler) or not isinstance(loader, DataLoader):
        return loader
    if loader.batch_size is None:
        warnings.warn("overfit_batches: the training loader shuffles through a custom batch sampler, which cannot be "
                      "switched off here; the overfitted batches will change between epochs.", stacklevel=3)
        return loader
    # Lightning's text, then why.
    warnings.warn("You requested to overfit but enabled train dataloader shuffling. We are turning off the train "
                  "dataloader shuffling for you (overfit_batches: every epoch sees the same batches).", stacklevel=3)
    if isinstance(loader.dataset, IterableDataset):
        # No sampler to replace (torch refuses one): the dataset's own order is kept, as Lightning keeps it (it
        # warns the same words; observed with 2.6.6).
        return loader
    extra: dict[str, Any] = {"prefetch_factor": loader.prefetch_factor} if loader.num_workers > 0 else {}
    # A map-style dataset (the loader samples it): it has a length, which torch's Dataset type does not declare.
    dataset = cast(Sized, loader.dataset)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=SequentialSampler(dataset),
                      num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                      drop_last=loader.drop_last, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                      multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
                      persistent_workers=loader.persistent_workers, **extra)


def check_not_empty(loader: Any, prepared: Any, num_processes: int) -> None:
    """Raise when the training loader yields no batch at all (fit would otherwise end at epoch 0, step 0, silently).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> check_not_empty(DataLoader(range(3), batch_size=4, drop_last=True), [], 1)
        Traceback (most recent call last):
        ...
        ValueError: The training DataLoader yields no batch: its dataset has 3 samples, batch_size=4, drop_last=True. Give it more samples, a smaller batch_size or drop_last=False.
    """
    if loader_length(prepared) != 0:
        return
    dataset: Any = getattr(loader, "dataset", None)  # anything: len() may raise TypeError, answered below
    try:
        samples = f"{len(dataset)} samples"
    except TypeError:
        samples = "an unknown number of samples"
    where = f" on each of {num_processes} processes" if num_processes > 1 else ""
    raise ValueError(f"The training DataLoader yields no batch{where}: its dataset has {samples}, batch_size="
                     f"{getattr(loader, 'batch_size', None)}, drop_last={getattr(loader, 'drop_last', None)}. Give it "
                     "more samples, a smaller batch_size or drop_last=False.")
