"""``rank_zero_only`` and the ``rank_zero_*`` messages, with Lightning's names and semantics.

``rank_zero_only.rank`` is read from the launcher's environment at import (``RANK``, then ``LOCAL_RANK``,
``SLURM_PROCID``, ``JSM_NAMESPACE_RANK``; 0 when none is set), as Lightning does, and the Trainer sets it to the
engine's process index when a run starts, so code decorated before the process group exists still sees the
right rank.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

log = logging.getLogger("trainer")

_RANK_KEYS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def _rank_from_environment() -> int:
    # SLURM_PROCID may be set when SLURM does not manage the processes, so RANK / LOCAL_RANK win (Lightning's order).
    for key in _RANK_KEYS:
        value = os.environ.get(key)
        if value is not None:
            return int(value)
    return 0


class _RankZeroOnly:
    """The ``rank_zero_only`` decorator, holding the global ``rank`` it compares with (Lightning keeps it as an
    attribute of its function; an object gives the attribute a declared type)."""

    rank: int | None

    def __init__(self) -> None:
        self.rank = _rank_from_environment()

    def __call__(self, fn: Callable[P, T], default: T | None = None) -> Callable[P, T | None]:
        """Decorate ``fn`` so that it runs on global rank 0 only; other ranks get ``default``.

        Example:
            >>> @rank_zero_only
            ... def hello() -> str:
            ...     return "from rank 0"
            >>> hello() if rank_zero_only.rank == 0 else "from rank 0"
            'from rank 0'
        """

        @wraps(fn)
        def wrapped(*args: P.args, **kwargs: P.kwargs) -> T | None:
            rank = getattr(self, "rank", None)
            if rank is None:
                raise RuntimeError("rank_zero_only.rank is not set: set `rank_zero_only.rank = <global rank>` first "
                                   "(the Trainer does it when a run starts).")
            return fn(*args, **kwargs) if rank == 0 else default

        return wrapped


rank_zero_only = _RankZeroOnly()


@rank_zero_only
def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.debug`` on global rank 0 only (logger ``"trainer"``)."""
    log.debug(*args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.info`` on global rank 0 only (logger ``"trainer"``)."""
    log.info(*args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """``warnings.warn`` on global rank 0 only.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     rank_zero_warn("careful")
        >>> [str(w.message) for w in caught] if rank_zero_only.rank == 0 else ["careful"]
        ['careful']
    """
    warnings.warn(message, stacklevel=stacklevel, **kwargs)


class LightningDeprecationWarning(DeprecationWarning):
    """The category of the trainer's deprecation warnings (Lightning's name), so a filter can single them out."""


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    """A ``LightningDeprecationWarning`` on global rank 0 only.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     rank_zero_deprecation("old")
        >>> [w.category.__name__ for w in caught] if rank_zero_only.rank == 0 else ["LightningDeprecationWarning"]
        ['LightningDeprecationWarning']
    """
    category = kwargs.pop("category", LightningDeprecationWarning)
    rank_zero_warn(message, stacklevel=stacklevel, category=category, **kwargs)


def rank_prefixed_message(message: str, rank: int | None) -> str:
    """``"[rank: X] message"`` (unchanged when ``rank`` is None)."""
    return message if rank is None else f"[rank: {rank}] {message}"
