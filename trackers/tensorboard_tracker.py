"""`TensorBoardTracker`: TensorBoard event files through ``torch.utils.tensorboard.SummaryWriter``."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Literal

from trackers import run_paths
from trackers.base import GeneralTracker, started
from trackers.values import flatten_config

# TensorBoard hides events at or after a restart marker's step; a new run's marker must hide nothing.
_NEW_RUN_MARKER_STEP = 2**62
_LAYOUTS = ("accelerate", "lightning")


class TensorBoardTracker(GeneralTracker):
    """Write event files to ``{logging_dir}/{run_name}``, laid out as Accelerate's tracker or Lightning's logger.

    Numbers go to ``add_scalar``, strings to ``add_text``, and a logged dict to ``add_scalars`` (both
    layouts): ``log({"glue": {"acc": 0.5}})`` writes the tag ``glue`` into the sub-folder ``glue_acc`` (its
    string entries go to ``add_text`` as ``glue/...``). The configuration goes to the hparams plugin, with its
    nested dicts flattened to ``a/b`` names and values other than numbers, bools and strings shown as their
    ``str()`` (Accelerate raises on those):

    * ``layout="accelerate"`` (the default; what ``Accelerator(log_with="tensorboard")`` writes): as
      Accelerate's ``add_hparams``, in a sub-run named by the time (``{run}/{time.time()}/``), and the
      configuration as YAML in ``{run}/{time.time()}/hparams.yml`` (a second timestamped folder, as Accelerate).
    * ``layout="lightning"`` (``trainer.loggers.TensorBoardLogger``): in the run folder itself, as Lightning's
      logger, and as JSON in ``{run}/hparams.json``.

    Events are flushed after every ``log`` call. Extra keyword arguments go to ``SummaryWriter``.

    Resume: ``state_dict()`` holds the last step logged and the values logged at that step so far. ``start()``
    after ``load_state_dict`` writes TensorBoard's restart marker at that step
    (``SummaryWriter(purge_step=last saved step)``), so TensorBoard hides everything the interrupted run logged
    from that step on, then logs the saved values of that step again: what the checkpoint had seen stays, what
    came after it (the next batch's learning rate at the same step, later steps) is shown as the resumed run
    logs it, once. A new run writes the marker too, at a step no run reaches: TensorBoard's loader treats the
    first marker of a folder as the session start and only later ones as restarts, and this one hides nothing
    (runs sharing a folder overlap, as with Accelerate).
    """

    name = "tensorboard"
    requires_logging_directory = True
    package = "tensorboard"
    extra = "tensorboard"

    accepts_grouped_values = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], *,
                 layout: Literal["accelerate", "lightning"] = "accelerate", **kwargs: Any) -> None:
        super().__init__()
        if layout not in _LAYOUTS:
            raise ValueError(f"TensorBoardTracker(layout={layout!r}): expected 'accelerate' (hyper-parameters in a "
                             "timestamped sub-run, as Accelerate) or 'lightning' (in the run folder, as Lightning's "
                             "TensorBoardLogger).")
        self.layout = layout
        self.run_name = run_name
        # Absolute now: a later chdir (or a resume from another working directory) cannot move the run.
        self.logging_dir = os.path.abspath(os.fspath(logging_dir))
        self.log_dir = os.path.join(self.logging_dir, run_name)
        self.writer_kwargs = kwargs
        self._writer: Any = None
        self._purge_step: int | None = None
        self._marker_step: int | None = None  # the restart marker's step in this run's folders (start())
        self._last_step: int | None = None
        self._at_last_step: list[list[Any]] = []  # [name, value] logged at _last_step, in order

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
        self._marker_step = kwargs["purge_step"]
        self._writer = SummaryWriter(log_dir=self.log_dir, **kwargs)
        if self._purge_step is not None and self._purge_step == self._last_step:  # resumed: the step's values again
            replay, self._at_last_step = self._at_last_step, []
            for key, value in replay:
                self.log({key: value}, step=self._last_step)

    # Metrics declared with the configuration in the hparams plugin (its columns); Lightning's TensorBoardLogger
    # declares a placeholder ``hp_metric`` (see trainer.loggers.tensorboard).
    hparams_metrics: dict[str, float] = {}  # noqa: RUF012 - read-only class default

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        flat = flatten_config(values)
        # The hparams plugin takes only numbers, bools and strings: anything else is shown as its str().
        plugin_values = {k: v if isinstance(v, (int, float, str)) else str(v) for k, v in flat.items()
                         if v is not None}
        writer = self._started()
        if self.layout == "accelerate":
            writer.add_hparams(plugin_values, {})  # torch names the sub-run str(time.time())
            folder = os.path.join(self.log_dir, str(time.time()))
            os.makedirs(folder, exist_ok=True)
            _write(os.path.join(folder, "hparams.yml"), _yaml(values))
            return
        experiment, session_start, session_end = hparams(plugin_values, dict(self.hparams_metrics))
        for summary in (experiment, session_start, session_end):
            writer.file_writer.add_summary(summary)
        writer.file_writer.flush()
        self.write_configuration(values)

    def write_configuration(self, values: dict[str, Any]) -> None:
        """The configuration as a file in the run folder (``layout="lightning"``): ``hparams.json``. Lightning's
        logger writes ``hparams.yaml`` instead (``trainer.loggers.TensorBoardLogger`` overrides this)."""
        _write(os.path.join(self.log_dir, "hparams.json"), json.dumps(values, indent=2, default=str))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        writer = self._started()
        for key, value in values.items():
            if isinstance(value, dict):
                numbers = {name: v for name, v in value.items() if not isinstance(v, str)}
                if numbers:
                    self._open_groups(writer, key, numbers)
                    writer.add_scalars(key, numbers, global_step=step, **kwargs)
                for name, v in value.items():
                    if isinstance(v, str):
                        writer.add_text(f"{key}/{name}", v, global_step=step, **kwargs)
            elif isinstance(value, str):
                writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, (int, float)):
                writer.add_scalar(key, value, global_step=step, **kwargs)
            else:
                raise TypeError(f"TensorBoardTracker.log got {type(value).__name__} for {key!r}: pass values "
                                "through trackers.normalize_values (and group_values) first (the engine does).")
        writer.flush()
        # The furthest step is what a resume hides from (the restart marker): values logged at an earlier step
        # afterwards (Lightning's loggers log each evaluation batch at its count in the loop) must not move it back.
        if step is not None and (self._last_step is None or step >= self._last_step):
            if step != self._last_step:
                self._at_last_step = []
            self._at_last_step += [[key, value] for key, value in values.items()]
            self._last_step = step

    def _open_groups(self, writer: Any, key: str, numbers: dict[str, Any]) -> None:
        """Open the sub-folders ``add_scalars(key, numbers)`` writes to that are not open yet, each starting with
        the restart marker the run folder got at ``start()`` (what ``SummaryWriter(purge_step=...)`` writes).

        Each sub-folder is a run of its own to TensorBoard: without the marker, a resumed run's groups would show
        the interrupted run's points after the checkpoint beside the new ones. The folders are named as torch's
        ``add_scalars`` names them, so it finds them open and writes there.
        """
        if self._marker_step is None:
            return
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from torch.utils.tensorboard.writer import FileWriter

        for name in numbers:
            folder = f"{writer.get_logdir()}/{key.replace('/', '_')}_{name}"
            if folder not in writer.all_writers:
                group = FileWriter(folder, writer.max_queue, writer.flush_secs, writer.filename_suffix)
                group.add_event(Event(step=self._marker_step, file_version="brain.Event:2"))
                group.add_event(Event(step=self._marker_step, session_log=SessionLog(status=SessionLog.START)))
                writer.all_writers[folder] = group

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def state_dict(self) -> dict[str, Any]:
        # Relative to logging_dir: a copied or moved run folder resumes into its own files (see run_paths).
        return {"run": run_paths.to_relative(self.log_dir, self.logging_dir), "step": self._last_step,
                "at_step": [list(item) for item in self._at_last_step]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._writer is not None:
            raise RuntimeError("TensorBoardTracker.load_state_dict() must come before start(): the writer is "
                               "already open.")
        log_dir = run_paths.restore(state, "log_dir", self.logging_dir, "TensorBoardTracker")
        if log_dir is None:
            return  # an older checkpoint's folder outside this run: the folder chosen at construction instead
        self.log_dir = log_dir
        self._last_step = state.get("step")
        if self._last_step is None:
            self._purge_step = None
        elif "at_step" in state:  # hide the saved step too, and log what the checkpoint had seen of it again
            self._purge_step, self._at_last_step = self._last_step, [list(item) for item in state["at_step"]]
        else:  # an older checkpoint: its step's values are kept as they are
            self._purge_step = self._last_step + 1

    def _started(self) -> Any:
        return started(self._writer, "TensorBoardTracker")


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _yaml(values: dict[str, Any]) -> str:
    """``values`` as YAML (as Accelerate writes hparams.yml), objects YAML cannot hold written as their str()."""
    import yaml

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)

    return yaml.safe_dump(plain(values))
