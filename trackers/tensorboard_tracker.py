"""`TensorBoardTracker`: TensorBoard event files through ``torch.utils.tensorboard.SummaryWriter``."""

from __future__ import annotations

import json
import os
from typing import Any

from trackers import run_paths
from trackers.base import GeneralTracker, started
from trackers.values import flatten_config

# TensorBoard hides events at or after a restart marker's step; a new run's marker must hide nothing.
_NEW_RUN_MARKER_STEP = 2**62


class TensorBoardTracker(GeneralTracker):
    """Write event files to ``{logging_dir}/{run_name}`` (Accelerate's layout).

    Numbers go to ``add_scalar``, strings to ``add_text``; the configuration goes to the hparams plugin *in
    the same run folder* (Accelerate's ``add_hparams`` makes a timestamped sub-run instead) and to
    ``hparams.json``. Events are flushed after every ``log`` call. Extra keyword arguments go to
    ``SummaryWriter``.

    Resume: ``start()`` after ``load_state_dict`` writes TensorBoard's restart marker
    (``SummaryWriter(purge_step=last saved step + 1)``), so TensorBoard hides what the interrupted run logged
    after its checkpoint and shows the resumed run's points for those steps instead. A new run writes the
    marker too, at a step no run reaches: TensorBoard's loader treats the first marker of a folder as the
    session start and only later ones as restarts, and this one hides nothing (runs sharing a folder overlap,
    as with Accelerate).
    """

    name = "tensorboard"
    requires_logging_directory = True
    package = "tensorboard"
    extra = "tensorboard"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        # Absolute now: a later chdir (or a resume from another working directory) cannot move the run.
        self.logging_dir = os.path.abspath(os.fspath(logging_dir))
        self.log_dir = os.path.join(self.logging_dir, run_name)
        self.writer_kwargs = kwargs
        self._writer: Any = None
        self._purge_step: int | None = None
        self._last_step: int | None = None

    @property
    def tracker(self) -> Any:
        """The ``torch.utils.tensorboard.SummaryWriter``."""
        return self._writer

    def start(self) -> None:
        if self._writer is not None:
            raise RuntimeError(f"TensorBoardTracker {self.log_dir} is already started.")
        from torch.utils.tensorboard import SummaryWriter  # lazy: imports the tensorboard package

        kwargs = dict(self.writer_kwargs)
        kwargs.setdefault("purge_step", _NEW_RUN_MARKER_STEP if self._purge_step is None else self._purge_step)
        self._writer = SummaryWriter(log_dir=self.log_dir, **kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        flat = flatten_config(values)
        # The hparams plugin takes only numbers, bools and strings: anything else is shown as its str().
        plugin_values = {k: v if isinstance(v, (int, float, str)) else str(v) for k, v in flat.items()
                         if v is not None}
        experiment, session_start, session_end = hparams(plugin_values, {})
        file_writer = self._started().file_writer
        for summary in (experiment, session_start, session_end):
            file_writer.add_summary(summary)
        file_writer.flush()
        path = os.path.join(self.log_dir, "hparams.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(values, f, indent=2, default=str)
        os.replace(path + ".tmp", path)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        writer = self._started()
        for key, value in values.items():
            if isinstance(value, str):
                writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, (int, float)):
                writer.add_scalar(key, value, global_step=step, **kwargs)
            else:
                raise TypeError(f"TensorBoardTracker.log got {type(value).__name__} for {key!r}: pass values "
                                "through trackers.normalize_values first (the engine does).")
        writer.flush()
        if step is not None:
            self._last_step = step

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def state_dict(self) -> dict[str, Any]:
        # Relative to logging_dir: a copied or moved run folder resumes into its own files (see run_paths).
        return {"run": run_paths.to_relative(self.log_dir, self.logging_dir), "step": self._last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._writer is not None:
            raise RuntimeError("TensorBoardTracker.load_state_dict() must come before start(): the writer is "
                               "already open.")
        log_dir = run_paths.restore(state, "log_dir", self.logging_dir, "TensorBoardTracker")
        if log_dir is None:
            return  # an older checkpoint's folder outside this run: the folder chosen at construction instead
        self.log_dir = log_dir
        self._last_step = state.get("step")
        self._purge_step = None if self._last_step is None else self._last_step + 1

    def _started(self) -> Any:
        return started(self._writer, "TensorBoardTracker")
