"""`LoggerTracker`: any Lightning-style logger object driven as an Ember tracker, with Lightning's calls.

``Trainer(logger=...)`` takes Ember's loggers (``CSVLogger``, ``TensorBoardLogger``, ...), a ``Logger`` subclass of
the user's (one that overrides ``log_metrics`` or any other method), and any object with Lightning's logger methods
(a ``unittest.mock.Mock``, a logger class of another library): Lightning accepts any object there and calls its
methods. Each is wrapped in a ``LoggerTracker``, which the engine runs like every tracker (main process only), and
which makes Lightning's calls through the logger's own methods (an override, or a ``mock.patch`` of the class
method, sees every call), observed from Lightning 2.6 driving a ``Mock``:

- each metrics payload: ``log_metrics(metrics=..., step=...)`` (keywords) with Lightning's payload and step (the
  trainer passes them: ``trainer.metrics.logger_steps``), then ``save()``;
- each run (``fit`` / ``validate`` / ``test``), after its setup: ``log_hyperparams(hparams)`` (when the module or
  data module saved some), ``log_graph(module)``, ``save()``;
- each run's end (``predict`` included): ``finalize("success")``, or ``finalize("failed")`` when it raised;
- each checkpoint ``ModelCheckpoint`` writes: ``after_save_checkpoint(checkpoint_callback)`` (the callback calls
  it on every logger, on the main process).

The methods Lightning's ``Logger`` base gives a default that does nothing (``log_graph``, ``save``, ``finalize``,
``after_save_checkpoint``) may be missing on the object; ``log_metrics`` may not.

An Ember logger writes into a tracker of its own (``run``): the engine opens that run when the trackers start,
keeps it open from one Trainer call to the next (``finalize("success")`` only flushes it), saves its state in each
checkpoint under the tracker's name (a resumed run continues its files exactly) and closes it at the end.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import torch

from trackers import GeneralTracker, known_trackers

# What Lightning calls on a logger and where (the module docstring); only log_metrics is required.
OPTIONAL_METHODS = ("log_hyperparams", "log_graph", "save", "finalize", "after_save_checkpoint")


@runtime_checkable
class RunListener(Protocol):
    """A tracker the Trainer tells where each run starts and ends (``LoggerTracker``; ``LitLogger``'s tracker)."""

    def run_started(self, module: torch.nn.Module, hparams: dict[str, Any] | None) -> None: ...

    def run_ended(self, status: str) -> None: ...


def is_logger_like(value: Any) -> bool:
    """Whether ``value`` can be driven as a Lightning logger: an object (not a class) with a ``log_metrics``."""
    return not isinstance(value, type) and callable(getattr(value, "log_metrics", None))


def not_a_logger(value: Any) -> TypeError:
    """The error for a ``Trainer(logger=...)`` item that is no logger (Lightning accepts it and fails in the run,
    at its first ``finalize`` or ``log_metrics`` call; Ember says so when the Trainer is built)."""
    hint = ""
    if isinstance(value, str) and value.lower() in known_trackers():
        hint = f" For the {value!r} tracker pass Trainer(log_with={value!r}) (or logger=a logger object)."
    elif isinstance(value, type) and callable(getattr(value, "log_metrics", None)):
        hint = f" Pass an instance: logger={value.__name__}(...)."
    return TypeError(f"Trainer(logger=...) takes True / False, a logger from trainer.loggers (CSVLogger, "
                     f"TensorBoardLogger, WandbLogger, CometLogger, MLFlowLogger, LitLogger, or a Logger subclass), "
                     f"an Ember GeneralTracker, any object with Lightning's logger methods (log_metrics(metrics, "
                     f"step), log_hyperparams(params), ...), or a list of them. Received: {type(value).__name__} "
                     f"({value!r:.80}).{hint}")


def lightning_run_folder(logger: Any) -> str | None:
    """Where Lightning's ``ModelCheckpoint`` puts a duck-typed logger's run: ``{save_dir}/{name}/{version}``
    (``version_{N}`` for a number), or ``None`` when ``save_dir`` is not a path (no folder of its own)."""
    save_dir = getattr(logger, "save_dir", None)
    if not isinstance(save_dir, (str, os.PathLike)):
        return None
    version = getattr(logger, "version", None)
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(os.fspath(save_dir), str(getattr(logger, "name", None)), version)


class LoggerTracker(GeneralTracker):
    """Drives a Lightning-style logger object as an Ember tracker, with Lightning's calls (see the module).

    ``finish()`` (the engine's end of the run) calls ``finalize("success")`` unless the Trainer already finalized
    the run it ends (``run_ended``).

    Example:
        >>> from unittest import mock
        >>> logger = mock.Mock()
        >>> tracker = LoggerTracker(logger)
        >>> tracker.log({"loss": 0.5}, step=3)
        >>> tracker.run_ended("success")
        >>> [name for name, _, _ in logger.method_calls]
        ['log_metrics', 'save', 'finalize']
        >>> logger.log_metrics.call_args
        call(metrics={'loss': 0.5}, step=3)
    """

    name = "logger"
    requires_logging_directory = False

    def __init__(self, logger: Any, run: GeneralTracker | None = None) -> None:
        super().__init__()
        if not is_logger_like(logger):
            raise not_a_logger(logger)
        self.logger = logger
        self.run = run  # an Ember logger's own tracker, which its methods write to
        # One per logger object; an Ember logger's run keeps its tracker's name: checkpoints key its state by it.
        self.name = run.name if run is not None else f"logger:{type(logger).__name__}:{id(logger)}"
        self.finalized = False  # finalize was called and nothing was logged since

    @property
    def tracker(self) -> Any:
        return self.logger

    def _call(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Call one of Lightning's optional methods, when the object has it (Lightning's default does nothing)."""
        function = getattr(self.logger, method, None)
        if function is not None:
            function(*args, **kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.finalized = False
        self._call("log_hyperparams", values)

    def start(self) -> None:
        """Open the logger's own run (unless the logger opened it itself, e.g. through ``experiment``); from now on
        the trainer holds it: the logger's ``finalize("success")`` keeps it open, ``finish`` closes it."""
        if self.run is not None:
            if self.run.tracker is None:
                self.run.start()
            self.run.opened_by_owner = False

    def log(self, values: dict[str, Any], step: int | None = None,
            lightning: tuple[dict[str, Any], int | None] | None = None, **kwargs: Any) -> None:
        """``log_metrics`` then ``save``; ``lightning``: the ``(metrics, step)`` Lightning would pass, which the
        trainer gives instead of its own trackers' payload (other keywords, e.g. ``new_row``, are theirs)."""
        self.finalized = False
        metrics, step = lightning if lightning is not None else (values, step)
        self.logger.log_metrics(metrics=metrics, step=step)  # keywords: Lightning's logger connector passes them so
        self._call("save")

    def run_started(self, module: torch.nn.Module, hparams: dict[str, Any] | None) -> None:
        """A run's start, after its setup: ``hparams`` (unless already sent as the run configuration), the graph."""
        self.finalized = False
        if hparams:
            self._call("log_hyperparams", hparams)
        self._call("log_graph", module)
        self._call("save")

    def run_ended(self, status: str) -> None:
        """A run's end: ``finalize("success")``, or ``"failed"`` when it raised (Lightning's calls)."""
        self.finalized = True
        self._call("finalize", status)

    def finish(self) -> None:
        try:
            if not self.finalized:
                self._call("save")
                self.run_ended("success")
        finally:
            if self.run is not None:
                self.run.finish()  # the engine's end: the run it opened closes

    def state_dict(self) -> dict[str, Any]:
        return self.run.state_dict() if self.run is not None else super().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.load_state_dict(state)
        else:
            super().load_state_dict(state)
