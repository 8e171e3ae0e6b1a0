"""`SimpleProfiler`: wall time per action, as a table of mean / calls / total / share (Lightning's layout)."""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict

from trainer.profiling.base import Profiler


class SimpleProfiler(Profiler):
    """Times every action with ``time.perf_counter``.

    Args:
        dirpath / filename: see ``Profiler``.
        extended: add the number of calls and each action's share of the run's time.

    Example:
        >>> profiler = SimpleProfiler()
        >>> for _ in range(3):
        ...     with profiler.profile("step"):
        ...         pass
        >>> len(profiler.recorded_durations["step"])
        3
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None,
                 extended: bool = True) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"SimpleProfiler: action {action_name!r} was started twice without a stop in between.")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        begun = self.current_actions.pop(action_name, None)
        if begun is None:
            raise ValueError(f"SimpleProfiler: action {action_name!r} was stopped but never started.")
        self.recorded_durations[action_name].append(end - begun)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        self.start_time = time.perf_counter()

    def summary(self) -> str:
        if not self.recorded_durations:
            return ""
        sep = os.linesep
        title = (f"{self._stage.upper()} " if self._stage else "") + "Profiler Report" + sep
        width = max(len(k) for k in self.recorded_durations)
        rows = []
        for action, durations in self.recorded_durations.items():
            total = math.fsum(durations)
            rows.append((action, total / len(durations), len(durations), total))
        if not self.extended:
            rows.sort(key=lambda r: r[1], reverse=True)
            header = _row(width, "Action", "Mean duration (s)", "Total time (s)")
            line = sep + "-" * len(header.expandtabs())
            body = "".join(_row(width, a, f"{mean:.5}", f"{total:.5}") for a, mean, _, total in rows)
            return title + line + header + line + body + line + sep
        elapsed = time.perf_counter() - self.start_time
        rows.sort(key=lambda r: r[3], reverse=True)
        header = _row(width, "Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
        line = sep + "-" * len(header.expandtabs())
        total_row = _row(width, "Total", "-", str(sum(r[2] for r in rows)), f"{elapsed:.5}", "100 %")
        body = "".join(_row(width, a, f"{mean:.5}", str(n), f"{total:.5}", f"{100.0 * total / elapsed:.5}")
                       for a, mean, n, total in rows)
        return title + line + header + line + total_row + line + body + line + sep

    def teardown(self, stage: str | None) -> None:
        self.current_actions.clear()


def _row(width: int, action: str, *cells: str) -> str:
    return f"{os.linesep}|  {action:<{width}s}\t|" + "".join(f"  {cell:<15}\t|" for cell in cells)
