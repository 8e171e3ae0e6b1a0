"""Preemption signals: a handler that only raises a flag, acted on by the trainer at the next step boundary.

Work in a signal handler is unsafe (it interrupts arbitrary code, possibly inside a collective or a checkpoint
write), so the handler records the signal and returns; the trainer checks the flag where all processes meet.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

from trainer.plugins.environments import ClusterEnvironment

DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM,)
DEFAULT_EXIT_CODE = 128 + signal.SIGTERM  # 143: what a process ended by SIGTERM reports


class Preempted(SystemExit):
    """Raised by ``Trainer.fit`` after a preemption signal: the checkpoint is written and trackers finished.

    A ``SystemExit``, so an uncaught one ends the script with ``code`` (``Trainer(preemption_exit_code=...)``)
    and ``except Exception`` blocks let it through.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Interrupted(SystemExit):
    """Raised by ``Trainer.fit`` instead of ``KeyboardInterrupt`` (Ctrl-C): one line said what to do, no traceback.

    Exits with 130 (128 + SIGINT), as a shell reports a process ended by Ctrl-C; ``except Exception`` lets it
    through, as it does ``KeyboardInterrupt``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(128 + signal.SIGINT)
        self.message = message

    def __str__(self) -> str:
        return self.message


def resume_hint(folder: str | None) -> str:
    """What a stopped run leaves for the next start, and how to continue from it."""
    if folder is None:
        return "no checkpoint was saved yet, so running the same command again starts over."
    return f"the newest checkpoint is {folder}; run the same command with fit(..., ckpt_path='last') to resume from it."


@contextlib.contextmanager
def one_line_interrupt(state: Any, newest: Callable[[], str | None], is_main_process: bool) -> Iterator[None]:
    """Turn Ctrl-C inside the block into one line on stderr (where the run can resume from) and ``Interrupted``.

    ``state`` is the trainer's ``TrainState`` (read when the interrupt comes); ``newest`` finds the checkpoint a
    ``ckpt_path="last"`` resume would use.
    """
    try:
        yield
    except KeyboardInterrupt:
        message = f"Interrupted (Ctrl-C) at epoch {state.epoch}, step {state.global_step}: {resume_hint(newest())}"
        if is_main_process:
            print(message, file=sys.stderr, flush=True)
        raise Interrupted(message) from None


def check_signals(signals: Any) -> tuple[int, ...]:
    """``Trainer(preemption_signals=...)`` as a tuple of signal numbers (``None`` or ``()``: no handler)."""
    if signals is None:
        return ()
    items = [signals] if isinstance(signals, (int, str)) else list(signals)
    result = []
    for item in items:
        try:
            number = signal.Signals[item] if isinstance(item, str) else signal.Signals(item)
        except (KeyError, ValueError):
            raise ValueError(f"Trainer(preemption_signals=...) takes signal numbers or names such as "
                             f"signal.SIGTERM or 'SIGUSR1'. Received: {item!r}.") from None
        if number in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"Trainer(preemption_signals=...) cannot handle {number.name}: no process can catch it.")
        result.append(int(number))
    return tuple(dict.fromkeys(result))


class PreemptionHandler:
    """Installs a flag-only handler for ``signals`` while a ``with`` block runs; restores the old handlers after.

    A Python handler installed before the block is called too, when the signal arrives (Lightning composes them).
    Otherwise a signal that arrived but was not acted on inside the block (e.g. during the last epoch's end hooks)
    is re-raised on exit with the old handler in place, so it is never silently swallowed. Handlers can only be
    installed from the main thread; elsewhere (Ray Train runs the training function in a thread) the block runs
    without them, and a cluster that announces preemptions otherwise is asked at each step boundary (``check``).

    Args:
        signals: the preemption signals (``Trainer(preemption_signals=...)``).
        cluster: the run's cluster environment: its ``requeue_signals()`` are handled too, and its
            ``preemption_notice()`` is asked by ``check``.

    Example:
        >>> import os
        >>> handler = PreemptionHandler([signal.SIGUSR1])
        >>> with handler:
        ...     os.kill(os.getpid(), signal.SIGUSR1)
        ...     handler.received, handler.consume()
        ('SIGUSR1', 'SIGUSR1')
    """

    def __init__(self, signals: Iterable[int], cluster: ClusterEnvironment | None = None) -> None:
        # The cluster's "save and come back" signals (SLURM's SIGUSR1).
        self.requeue_signals = tuple(cluster.requeue_signals()) if cluster is not None else ()
        self._notice = cluster.preemption_notice if cluster is not None else None
        self.signals = tuple(dict.fromkeys((*signals, *self.requeue_signals)))
        self.received: str | None = None
        self.requeue_asked = False  # a requeue signal arrived (the cluster environment requeues after the save)
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the trainer saves and exits at the next step boundary, where every process meets.
        self.received = signal.Signals(signum).name
        self.requeue_asked = self.requeue_asked or signum in self.requeue_signals
        previous = self._previous.get(signum)
        if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler):
            # A Python handler installed before the run (the user's, an orchestrator's) runs too, as Lightning
            # composes them; it has seen the signal, so it is not raised to it again on exit. (Python's SIGINT
            # handler would raise KeyboardInterrupt here, ending the run before its save: it gets it on exit.)
            previous(signum, frame)
        else:
            self._pending = signum

    def check(self) -> str | None:
        """What preempted the run so far (a signal's name, or the cluster's notice), else None; asks the cluster
        every time, even once something arrived, so every process makes the same number of calls (Ray's
        ``get_preemption_info`` is a collective)."""
        notice = self._notice() if self._notice is not None else None
        if notice is not None and self.received is None:
            self.received = notice
        return self.received

    def consume(self) -> str | None:
        """The signal's name if one arrived (it is then handled by the caller, not re-raised on exit)."""
        self._pending = None
        return self.received

    def __enter__(self) -> PreemptionHandler:  # noqa: PYI034 - a final class in practice
        self.received, self._pending, self.requeue_asked = None, None, False
        if self.signals and threading.current_thread() is threading.main_thread():
            for number in self.signals:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        pending, self._pending = self._pending, None
        if pending is not None and exc_info[0] is None:
            signal.raise_signal(pending)  # the old handler (by default: end the process) gets it now
