"""`TQDMProgressBar`: Lightning's name and arguments for Ember's tqdm progress bar; `Tqdm`, the bars' class."""

from __future__ import annotations

import os
from typing import IO, Any

from callbacks.progress import ProgressBar
from callbacks.tqdm_format import tqdm_class


def __getattr__(name: str) -> Any:
    # ``Tqdm`` is made on first use (it imports tqdm); a test may replace it here (mock.patch) for every bar.
    if name == "Tqdm":
        return tqdm_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_refresh_rate(refresh_rate: int) -> int:
    """Lightning's environment overrides of a bar's refresh rate: on Google Colab (``COLAB_GPU`` set) the default
    1 becomes 20 (faster redraws crash its notebooks); ``TQDM_MINITERS`` raises the rate to at least its value.

    Example:
        >>> resolve_refresh_rate(5)
        5
    """
    if os.environ.get("COLAB_GPU") and refresh_rate == 1:
        return 20
    miniters = os.environ.get("TQDM_MINITERS")
    if miniters is not None:
        try:
            return max(int(miniters), refresh_rate)
        except ValueError:
            raise ValueError(f"TQDM_MINITERS must be an int (the fewest batches between two redraws). Received: "
                             f"{miniters!r}; unset it or set e.g. TQDM_MINITERS=10.") from None
    return refresh_rate


class TQDMProgressBar(ProgressBar):
    """Ember's ``ProgressBar`` (tqdm bars on a terminal, one line per epoch elsewhere) with Lightning's
    ``TQDMProgressBar`` arguments.

    Args:
        refresh_rate: redraw every N batches (0: no bar); raised by ``COLAB_GPU`` / ``TQDM_MINITERS`` as in
            Lightning (``resolve_refresh_rate``).
        process_position: accepted for Lightning compatibility (a bar's line offset when several processes draw;
            only the main process draws here).
        leave: keep the epoch bars on screen after each epoch (Ember keeps them; ``False`` is accepted).
        stream: where to write (Ember's addition; default ``sys.stdout``).

    Example:
        >>> bar = TQDMProgressBar(refresh_rate=5)
        >>> bar.refresh_rate, bar.process_position, bar.is_enabled
        (5, 0, True)
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False,
                 stream: IO[str] | None = None) -> None:
        if not isinstance(refresh_rate, int) or isinstance(refresh_rate, bool) or refresh_rate < 0:
            raise ValueError(f"TQDMProgressBar(refresh_rate=...) must be an int >= 0. Received: {refresh_rate!r}.")
        super().__init__(refresh_rate=resolve_refresh_rate(refresh_rate), stream=stream)
        if not isinstance(process_position, int) or isinstance(process_position, bool) or process_position < 0:
            raise ValueError(f"TQDMProgressBar(process_position=...) must be an int >= 0. Received: "
                             f"{process_position!r}.")
        self.process_position = process_position
        self.leave = leave
