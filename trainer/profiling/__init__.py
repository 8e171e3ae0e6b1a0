"""Profilers with Lightning's names: ``Trainer(profiler="simple" | "advanced" | "pytorch" | a Profiler)``.

Actions the trainer times: every overridden hook (``[Callback]{class}.{hook}``, ``[TrainModule]{class}.{hook}``),
``run_training_batch``, ``train_dataloader_next``, ``optimizer_step``, the evaluation steps and data fetches
(``[validation|test|predict]_step``, ``..._dataloader_next``) and ``save_checkpoint``.
"""

from __future__ import annotations

import difflib
from trainer.profiling.advanced import AdvancedProfiler
from trainer.profiling.base import PassThroughProfiler, Profiler
from trainer.profiling.pytorch import PyTorchProfiler
from trainer.profiling.simple import SimpleProfiler

PROFILERS: dict[str, type[Profiler]] = {"simple": SimpleProfiler, "advanced": AdvancedProfiler,
                                        "pytorch": PyTorchProfiler, "passthrough": PassThroughProfiler}


def resolve_profiler(profiler: Profiler | str | None) -> Profiler | None:
    """The ``Profiler`` for ``Trainer(profiler=...)``: an instance, a name, or ``None`` (no profiling at all).

    Example:
        >>> type(resolve_profiler("simple")).__name__
        'SimpleProfiler'
    """
    if profiler is None or isinstance(profiler, Profiler):
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


__all__ = ["AdvancedProfiler", "PROFILERS", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler",
           "resolve_profiler"]
