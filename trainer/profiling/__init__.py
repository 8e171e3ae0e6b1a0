"""Profilers with Lightning's names: ``Trainer(profiler="simple" | "advanced" | "pytorch" | a Profiler)``.

Actions the trainer times: every overridden hook (``[Callback]{class}.{hook}``, ``[LightningModule]{class}.{hook}``),
the data module's ``prepare_data`` / ``setup`` / ``teardown`` / ``state_dict`` / ``load_state_dict`` /
``on_exception`` (``[LightningDataModule]{class}.{hook}``, Lightning's name),
``run_training_batch``, ``train_dataloader_next``, ``optimizer_step``, the evaluation steps and data fetches
(``[validation|test|predict]_step``, ``..._dataloader_next``) and ``save_checkpoint``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ParamSpec, TypeVar

from trainer.profiling.advanced import AdvancedProfiler
from trainer.profiling.base import PassThroughProfiler, Profiler
from trainer.profiling.pytorch import PyTorchProfiler
from trainer.profiling.simple import SimpleProfiler

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
_NOTHING = contextlib.nullcontext()  # reusable: no profiler costs one `with` on a shared object

PROFILERS: dict[str, type[Profiler]] = {"simple": SimpleProfiler, "advanced": AdvancedProfiler,
                                        "pytorch": PyTorchProfiler, "passthrough": PassThroughProfiler}


def resolve_profiler(profiler: Profiler | str | None) -> Profiler:
    """The ``Profiler`` for ``Trainer(profiler=...)``: an instance, a name, or ``None`` (a ``PassThroughProfiler``,
    for which the trainer wraps nothing).

    Example:
        >>> type(resolve_profiler("simple")).__name__
        'SimpleProfiler'
    """
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, Profiler):
        return profiler
    if isinstance(profiler, str):
        key = profiler.lower()
        if key in PROFILERS:
            return PROFILERS[key]()
        close = difflib.get_close_matches(key, PROFILERS, n=2)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Trainer(profiler={profiler!r}) is not a known profiler.{hint} Use one of "
                         f"{sorted(PROFILERS)} or a trainer.profiling.Profiler instance.")
    raise TypeError(f"Trainer(profiler=...) takes a name ({sorted(PROFILERS)}), a trainer.profiling.Profiler or "
                    f"None. Received: {type(profiler).__name__}.")


def profile(profiler: Profiler | None, action_name: str) -> contextlib.AbstractContextManager[Any]:
    """``profiler.profile(action_name)``, or a shared no-op context without a profiler."""
    return _NOTHING if profiler is None or not profiler.records else profiler.profile(action_name)


def profiled(profiler: Profiler | None, action_name: str, fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with each call recorded as ``action_name``; ``fn`` itself without a profiler (no per-call cost)."""
    if profiler is None or not profiler.records:
        return fn

    @functools.wraps(fn)
    def recorded(*args: P.args, **kwargs: P.kwargs) -> R:
        with profiler.profile(action_name):
            return fn(*args, **kwargs)

    return recorded


def datamodule_hook(profiler: Profiler | None, datamodule: Any, name: str) -> Callable[..., Any]:
    """``datamodule.<name>`` (``prepare_data``, ``setup``, ``teardown``, ``state_dict``, ...), each call recorded
    under Lightning's action name ``[LightningDataModule]{class}.{name}`` (it times them whether overridden or not).

    Example:
        >>> from trainer import DataModule
        >>> profiler = SimpleProfiler()
        >>> datamodule_hook(profiler, DataModule(), "state_dict")()
        {}
        >>> list(profiler.recorded_durations)
        ['[LightningDataModule]DataModule.state_dict']
    """
    return profiled(profiler, f"[LightningDataModule]{type(datamodule).__name__}.{name}", getattr(datamodule, name))


def profiled_iter(profiler: Profiler | None, action_name: str, iterable: Iterable[T]) -> Iterable[T]:
    """``iterable`` with each fetch recorded as ``action_name`` (``iterable`` itself without a profiler)."""
    return iterable if profiler is None or not profiler.records else profiler.iterate(action_name, iterable)


@contextlib.contextmanager
def run_profiler(profiler: Profiler | None, stage: str, accelerator: Any) -> Iterator[None]:
    """Set ``profiler`` up for one run (this process's rank, the run folder) and describe it when the run ends
    (also after an error)."""
    if profiler is None or not profiler.records:
        yield
        return
    profiler.setup(stage, accelerator.process_index, accelerator.logging_dir or accelerator.project_dir)
    try:
        yield
    finally:
        profiler.describe()


__all__ = [
    "PROFILERS",
    "AdvancedProfiler",
    "PassThroughProfiler",
    "Profiler",
    "PyTorchProfiler",
    "SimpleProfiler",
    "datamodule_hook",
    "profile",
    "profiled",
    "profiled_iter",
    "resolve_profiler",
    "run_profiler",
]
