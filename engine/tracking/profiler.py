"""``ProfileKwargs`` and ``Accelerator.profile()``: torch.profiler with Accelerate's settings and trace export.

>>> import tempfile, torch
>>> from engine import Accelerator
>>> folder = tempfile.mkdtemp()
>>> accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(record_shapes=True, output_trace_dir=folder)])
>>> with accelerator.profile() as prof:
...     _ = torch.ones(8, 8) @ torch.ones(8, 8)
>>> import os; os.listdir(folder)
['profile_0.json']
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from engine.config import KwargsHandler
from engine.keywords import suggest_keywords

if TYPE_CHECKING:
    from torch.profiler import profile as TorchProfile

__all__ = ["PROFILE_PATTERN_NAME", "ProfileKwargs", "profile"]

PROFILE_PATTERN_NAME = "profile_{suffix}.json"  # Accelerate's name: one Chrome trace per process index


def _activities() -> dict[str, Any]:
    """The activity names this torch build can profile here."""
    activity = torch.profiler.ProfilerActivity
    found = {"cpu": activity.CPU, "cuda": activity.CUDA}
    if hasattr(activity, "XPU") and hasattr(torch, "xpu") and torch.xpu.is_available():
        found["xpu"] = activity.XPU
    if hasattr(activity, "MTIA") and hasattr(torch, "mtia") and torch.mtia.is_available():
        found["mtia"] = activity.MTIA
    if hasattr(activity, "HPU") and hasattr(torch, "hpu") and torch.hpu.is_available():
        found["hpu"] = activity.HPU
    return found


@suggest_keywords
@dataclass
class ProfileKwargs(KwargsHandler):
    """How ``Accelerator.profile()`` builds its ``torch.profiler.profile`` (the same names as Accelerate's).

    Args:
        activities: what to record, among ``"cpu"``, ``"cuda"`` (and ``"xpu"``, ``"mtia"``, ``"hpu"`` where
            present); None lets torch choose (CPU, plus CUDA when available).
        schedule_option: ``torch.profiler.schedule`` arguments (``wait``, ``warmup``, ``active``, ``repeat``,
            ``skip_first``); then call ``prof.step()`` once per training step.
        on_trace_ready: called with the profiler whenever the schedule completes a recording.
        record_shapes, profile_memory, with_stack, with_flops, with_modules: torch.profiler's switches.
        output_trace_dir: a folder where each process writes ``profile_{process_index}.json`` (Chrome trace) when
            the ``profile()`` block ends.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def __post_init__(self) -> None:
        # Checked here, not when the profiler starts: a typo must not surface an hour into a run.
        if self.activities is not None:
            if isinstance(self.activities, str):
                raise ValueError(f"ProfileKwargs(activities=...) takes a list of names, got the string "
                                 f"{self.activities!r}: write activities=[{self.activities!r}].")
            available = _activities()
            unknown = [a for a in self.activities if a not in available]
            if unknown:
                raise ValueError(f"ProfileKwargs(activities={self.activities!r}): {unknown} cannot be profiled "
                                 f"here; choose among {sorted(available)}.")
        if self.schedule_option is not None:
            allowed = set(inspect.signature(torch.profiler.schedule).parameters)
            unknown = sorted(set(self.schedule_option) - allowed)
            if unknown:
                raise ValueError(f"ProfileKwargs(schedule_option={self.schedule_option!r}): unknown key(s) "
                                 f"{unknown}; torch.profiler.schedule takes {sorted(allowed)}.")

    def build(self) -> TorchProfile:
        """The ``torch.profiler.profile`` these settings describe (not started)."""
        available = _activities()
        activities = None if self.activities is None else [available[a] for a in self.activities]
        schedule = None if self.schedule_option is None else torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=self.on_trace_ready,
                                      record_shapes=self.record_shapes, profile_memory=self.profile_memory,
                                      with_stack=self.with_stack, with_flops=self.with_flops,
                                      with_modules=self.with_modules)


@contextlib.contextmanager
def profile(handler: ProfileKwargs | None, process_index: int,
            wait_for_everyone: Callable[[], None]) -> Iterator[TorchProfile]:
    """Profile the block with ``torch.profiler``; yields the profiler (``prof.step()``, ``key_averages()``).

    ``handler``: the settings (defaults without one). With ``output_trace_dir``, every process writes its Chrome
    trace there when the block ends (named by ``process_index``), then calls ``wait_for_everyone`` (so call it
    on every process).
    """
    handler = handler or ProfileKwargs()
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    profiler.export_chrome_trace(os.path.join(handler.output_trace_dir,
                                              PROFILE_PATTERN_NAME.format(suffix=process_index)))
    wait_for_everyone()
