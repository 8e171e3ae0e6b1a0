"""``get_logger``: a ``logging`` adapter that logs on the main process only, or on every process in rank order.

Accelerate's ``accelerate.logging.get_logger`` contract: every call takes ``main_process_only=True`` (log only on
the main process) and ``in_order=False`` (``True``: every process logs, one after the other, rank 0 first; this
waits at a barrier per rank, so every process must make the call). Messages are prefixed with ``[RANK i]``.

>>> from engine import PartialState
>>> _ = PartialState()
>>> logger = get_logger("demo", log_level="INFO")
>>> logger.info("loaded %d samples", 10)  # the main process only
>>> logger.info("shard ready", main_process_only=False)  # every process
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from engine.environment import read_log_level
from engine.state import PartialState

__all__ = ["MultiProcessAdapter", "get_logger"]

_LEVELS = ("CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET")


class MultiProcessAdapter(logging.LoggerAdapter):
    """A logger adapter whose calls accept ``main_process_only`` and ``in_order`` (see the module docstring)."""

    def __init__(self, logger: logging.Logger, extra: dict[str, Any] | None = None) -> None:
        super().__init__(logger, extra or {})
        self._warned: set[tuple[Any, ...]] = set()

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        msg, kwargs = super().process(msg, kwargs)
        kwargs.setdefault("stacklevel", 2)  # report the caller's file and line, not this adapter's
        return f"[RANK {PartialState().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log ``msg``; ``main_process_only=True`` (default) logs on the main process, ``in_order=True`` on
        every process in rank order (``main_process_only`` is then ignored)."""
        if PartialState._shared is None:  # constructing PartialState here would start the process group
            raise RuntimeError("get_logger(...) logs per process: create the Accelerator (or PartialState()) "
                               "before logging through it.")
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, options = self.process(msg, kwargs)
        state = PartialState()
        if in_order:
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    self.logger.log(level, msg, *args, **options)
                state.wait_for_everyone()
        elif not main_process_only or state.is_main_process:
            self.logger.log(level, msg, *args, **options)

    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` that emits a given message (same arguments) only once per logger."""
        key = (args, tuple(sorted(kwargs.items())))
        if key not in self._warned:
            self._warned.add(key)
            self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A multi-process logger for ``name``; ``log_level`` (else ``$ACCELERATE_LOG_LEVEL``) sets its level.

    Unlike Accelerate, the root logger's level is left alone: setting a level for one logger must not change
    what every other library logs.
    """
    if log_level is None:
        log_level = read_log_level()
    logger = logging.getLogger(name)
    if log_level is not None:
        if str(log_level).upper() not in _LEVELS:
            raise ValueError(f"get_logger(log_level={log_level!r}) is not a logging level: use one of "
                             f"{', '.join(_LEVELS[:-1])}.")
        logger.setLevel(str(log_level).upper())
    return MultiProcessAdapter(logger, {})
