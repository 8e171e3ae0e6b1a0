"""`PyTorchProfiler`: ``torch.profiler`` over the run, each action a ``record_function`` range, with a
chrome / TensorBoard trace in the run folder and the operator table as the summary."""

from __future__ import annotations

import os
from typing import Any

import torch

from trainer.profiling.base import Profiler

_STEP_ACTION = "run_training_batch"  # a schedule advances once per training batch


class PyTorchProfiler(Profiler):
    """Operator-level CPU (and CUDA) timings from ``torch.profiler.profile``.

    Args:
        dirpath / filename: see ``Profiler``; the trace is ``{stage}-{filename}-{rank}.pt.trace.json`` there.
        export_to_chrome: write the trace (open it in ``chrome://tracing``, Perfetto or TensorBoard's profile
            plugin).
        row_limit: rows of the operator table in the summary.
        sort_by_key: the table's sort column (default ``"cuda_time_total"`` on a GPU, else ``"cpu_time_total"``).
        group_by_input_shapes: one table row per operator and input shapes (needs ``record_shapes=True``).
        **profiler_kwargs: passed to ``torch.profiler.profile`` (``record_shapes``, ``profile_memory``,
            ``with_stack``, ``activities``, ``schedule``...). With a ``schedule`` the profiler steps once per
            training batch and each finished cycle is written by ``torch.profiler.tensorboard_trace_handler``
            into ``dirpath`` (unless you pass ``on_trace_ready``).

    Example:
        >>> profiler = PyTorchProfiler(export_to_chrome=False, row_limit=5)
        >>> with profiler.profile("matmul"):
        ...     _ = torch.ones(8, 8) @ torch.ones(8, 8)
        >>> profiler.stop_profiling()
        >>> "matmul" in profiler.summary()
        True
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None,
                 export_to_chrome: bool = True, row_limit: int = 20, sort_by_key: str | None = None,
                 group_by_input_shapes: bool = False, **profiler_kwargs: Any) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        if not isinstance(row_limit, int) or row_limit == 0 or row_limit < -1:
            raise ValueError(f"PyTorchProfiler(row_limit=...) must be a positive int or -1 (all rows). Received: "
                             f"{row_limit!r}.")
        self.export_to_chrome = export_to_chrome
        self.row_limit = row_limit
        self.sort_by_key = sort_by_key or ("cuda_time_total" if torch.cuda.is_available() else "cpu_time_total")
        self.group_by_input_shapes = group_by_input_shapes
        self.profiler_kwargs = profiler_kwargs
        self.trace_paths: list[str] = []
        self._profiler: torch.profiler.profile | None = None
        self._ranges: dict[str, list[Any]] = {}
        self._events: Any = None

    def _ensure_started(self) -> torch.profiler.profile:
        if self._profiler is None:
            kwargs = dict(self.profiler_kwargs)
            kwargs.setdefault("activities", [torch.profiler.ProfilerActivity.CPU]
                              + ([torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []))
            if "schedule" in kwargs and "on_trace_ready" not in kwargs and self.dirpath:
                worker = self._prepare_filename(extension="")
                kwargs["on_trace_ready"] = torch.profiler.tensorboard_trace_handler(self.dirpath, worker_name=worker)
            self._profiler = torch.profiler.profile(**kwargs)
            self._profiler.__enter__()
            self._events = None
        return self._profiler

    def start(self, action_name: str) -> None:
        self._ensure_started()
        scope = torch.profiler.record_function(action_name)
        scope.__enter__()
        self._ranges.setdefault(action_name, []).append(scope)

    def stop(self, action_name: str) -> None:
        scopes = self._ranges.get(action_name)
        if not scopes:
            raise ValueError(f"PyTorchProfiler: action {action_name!r} was stopped but never started.")
        scopes.pop().__exit__(None, None, None)
        if action_name == _STEP_ACTION and self._profiler is not None and "schedule" in self.profiler_kwargs:
            self._profiler.step()

    def stop_profiling(self) -> None:
        """Stop recording, keep the events for ``summary`` and write the chrome trace (no schedule)."""
        profiler = self._profiler
        if profiler is None:
            return
        for scopes in self._ranges.values():
            while scopes:
                scopes.pop().__exit__(None, None, None)
        profiler.__exit__(None, None, None)
        self._profiler = None
        if "schedule" in self.profiler_kwargs:
            # Each finished cycle went to on_trace_ready; the table shows the last one (none if no cycle ended).
            self._events = profiler.key_averages(group_by_input_shape=self.group_by_input_shapes) \
                if profiler.profiler is not None else None
            return
        self._events = profiler.key_averages(group_by_input_shape=self.group_by_input_shapes)
        if self.export_to_chrome and self.dirpath:
            os.makedirs(self.dirpath, exist_ok=True)
            path = os.path.join(self.dirpath, self._prepare_filename(extension=".pt.trace.json"))
            profiler.export_chrome_trace(path)
            self.trace_paths.append(path)

    def summary(self) -> str:
        if self._events is None:
            return ""
        table = self._events.table(sort_by=self.sort_by_key, row_limit=self.row_limit)
        return self._stats_to_str({"records": table})

    def describe(self) -> None:
        self.stop_profiling()
        super().describe()

    def teardown(self, stage: str | None) -> None:
        self.stop_profiling()
        self._events = None
        self._ranges.clear()
