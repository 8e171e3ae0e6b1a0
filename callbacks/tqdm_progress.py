"""`TQDMProgressBar`: Lightning's name and arguments for Ember's tqdm progress bar."""

from __future__ import annotations

from typing import IO

from callbacks.progress import ProgressBar


class TQDMProgressBar(ProgressBar):
    """Ember's ``ProgressBar`` (tqdm bars on a terminal, one line per epoch elsewhere) with Lightning's
    ``TQDMProgressBar`` arguments.

    Args:
        refresh_rate: redraw every N batches (0: no bar).
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
        super().__init__(refresh_rate=refresh_rate, stream=stream)
        if not isinstance(process_position, int) or isinstance(process_position, bool) or process_position < 0:
            raise ValueError(f"TQDMProgressBar(process_position=...) must be an int >= 0. Received: "
                             f"{process_position!r}.")
        self.process_position = process_position
        self.leave = leave
