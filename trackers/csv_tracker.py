"""`CSVTracker`: metrics in a plain ``metrics.csv`` (no dependency; the default tracker)."""

from __future__ import annotations

import csv
import json
import os
import warnings
import weakref
from collections.abc import Callable
from typing import IO, Any

from trackers import run_paths
from trackers.base import GeneralTracker


class CSVTracker(GeneralTracker):
    """Write ``{logging_dir}/{run_name}/version_{N}/metrics.csv`` and ``config.json``.

    Each new run takes the next free ``version_{N}`` folder, so runs sharing a project never mix rows. As with
    Lightning's ``CSVLogger``, ``version=N`` picks ``version_N``, a string picks that folder name, and
    ``run_name=""`` with ``version=""`` writes straight into ``logging_dir`` (a flat run folder); a fixed folder
    that already holds another run's ``metrics.csv`` is refused unless this run resumes it. A resumed run
    (``load_state_dict`` before ``start``) reopens its own folder and appends. The file has a ``step`` column
    (empty when no step was given) and one column per metric name in first-seen order. Each step is one row: a
    ``log`` call for the same step as the row before adds its values to that row, unless it would change a value
    the row already holds (an ``epoch`` that moved on, the same name logged again): then it starts a row of its
    own, so no value is ever overwritten. ``log(..., new_row=True)`` always starts one (the trainer's
    ``validate`` / ``test`` results after ``fit``, so they never join a training row). A metric name seen for the
    first time widens the file: it is rewritten once with the longer header, the earlier rows keeping empty
    cells. Each row is flushed, so killing the process loses nothing already logged.

    ``state_dict()`` records how far the file was when a checkpoint was taken (rows, columns, and the last row's
    values so far); a run resumed from that checkpoint cuts the file back to exactly that (the rows and values
    logged after the checkpoint are logged again by the resumed run) and goes on from there, so the file ends
    as an uninterrupted run's would, row for row. It names the run folder relative to ``logging_dir``
    (``{"run": "proj/version_0", "step": 2, ...}``), so a copied or moved run folder, resumed with its new
    location as ``logging_dir``, continues its own file, never the original's.

    Example:
        >>> import tempfile, pathlib
        >>> root = tempfile.mkdtemp()
        >>> tracker = CSVTracker("demo", root)
        >>> tracker.start()
        >>> tracker.log({"loss": 0.5}, step=1)
        >>> tracker.log({"loss": 0.25, "acc": 1.0}, step=2)
        >>> tracker.finish()
        >>> print(pathlib.Path(tracker.run_dir, "metrics.csv").read_text(), end="")
        step,loss,acc
        1,0.5,
        2,0.25,1.0
    """

    name = "csv"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], version: int | str | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        if kwargs:
            raise TypeError(f"CSVTracker takes no options but version=. Received: {sorted(kwargs)}.")
        if version is not None and (isinstance(version, bool) or not isinstance(version, (int, str))):
            raise TypeError(f"CSVTracker(version=...) takes None (the next free version_N), an int N (version_N) "
                            f"or a folder name (\"\": none). Received: {version!r}.")
        self.run_name = run_name
        self.version = version
        # Absolute now: a later chdir (or a resume from another working directory) cannot move the run.
        self.logging_dir = os.path.abspath(os.fspath(logging_dir))
        self.run_dir: str | None = None
        self._resume: dict[str, Any] | None = None  # the saved state a resumed run cuts the file back to
        self._last_step: int | None = None
        self._rows = 0  # data rows in the file
        self._columns: list[str] = []
        self._known: set[str] = set()  # the same names as _columns, for O(1) membership per logged key
        self._file: IO[str] | None = None
        # The last row written by this run: its values, its step and where it starts in the file (bytes).
        self._row: dict[str, Any] = {}
        self._row_step: int | None = None
        self._row_start = 0
        self._closer: Callable[[], Any] = lambda: None
        self._writer: Any = None

    @property
    def tracker(self) -> IO[str] | None:
        """The open ``metrics.csv`` file object."""
        return self._file

    @property
    def metrics_path(self) -> str:
        """``{run_dir}/metrics.csv``; the run folder is chosen by ``start()`` (or given by the saved state)."""
        if self.run_dir is None:
            raise RuntimeError("CSVTracker has no run folder yet: call start() first.")
        return os.path.join(self.run_dir, "metrics.csv")

    def start(self) -> None:
        if self._file is not None:
            raise RuntimeError(f"CSVTracker {self.run_dir} is already started.")
        if self.run_dir is None and self.version is None:
            self.run_dir = _new_version_dir(os.path.join(self.logging_dir, self.run_name))
        elif self.run_dir is None:
            folder = self.version if isinstance(self.version, str) else f"version_{self.version}"
            self.run_dir = os.path.normpath(os.path.join(self.logging_dir, self.run_name, folder))
            if os.path.exists(self.metrics_path):  # a fixed folder is only reused by resuming its run
                taken, self.run_dir = self.metrics_path, None
                raise FileExistsError(f"{taken} already holds the metrics of another run, and this run does not "
                                      "resume it (no saved tracker state): give this run its own folder (a new "
                                      "project_dir / version), resume that run, or remove the file.")
            os.makedirs(self.run_dir, exist_ok=True)
        else:
            os.makedirs(self.run_dir, exist_ok=True)
        if os.path.exists(self.metrics_path):
            columns, rows = _read(self.metrics_path)
            if self._resume is not None:
                columns, rows = self._as_saved(columns, rows, self._resume)
                _rewrite(self.metrics_path, columns, rows)
            self._set_columns(columns)
            self._rows = len(rows)
        self._open()
        if self._rows and (self._row or self._row_step is not None):  # resumed: the last row goes on filling
            self._row_start = _last_row_start(self.metrics_path)
        else:
            self._row, self._row_step = {}, None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        path = os.path.join(os.path.dirname(self.metrics_path), "config.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            # default=str: a config may hold paths, dtypes, ...; the file is for reading, not for round trips.
            json.dump(values, f, indent=2, sort_keys=False, default=str)
        os.replace(tmp, path)

    def log(self, values: dict[str, Any], step: int | None = None, new_row: bool = False, **kwargs: Any) -> None:
        """Write ``values`` at ``step``: into the last row when it is the same step's and none of its values
        would change (see the class), else as a new row (always with ``new_row=True``)."""
        if self._file is None:
            raise RuntimeError("CSVTracker.log() before start(): call start() (init_trackers does).")
        if kwargs:
            raise TypeError(f"CSVTracker.log takes only new_row=. Received: {sorted(kwargs)}.")
        if "step" in values:
            raise ValueError("CSVTracker reserves the column name 'step': pass the step as log(..., step=) "
                             "and rename the metric.")
        new = [key for key in values if key not in self._known]
        if new:
            self._widen(new)
        row = self._row
        if (not new_row and step is not None and step == self._row_step
                and all(row.get(key, value) == value for key, value in values.items())):
            # The same step again (epoch values, a learning rate after the step's own values): one row per step,
            # so the last row is rewritten with the new values added.
            values = {**row, **values}
            self._file.truncate(self._row_start)
        else:
            self._row_start = os.fstat(self._file.fileno()).st_size
            self._rows += 1
        self._writer.writerow(["" if step is None else step, *(values.get(c, "") for c in self._columns[1:])])
        self._file.flush()  # a killed process keeps every row logged so far (the OS has it)
        self._row, self._row_step = dict(values), step
        if step is not None:
            self._last_step = step

    def finish(self) -> None:
        if self._file is not None:
            self._closer()
            self._file = None

    def state_dict(self) -> dict[str, Any]:
        """The run folder and how far its file is: rows, columns, and the last row's step and values so far."""
        run = None if self.run_dir is None else run_paths.to_relative(self.run_dir, self.logging_dir)
        return {"run": run, "step": self._last_step, "rows": self._rows, "columns": len(self._columns),
                "row_step": self._row_step, "row": dict(self._row)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._file is not None:
            raise RuntimeError("CSVTracker.load_state_dict() must come before start(): the run is already "
                               "open.")
        run_dir = run_paths.restore(state, "run_dir", self.logging_dir, "CSVTracker")
        if run_dir is None:
            return  # an older checkpoint's folder outside this run: a new version folder instead
        self.run_dir = run_dir
        self._resume = dict(state)
        self._last_step = state.get("step")
        if "rows" in state:  # the last row goes on taking the values of its step, as it would have
            self._row, self._row_step = dict(state.get("row") or {}), state.get("row_step")

    @staticmethod
    def _as_saved(columns: list[str], rows: list[list[str]], saved: dict[str, Any]
                  ) -> tuple[list[str], list[list[str]]]:
        """The file's header and rows cut back to what a checkpoint's ``state_dict()`` saw."""
        if "rows" not in saved:  # an older checkpoint: only the step is known; keep the rows up to it
            step = saved.get("step")
            return columns, [row for row in rows if step is None or not row[0] or int(row[0]) <= step]
        count, width = int(saved["rows"]), int(saved["columns"]) or 1
        if count > len(rows) or width > len(columns):  # not what the run wrote: keep it, but say so
            warnings.warn(f"CSVTracker: the metrics file has {len(rows)} rows and {len(columns)} columns, but the "
                          f"checkpoint being resumed saw {count} rows and {width} columns (the file was cut short or "
                          "replaced); the resumed run appends to what is there.", UserWarning, stacklevel=4)
            return columns, rows
        columns, rows = columns[:width], [row[:width] for row in rows[:count]]
        if count and saved.get("row"):  # the last row as the checkpoint saw it (later values of its step go)
            step = saved.get("row_step")
            rows[-1] = ["" if step is None else str(step), *(_cell(saved["row"].get(c, "")) for c in columns[1:])]
        return columns, rows

    def _widen(self, new: list[str]) -> None:
        """Rewrite the file with a longer header; rare (new metric names appear in the first few calls)."""
        assert self._file is not None
        self._closer()
        columns, rows = _read(self.metrics_path)
        self._set_columns(columns + new)
        _rewrite(self.metrics_path, self._columns, rows)
        self._open()
        if self._row_step is not None:  # the rows grew wider: find where the last one starts now
            self._row_start = _last_row_start(self.metrics_path)

    def _set_columns(self, columns: list[str]) -> None:
        self._columns = columns
        self._known = set(columns)

    def _open(self) -> None:
        fresh = not os.path.exists(self.metrics_path)
        # Held open for the whole run (closed in finish()): reopening per row would cost a syscall pair.
        self._file = open(self.metrics_path, "a", newline="", encoding="utf-8")  # noqa: SIM115
        # A run whose trainer is dropped without end_training() still closes its file when the tracker goes (or
        # at exit), instead of leaving it to the garbage collector's ResourceWarning.
        self._closer = weakref.finalize(self, self._file.close)
        self._writer = csv.writer(self._file)
        if fresh:
            self._set_columns(["step"])
            self._writer.writerow(self._columns)
            self._file.flush()


def _new_version_dir(parent: str) -> str:
    """Create ``parent/version_{N}`` with the next free N and return it (``mkdir`` is atomic: no sharing)."""
    os.makedirs(parent, exist_ok=True)
    taken = [int(d[8:]) for d in os.listdir(parent) if d.startswith("version_") and d[8:].isdigit()]
    version = max(taken, default=-1) + 1
    while True:
        path = os.path.join(parent, f"version_{version}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            version += 1


def _cell(value: Any) -> str:
    """A value as ``csv.writer`` writes it (``str``; ``None`` as an empty cell)."""
    return "" if value is None else str(value)


def _last_row_start(path: str) -> int:
    """Where the last line of ``path`` starts (bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    return data.rfind(b"\n", 0, len(data) - 1) + 1


def _read(path: str) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header or header[0] != "step":
            raise ValueError(f"{path} is not a metrics file written by CSVTracker (its header is "
                             f"{header!r}): remove it or point the tracker at another folder.")
        return header, list(reader)


def _rewrite(path: str, columns: list[str], rows: list[list[str]]) -> None:
    """Atomically replace ``path``: a crash mid-rewrite leaves the old file, never a truncated one."""
    tmp = path + ".tmp"
    width = len(columns)
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(row + [""] * (width - len(row)) for row in rows)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
