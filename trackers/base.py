"""`GeneralTracker`: the base class every experiment tracker derives from (Accelerate's contract).

A tracker wraps one run of one logging backend. The engine creates it on the ranks that should log, then
calls, in this order::

    tracker = TrackerClass(project_name, logging_dir?, **init_kwargs)   # cheap: no backend import, no I/O
    tracker.load_state_dict(saved_identity)                             # only when resuming a run
    tracker.start()                                                     # opens (or reopens) the real run
    tracker.store_init_configuration(config)                            # only when a config was given
    tracker.log(values, step=step)                                      # any number of times
    tracker.finish()

**Run identity and resume.** ``state_dict()`` returns a small JSON-able dict that names the run the tracker
writes to (the csv / tensorboard run folder, the wandb run id, the comet experiment key). A training
checkpoint stores it; on resume ``load_state_dict()`` is called *before* ``start()``, so ``start()`` reopens
that same run instead of creating a new one and the resumed steps continue the same curves.
``load_state_dict()`` after ``start()`` raises: a run cannot be switched once it is open.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

T = TypeVar("T")

_REQUIRED_HINT = (
    "Every tracker class must define the class attributes `name` (a non-empty str, the name used in "
    "`log_with=`), `requires_logging_directory` (a bool) and a `tracker` property returning the underlying "
    "run object."
)


class GeneralTracker:
    """Base class of all trackers; ``GeneralTracker(_blank=True)`` is a tracker that does nothing.

    Subclasses define ``name``, ``requires_logging_directory`` and the ``tracker`` property (checked when the
    subclass is created), and override ``start`` / ``store_init_configuration`` / ``log`` / ``finish``; the
    base versions do nothing, which is also what a blank tracker (handed to ranks that do not log) does.

    Optional class attributes read by the registry and the engine:

    * ``package``: the import name of the backend package (checked with ``importlib.util.find_spec``, never
      imported), or ``None`` when the tracker needs nothing beyond the standard library.
    * ``extra``: the ``ember-train`` extra that installs ``package`` (used in the "not installed" error).
    * ``accepts_logging_directory``: when true and the engine has a logging directory, the engine passes it as
      the ``logging_dir=`` keyword even though the tracker does not require one (wandb uses it as ``dir``).
    * ``accepts_grouped_values``: when true, ``log`` receives a logged dict as one group (``{"glue": {"acc":
      0.5}}``, see ``trackers.group_values``) instead of flattened ``"glue/acc"`` names (TensorBoard shows a
      group as one chart, as Accelerate's and Lightning's trackers do).

    One instance attribute is read by the engine: ``opened_by_owner`` (default ``False``). An owner that opened
    the run itself before ``init_trackers`` (a Lightning-style logger whose ``experiment`` was used early) sets
    it, and the engine then uses the open run instead of calling ``start()`` a second time.

    Example:
        >>> class PrintTracker(GeneralTracker):
        ...     name = "print"
        ...     requires_logging_directory = False
        ...     def __init__(self, run_name: str) -> None:
        ...         super().__init__()
        ...         self.run_name = run_name
        ...     @property
        ...     def tracker(self) -> None:
        ...         return None
        ...     def log(self, values: dict, step: int | None = None, **kwargs: object) -> None:
        ...         print(step, values)
        >>> PrintTracker("demo").log({"loss": 0.5}, step=3)
        3 {'loss': 0.5}
    """

    # Class attributes (checked in __init_subclass__); a blank tracker sets them on its instance.
    name: str
    requires_logging_directory: bool
    main_process_only: ClassVar[bool] = True
    accepts_logging_directory: ClassVar[bool] = False
    accepts_grouped_values: ClassVar[bool] = False
    package: ClassVar[str | None] = None
    extra: ClassVar[str | None] = None
    opened_by_owner: bool = False  # set on an instance by an owner that opened the run itself (see above)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Checked at class creation so a broken tracker fails where it is written, not at the first log call.
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"Tracker class {cls.__qualname__} has name={name!r}: set a class attribute "
                            f"`name = \"my_tracker\"`. {_REQUIRED_HINT}")
        requires = getattr(cls, "requires_logging_directory", None)
        if not isinstance(requires, bool):
            raise TypeError(f"Tracker class {cls.__qualname__} has requires_logging_directory={requires!r}: "
                            "set the class attribute `requires_logging_directory = True` (or False). "
                            f"{_REQUIRED_HINT}")
        if cls.tracker is GeneralTracker.tracker:
            raise TypeError(f"Tracker class {cls.__qualname__} does not define a `tracker` property: add "
                            f"`@property def tracker(self): return <the run object>`. {_REQUIRED_HINT}")
        if not isinstance(cls.main_process_only, bool):
            raise TypeError(f"Tracker class {cls.__qualname__} has "
                            f"main_process_only={cls.main_process_only!r}; expected a bool.")

    def __init__(self, _blank: bool = False) -> None:
        if type(self) is GeneralTracker and not _blank:
            raise TypeError("GeneralTracker cannot be used directly: subclass it (defining `name`, "
                            "`requires_logging_directory` and a `tracker` property) or pass `_blank=True` "
                            "for a tracker that does nothing.")
        if _blank:
            # Instance attributes, so the class itself keeps `name` undefined for the subclass check.
            self.name = "blank"
            self.requires_logging_directory = False

    @property
    def tracker(self) -> Any:
        """The backend's run object (a ``SummaryWriter``, a wandb run, ...); ``None`` for a blank tracker."""
        return None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this installed tracker cannot run here as configured (no login...), or ``None`` when it can.

        ``log_with="all"`` skips a tracker that gives a reason, printing it; naming the tracker explicitly
        still starts it (and its own error says what is missing). Checked without importing the backend.
        """
        return None

    def start(self) -> None:
        """Open the real run (import the backend, create files); once, after any ``load_state_dict``."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's configuration (hyper-parameters)."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log flat ``values`` (as produced by ``trackers.normalize_values``; grouped one level deep by
        ``trackers.group_values`` for a tracker with ``accepts_grouped_values``) at ``step``."""

    def finish(self) -> None:
        """Flush and close the run."""

    def state_dict(self) -> dict[str, Any]:
        """The run identity to store in a checkpoint (JSON-able); empty for trackers without one."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Reopen the run named by ``state`` at the next ``start()``; identity-less trackers accept ``{}``."""
        if state:
            raise ValueError(f"Tracker {type(self).__qualname__} keeps no run identity, so it cannot restore "
                             f"{state!r}: override state_dict() and load_state_dict() to support resuming "
                             "runs.")


def started(handle: T | None, tracker: str) -> T:
    """A started tracker's backend object (its writer, run, client...); before ``start()`` a clear error.

    Example:
        >>> started(None, "CSVTracker")
        Traceback (most recent call last):
        RuntimeError: CSVTracker used before start(): call start() (init_trackers does).
    """
    if handle is None:
        raise RuntimeError(f"{tracker} used before start(): call start() (init_trackers does).")
    return handle
