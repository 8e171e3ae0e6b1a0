"""The ``accelerate.utils`` names a ported script imports: ``from engine.utils import ...``.

>>> from engine.utils import ProfileKwargs, find_executable_batch_size, is_schedulefree_available
>>> isinstance(is_schedulefree_available(), bool)
True
"""

from __future__ import annotations

import importlib.util

from engine.memory import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)
from engine.profiler import ProfileKwargs
from engine.random import set_seed

__all__ = ["ProfileKwargs", "clear_device_cache", "find_executable_batch_size", "is_schedulefree_available",
           "release_memory", "set_seed", "should_reduce_batch_size"]


def is_schedulefree_available() -> bool:
    """Whether the ``schedulefree`` package (schedule-free optimizers) can be imported; imports nothing."""
    return importlib.util.find_spec("schedulefree") is not None
