"""`AdvancedProfiler`: a ``cProfile`` profile per action, reported with ``pstats`` (Lightning's layout)."""

from __future__ import annotations

import cProfile
import io
import os
import pstats

from trainer.profiling.base import Profiler


class AdvancedProfiler(Profiler):
    """Function-level statistics of every action, one ``cProfile.Profile`` each.

    Nested actions (a hook inside a step) are attributed to the innermost one; the enclosing action's profile
    resumes when the inner one stops (Python allows one active profiler at a time).

    Args:
        dirpath / filename: see ``Profiler``.
        line_count_restriction: functions listed per action: an int count or a fraction in (0, 1].
        dump_stats: also write each action's raw profile to ``{stage}-{filename}-{rank}-{action}.prof``.

    Example:
        >>> profiler = AdvancedProfiler(line_count_restriction=3)
        >>> with profiler.profile("sum"):
        ...     _ = sum(range(1000))
        >>> "Profile stats for: sum" in profiler.summary()
        True
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None,
                 line_count_restriction: float = 1.0, dump_stats: bool = False) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        if isinstance(line_count_restriction, bool) or not isinstance(line_count_restriction, (int, float)) or \
                line_count_restriction <= 0:
            raise ValueError("AdvancedProfiler(line_count_restriction=...) must be an int count or a fraction in "
                             f"(0, 1]. Received: {line_count_restriction!r}.")
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self._active: list[str] = []

    def start(self, action_name: str) -> None:
        if self._active:
            self.profiled_actions[self._active[-1]].disable()
        self._active.append(action_name)
        self.profiled_actions.setdefault(action_name, cProfile.Profile()).enable()

    def stop(self, action_name: str) -> None:
        profile = self.profiled_actions.get(action_name)
        if profile is None or action_name not in self._active:
            raise ValueError(f"AdvancedProfiler: action {action_name!r} was stopped but never started.")
        profile.disable()
        self._active.remove(action_name)
        if self._active:
            self.profiled_actions[self._active[-1]].enable()

    def summary(self) -> str:
        stats = {}
        for action, profile in self.profiled_actions.items():
            if self.dump_stats and self.dirpath:
                os.makedirs(self.dirpath, exist_ok=True)
                profile.dump_stats(os.path.join(self.dirpath, self._prepare_filename(action, ".prof")))
            stream = io.StringIO()
            pstats.Stats(profile, stream=stream).strip_dirs().sort_stats("cumulative").print_stats(
                self.line_count_restriction)
            stats[action] = stream.getvalue()
        return self._stats_to_str(stats) if stats else ""

    def teardown(self, stage: str | None) -> None:
        for action in reversed(self._active):
            self.profiled_actions[action].disable()
        self._active.clear()
        self.profiled_actions.clear()
