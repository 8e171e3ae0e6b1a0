"""Out-of-memory helpers: ``find_executable_batch_size`` retries a function with a smaller batch size on OOM.

Accelerate's ``accelerate.utils.find_executable_batch_size`` contract: the decorated function takes the batch
size as its first argument, which the decorator supplies (calling it with one yourself is a ``TypeError``); on an
out-of-memory error the device cache is freed and the function runs again with ``reduce_batch_size_fn()``, by
default the batch size times 0.9 (rounded down); reaching 0 raises ``RuntimeError``. Other errors propagate.

>>> @find_executable_batch_size(starting_batch_size=64)
... def fit(batch_size):
...     if batch_size > 50:
...         raise MemoryError("simulated")
...     return batch_size
>>> fit()
45
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]

# The messages torch's allocators raise with (CUDA/HIP/XPU, MPS, cuDNN's unsupported-size failure, CPU, HPU).
_OOM_STATEMENTS = (" out of memory.", "MPS backend out of memory", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
                   "DefaultCPUAllocator: can't allocate memory", "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed")


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` says memory ran out: ``torch.OutOfMemoryError``, ``MemoryError``, or an allocator
    ``RuntimeError`` (CUDA, MPS, CPU, cuDNN's unsupported-size error)."""
    if isinstance(exception, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return any(statement in exception.args[0] for statement in _OOM_STATEMENTS)
    return False


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return cached accelerator memory to the device (``gc.collect()`` first when asked: slow)."""
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.empty_cache()
    elif torch.backends.mps.is_available():
        torch.mps.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop references to ``objects`` and free the device cache; reassign the result: ``a, b = release_memory(a, b)``.

    >>> model, optimizer = release_memory(torch.nn.Linear(2, 2), None)
    >>> (model, optimizer)
    (None, None)
    """
    count = len(objects)
    del objects  # this frame's reference to them: the objects the caller reassigns can be freed below
    clear_device_cache(garbage_collection=True)
    return [None] * count


def find_executable_batch_size(function: Callable[..., Any] | None = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[[], int] | None = None) -> Any:
    """Decorator: call ``function(batch_size, ...)`` from ``starting_batch_size`` down until it fits in memory.

    Args:
        function: the function to wrap (omit it to use the decorator with arguments).
        starting_batch_size: the first batch size tried.
        reduce_batch_size_fn: returns the next batch size after an out-of-memory error (no arguments); default:
            the current one times 0.9, rounded down.

    ``wrapped.batch_size`` holds the batch size that was last tried (the one that ran, after a success).
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    if isinstance(starting_batch_size, bool) or not isinstance(starting_batch_size, int) or starting_batch_size < 1:
        raise ValueError(f"find_executable_batch_size(starting_batch_size=...) needs an int >= 1, got "
                         f"{starting_batch_size!r}.")
    batch_size = starting_batch_size

    def shrink() -> int:
        return int(batch_size * 0.9)

    reduce = reduce_batch_size_fn if reduce_batch_size_fn is not None else shrink

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            given = ", ".join(f"{name}={value!r}" for name, value in zip(params[1:], args[1:]))
            raise TypeError(f"Batch size was passed into `{function.__name__}` as the first argument when called. "
                            f"Remove it, the decorator already passes it: `{function.__name__}({given})`.")
        while True:
            if batch_size <= 0:
                raise RuntimeError(f"No executable batch size found for `{function.__name__}`: every size from "
                                   f"{starting_batch_size} down ran out of memory, reached {batch_size}.")
            decorator.batch_size = batch_size  # type: ignore[attr-defined]  # Accelerate's attribute on the function
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
            # Out of the except block, the error's traceback (holding the failed attempt's tensors) is gone.
            clear_device_cache(garbage_collection=True)
            batch_size = int(reduce())

    return decorator
