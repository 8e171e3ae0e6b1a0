"""The batch-size search behind ``Tuner.scale_batch_size`` and ``BatchSizeFinder``: which sizes to try, in what order,
what counts as running out of memory, and where the size is read and written.

The rules are Lightning 2.6's (a test checks the sizes tried and the messages against values recorded from it):

- ``"power"`` doubles after each trial that fits; the first out-of-memory halves the size and ends the search
  once something has fit (before that it keeps halving). ``max_trials`` counts trials (0: none is run).
- ``"binsearch"`` doubles until a trial fails, then bisects between the largest size that fit and the smallest
  that failed; ``max_trials`` counts the trials that fit (failures do not count, and at least one trial runs). The
  result is then reduced by ``margin`` (5%: a safety buffer).
- A size reaching ``max_val`` ends the search without a trial; a size at or above the dataset's length is not
  grown further (a larger batch would hold the same samples).

Two deliberate differences: the doubling of ``"power"`` is capped at ``max_val`` (Lightning caps it at 8192 and
can return a size above ``max_val``), and a failed size is always halved (Lightning keeps a failed size when it
is at least the dataset's length, which can return it or retry it forever).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

MODES = ("power", "binsearch")
METHODS = ("fit", "validate", "test", "predict")
DEFAULT_MAX_VAL = 8192
# Lightning's out-of-memory messages (a RuntimeError with this one argument): CUDA's, cuDNN's and the CPU allocator's.
_CUDA, _OUT_OF_MEMORY = "CUDA", "out of memory"
_CUDNN = "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED."
_CPU = "DefaultCPUAllocator: can't allocate memory"


def is_oom_error(error: BaseException) -> bool:
    """Whether ``error`` means the batch did not fit: a ``RuntimeError`` whose one argument holds "CUDA" and "out of
    memory" (``torch.cuda.OutOfMemoryError`` too), cuDNN's ``CUDNN_STATUS_NOT_SUPPORTED.`` or the CPU allocator's
    "can't allocate memory" (Lightning's test), or a ``MemoryError`` (Ember's addition: Python's own on the CPU).

    Example:
        >>> is_oom_error(RuntimeError("CUDA error: out of memory")), is_oom_error(RuntimeError("out of memory"))
        (True, False)
    """
    if isinstance(error, MemoryError):
        return True
    if not isinstance(error, RuntimeError) or len(error.args) != 1 or not isinstance(error.args[0], str):
        return False
    text = error.args[0]
    return (_CUDA in text and _OUT_OF_MEMORY in text) or _CUDNN in text or _CPU in text


def attribute_holders(module: Any, datamodule: Any, name: str) -> list[Any]:
    """Every holder of ``name``, in Lightning's order: the module, its hparams, the data module, its hparams.

    The size is read from the last of them and written to all (Lightning's ``lightning_getattr`` / ``setattr``).

    Example:
        >>> class Holder:
        ...     batch_size, hparams = 4, {"batch_size": 4}
        >>> [type(h).__name__ for h in attribute_holders(Holder(), None, "batch_size")]
        ['Holder', 'dict']
    """
    holders: list[Any] = []
    for owner in (module, datamodule):
        if owner is None:
            continue
        if hasattr(owner, name):
            holders.append(owner)
        hparams = getattr(owner, "hparams", None)
        if hparams is not None and name in hparams:
            holders.append(hparams)
    return holders


def read_size(holders: list[Any], name: str) -> Any:
    holder = holders[-1]
    return holder[name] if isinstance(holder, dict) else getattr(holder, name)


def write_size(holders: list[Any], name: str, value: int) -> None:
    for holder in holders:
        if isinstance(holder, dict):
            holder[name] = value
        else:
            setattr(holder, name, value)


class SizeSearch:
    """One search: ``fits(size)`` runs a trial (True: it fit; False: out of memory); ``dataset_length`` (None:
    unknown) stops the growth. ``run()`` returns the size found; every size tried is written with ``write``.

    Example:
        >>> tried = []
        >>> def fits(size):
        ...     tried.append(size)
        ...     return size <= 20
        >>> SizeSearch(fits, write=lambda s: None, start=2, dataset_length=None, mode="binsearch",
        ...            init_val=4, max_trials=25, margin=0.05, max_val=8192).run(), tried
        (19, [4, 8, 16, 32, 24, 20, 22, 21])
    """

    def __init__(self, fits: Callable[[int], bool], write: Callable[[int], None], start: int,
                 dataset_length: int | None, mode: str, init_val: int, max_trials: int, margin: float,
                 max_val: int) -> None:
        self.fits, self.write, self.dataset_length = fits, write, dataset_length
        self.mode, self.max_trials, self.margin, self.max_val = mode, max_trials, margin, max_val
        self.size = start
        self._adjust(value=init_val, cap=DEFAULT_MAX_VAL)  # as Lightning: not when ``start`` covers the dataset

    def _adjust(self, *, value: int | None = None, factor: float = 1.0, desc: str | None = None,
                cap: int = DEFAULT_MAX_VAL, grow: bool = True) -> bool:
        """Move to ``value`` (or ``factor`` times the size); returns whether the size changed."""
        current = self.size
        if grow and self.dataset_length is not None and current >= self.dataset_length:
            log.info(f"The batch size {current} is greater or equal than the length of your dataset: "
                     f"{self.dataset_length}.")
            return False
        new = value if value is not None else int(current * factor)
        if new > cap:
            if desc:
                log.info(f"Batch size {new} exceeds max_val limit {cap}, capping at {cap}")
            new = cap
        if desc:
            log.info(f"Batch size {current} {desc}, trying batch size {new}")
        self.size = new
        self.write(new)
        return new != current

    def _below_max(self) -> bool:
        if self.size >= self.max_val:
            log.info(f"Reached the maximum batch size limit of {self.max_val}. Stopping search.")
            return False
        return True

    def run(self) -> int:
        size = self._power() if self.mode == "power" else self._binsearch()
        log.info(f"Finished batch size finder, will continue with full run using batch size {size}")
        return size

    def _power(self) -> int:
        any_fit = False
        for trial in range(self.max_trials):
            if not self._below_max():
                break
            if self.fits(self.size):
                if trial + 1 >= self.max_trials:
                    break  # the last trial: keep the size that fit
                if not self._adjust(factor=2.0, desc="succeeded", cap=self.max_val):
                    break
                any_fit = True
            else:
                self._adjust(factor=0.5, desc="failed", grow=False)
                if any_fit:
                    break  # half of the failed size: the last one that fit
        return self.size

    def _binsearch(self) -> int:
        low, high, fitted = 1, None, 0
        while self._below_max():
            if self.fits(self.size):
                fitted += 1
                if fitted >= self.max_trials:
                    break
                low = self.size
                if high is None:
                    changed = self._adjust(factor=2.0, desc="succeeded", cap=self.max_val)
                elif high - low <= 1:
                    break
                else:
                    changed = self._adjust(value=(high + low) // 2, desc="succeeded", cap=self.max_val)
                if not changed:
                    break
            else:
                high = self.size
                self._adjust(value=(high + low) // 2, desc="failed", grow=False)
                if high - low <= 1:
                    break
        if self.margin > 0:
            reduced = max(1, int(self.size * (1 - self.margin)))
            if reduced != self.size:
                log.info(f"Applying margin of {self.margin:.1%}, reducing batch size from {self.size} to {reduced}")
                self.size = reduced
                self.write(reduced)
        return self.size


def check_search_arguments(mode: str, steps_per_trial: int, init_val: int, max_trials: int, margin: float,
                           max_val: int) -> str:
    """Validate the search's arguments (Lightning's texts first); returns ``mode`` in lower case."""
    if not isinstance(mode, str) or mode.lower() not in MODES:
        raise ValueError(f"`mode` should be either of {MODES}. Received: mode={mode!r}.")
    for name, value, least in (("steps_per_trial", steps_per_trial, 1), ("init_val", init_val, 1),
                               ("max_trials", max_trials, 0), ("max_val", max_val, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"`{name}` must be an int >= {least}. Received: {name}={value!r}.")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < 1.0:
        raise ValueError(f"`margin` should be between 0 and 1. Found margin={margin!r}.")
    return mode.lower()


def free_memory(out_of_memory: bool) -> None:
    """Release what a trial left before the next one (Lightning's garbage collection between trials).

    A full collection runs after a trial that ran out of memory (its tensors can be held in reference cycles
    through the error's traceback) and wherever CUDA caches memory. After a trial that fit on the CPU, reference
    counting has already freed its tensors, and a full collection in a process that imported torch costs about
    0.3 s per trial (most of a CPU search's time), so none runs.
    """
    if not out_of_memory and not torch.cuda.is_available():
        return
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
