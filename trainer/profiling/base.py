"""`Profiler`: Lightning's profiler interface (start / stop / profile / summary / describe) and the pass-through one.

The trainer names each action it times (a hook, a step, a data fetch, an optimizer step, a checkpoint) and calls
``start(name)`` / ``stop(name)`` around it; a profiler decides what to record. Only actions of a run with a
profiler are wrapped at all, so training without one pays nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class Profiler:
    """Base class of profilers: override ``start``, ``stop`` and ``summary``.

    Args:
        dirpath: where the per-rank summary file (and any trace) is written; default: the run folder
            (``trainer.log_dir``, else the project folder).
        filename: a name part for the files (``{stage}-{filename}-{rank}.txt``); default ``"profiler"``.

    The trainer calls ``setup(stage, rank, run_folder)`` when a run starts and ``describe()`` when it ends: the
    summary is printed on the main process and written to a file on every process.

    Example:
        >>> import time
        >>> class Counting(Profiler):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.calls: dict[str, int] = {}
        ...     def start(self, action_name: str) -> None:
        ...         self.calls[action_name] = self.calls.get(action_name, 0) + 1
        ...     def stop(self, action_name: str) -> None:
        ...         pass
        >>> profiler = Counting()
        >>> with profiler.profile("load data"):
        ...     time.sleep(0)
        >>> profiler.calls
        {'load data': 1}
    """

    records = True  # False: the trainer wraps nothing (PassThroughProfiler)

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None) -> None:
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.filename = filename
        self._stage: str | None = None
        self._local_rank: int | None = None
        self.output_paths: list[str] = []  # every summary file this profiler wrote

    def start(self, action_name: str) -> None:
        """An action begins."""
        raise NotImplementedError(f"{type(self).__name__} must define start(action_name).")

    def stop(self, action_name: str) -> None:
        """An action ends."""
        raise NotImplementedError(f"{type(self).__name__} must define stop(action_name).")

    def summary(self) -> str:
        """The report of what was recorded (empty: nothing to report)."""
        return ""

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """Record the body of a ``with`` block as ``action_name``."""
        self.start(action_name)
        try:
            yield action_name
        finally:
            self.stop(action_name)

    # -- what the trainer uses ---------------------------------------------------------------------------------
    def wrap(self, action_name: str, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` recorded as ``action_name`` at every call."""
        start, stop = self.start, self.stop

        @functools.wraps(fn)
        def profiled(*args: Any, **kwargs: Any) -> T:
            start(action_name)
            try:
                return fn(*args, **kwargs)
            finally:
                stop(action_name)

        # A partial's target stays visible through the wrapper.
        profiled.func = getattr(fn, "func", fn)  # type: ignore[attr-defined]  # an attribute on a function
        return profiled

    def iterate(self, action_name: str, iterable: Iterable[T]) -> Iterator[T]:
        """``iterable``'s items, each fetch (``next``) recorded as ``action_name``."""
        iterator = iter(iterable)
        while True:
            self.start(action_name)
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.stop(action_name)
            yield item

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """A run starts: ``stage`` (``"fit"``, ...), this process's rank and the run folder."""
        self._stage = stage
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """A run ended (after ``describe``): release what recording holds."""

    def describe(self) -> None:
        """Print the summary on the main process and write it to ``{dirpath}/{stage}-{filename}-{rank}.txt``."""
        summary = self.summary()
        if summary:
            if self._local_rank in (None, 0):
                print(summary)
            if self.dirpath:
                os.makedirs(self.dirpath, exist_ok=True)
                path = os.path.join(self.dirpath, self._prepare_filename())
                with open(path, "a", encoding="utf-8") as handle:
                    handle.write(summary)
                self.output_paths.append(path)
        self.teardown(self._stage)

    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        parts = [p for p in (self._stage, self.filename or "profiler") if p]
        if self._local_rank is not None:
            parts.append(str(self._local_rank))
        if action_name is not None:
            parts.append(action_name)
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t\[\] ]", "_", "-".join(parts))).strip("_")
        return (base or "profile") + extension

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        stage = f"{self._stage.upper()} " if self._stage is not None else ""
        lines = [stage + "Profiler Report"]
        for action, value in stats.items():
            rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
            lines += [f"Profile stats for: {action}{rank}", value]
        return os.linesep.join(lines)


class PassThroughProfiler(Profiler):
    """Records nothing: ``trainer.profiler`` without ``Trainer(profiler=...)`` (Lightning's default), so a module's
    ``with self.trainer.profiler.profile("name"):`` works either way; the trainer wraps nothing for it."""

    records = False

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass
