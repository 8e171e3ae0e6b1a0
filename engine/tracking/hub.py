"""`TrackerHub`: the trackers of one `Accelerator` (``log_with=``), and which ranks run them.

The Accelerator delegates ``init_trackers`` / ``log`` / ``get_tracker`` / ``trackers`` / ``end_training``
here. Trackers run on the main process, plus, on every other rank, those whose class sets
``main_process_only=False``; a rank without trackers gets a blank (do-nothing) tracker from ``get``.
"""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trackers import (
    GeneralTracker,
    available_trackers,
    check_values,
    get_tracker_class,
    group_values,
    known_trackers,
    normalize_values,
)

TrackerSpec = str | GeneralTracker | type[GeneralTracker]


class TrackerHub:
    """Validate ``log_with`` eagerly, then create, drive and finish the trackers.

    Args:
        log_with: ``None``, a tracker name (``"csv"``, ``"tensorboard"``, ``"wandb"``, ``"comet_ml"``, a name
            registered with ``trackers.register_tracker_class``, or ``"all"`` for every installed built-in), a
            ``GeneralTracker`` subclass or instance, or a list of those. Duplicates (by name) are dropped.
        logging_dir: where trackers that need a directory write (the Accelerator's ``logging_dir``).
        is_main_process: whether this rank runs the ``main_process_only`` trackers.

    Example:
        >>> import tempfile
        >>> hub = TrackerHub("csv", tempfile.mkdtemp(), is_main_process=True)
        >>> hub.init("demo", config={"lr": 0.1})
        >>> hub.log({"loss": 0.5}, step=1)
        >>> [t.name for t in hub.trackers]
        ['csv']
        >>> hub.finish()
    """

    def __init__(self, log_with: TrackerSpec | Iterable[TrackerSpec] | None,
                 logging_dir: str | os.PathLike[str] | None, is_main_process: bool) -> None:
        self.logging_dir = None if logging_dir is None else os.fspath(logging_dir)
        self.is_main_process = is_main_process
        self._specs, asked_for_all = _resolve(log_with)
        if asked_for_all:
            # "all" means the installed trackers that can run here: one that cannot (wandb without a login) is
            # skipped with a line saying why, instead of failing the run in its start().
            for spec in [s for s in self._specs if isinstance(s, type) and s.unavailable_reason()]:
                self._specs.remove(spec)
                if is_main_process:
                    print(f"log_with='all': {spec.unavailable_reason()}", file=sys.stderr, flush=True)
        needing_dir = [s.name for s in self._specs if isinstance(s, type) and s.requires_logging_directory]
        if needing_dir and self.logging_dir is None and asked_for_all:
            # As Accelerate, "all" makes no directory check: it means the installed trackers that can run here.
            self._specs = [s for s in self._specs if s.name not in needing_dir]
        elif needing_dir and self.logging_dir is None:
            raise ValueError(f"Logging with {needing_dir} requires a logging directory, but none was given: "
                             "pass `project_dir=...` to the Accelerator (or "
                             "ProjectConfiguration(logging_dir=...)).")
        self._trackers: list[GeneralTracker] = []
        self._pending_states: dict[str, dict[str, Any]] = {}
        self._initialized = False
        self._finished = False

    @property
    def trackers(self) -> list[GeneralTracker]:
        """The trackers running on this process (empty before ``init`` and on ranks that do not log)."""
        return list(self._trackers)

    @property
    def names(self) -> list[str]:
        """The names of the configured trackers, on every rank."""
        return [s.name for s in self._specs]

    def init(self, project_name: str, config: dict[str, Any] | None = None,
             init_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Create this rank's trackers, reopen saved runs (``load_state_dict``), start, store ``config``."""
        if self._initialized:
            raise RuntimeError("init_trackers() was already called for this Accelerator; call end_training() "
                               "and create a new Accelerator to start another run.")
        if not isinstance(project_name, str) or not project_name:
            raise ValueError(f"init_trackers needs a non-empty project_name str. Received: {project_name!r}.")
        init_kwargs = self._check_per_tracker("init_kwargs", init_kwargs)
        trackers: list[GeneralTracker] = []
        for spec in self._specs:
            if spec.main_process_only and not self.is_main_process:
                continue
            if isinstance(spec, GeneralTracker):
                trackers.append(spec)  # a user-built instance is used as it is, like Accelerate does
                continue
            kwargs = dict(init_kwargs.get(spec.name, {}))
            build: Callable[..., GeneralTracker] = spec  # a subclass: it takes (run_name, [logging_dir], **kwargs)
            if spec.requires_logging_directory:
                trackers.append(build(project_name, self.logging_dir, **kwargs))
            else:
                if spec.accepts_logging_directory and self.logging_dir is not None:
                    kwargs.setdefault("logging_dir", self.logging_dir)
                trackers.append(build(project_name, **kwargs))
        for tracker in trackers:
            if tracker.name in self._pending_states:
                tracker.load_state_dict(self._pending_states.pop(tracker.name))
        self._initialized = True
        self._trackers = trackers
        for tracker in trackers:
            # A logger view may have opened its tracker already (its `experiment` was used before the run).
            if not (getattr(tracker, "opened_by_owner", False) and tracker.tracker is not None):
                tracker.start()
        if config is not None:
            for tracker in trackers:
                tracker.store_init_configuration(config)

    def log(self, values: Mapping[str, Any], step: int | None = None,
            log_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Normalise ``values`` once (see ``trackers.normalize_values``) and log them with every tracker."""
        if not self._specs:
            return  # no log_with: logging is a no-op, as in Accelerate
        if not self._initialized or self._finished:
            when = "after end_training()" if self._finished else "before init_trackers()"
            raise RuntimeError(f"log() {when}: trackers {self.names} are not running. Call "
                               "init_trackers(project_name) first.")
        step = _check_step(step)
        log_kwargs = self._check_per_tracker("log_kwargs", log_kwargs)
        if not self._trackers:
            check_values(values)  # same errors on every rank, without a host sync for tensors nobody logs
            return
        flat = normalize_values(values)
        grouped: dict[str, Any] | None = None
        for tracker in self._trackers:
            payload: dict[str, Any] = flat
            if tracker.accepts_grouped_values:
                grouped = group_values(values, flat) if grouped is None else grouped
                payload = grouped
            tracker.log(payload, step=step, **log_kwargs.get(tracker.name, {}))

    def get(self, name: str, unwrap: bool = False) -> Any:
        """This rank's tracker ``name`` (its ``.tracker`` when ``unwrap``); a blank one on a rank without any.

        Raises:
            ValueError: this rank has trackers but none called ``name``; the message lists them.
        """
        if not self._trackers:
            return GeneralTracker(_blank=True)  # any name, `unwrap` ignored (Accelerate's behaviour)
        for tracker in self._trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ValueError(f"{name!r} is not an available tracker stored inside the accelerator. Available: "
                         f"{[t.name for t in self._trackers]}.")

    def finish(self) -> None:
        """Finish every tracker (all of them, even if one raises; the first error is re-raised after)."""
        if self._finished:
            return
        self._finished = True
        error: BaseException | None = None
        for tracker in self._trackers:
            try:
                tracker.finish()
            except Exception as exc:  # noqa: BLE001 - finish the others, then report this one
                error = error or exc
        if error is not None:
            raise error

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Run identities by tracker name, for a checkpoint (with loaded ones of trackers not in use now)."""
        states = {name: dict(state) for name, state in self._pending_states.items()}
        states.update({t.name: t.state_dict() for t in self._trackers})
        return states

    def load_state_dict(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Remember saved run identities; ``init`` applies them before ``start()``: the same runs continue."""
        if self._initialized:
            raise RuntimeError("Tracker state must be loaded before init_trackers(): the runs are already "
                               "open, so they can no longer be switched to the saved ones.")
        if not isinstance(states, Mapping) or not all(isinstance(v, Mapping) for v in states.values()):
            raise TypeError(f"Expected a dict of tracker name -> state dict. Received: {states!r:.200}.")
        self._pending_states = {str(name): dict(state) for name, state in states.items()}

    def _check_per_tracker(self, what: str, per_tracker: dict[str, dict[str, Any]] | None
                           ) -> dict[str, dict[str, Any]]:
        if per_tracker is None:
            return {}
        if not isinstance(per_tracker, Mapping):
            raise TypeError(f"{what} must be a dict of tracker name -> dict of keyword arguments. "
                            f"Received: {per_tracker!r:.200}.")
        # Keys for known trackers that are not in use are allowed (scripts keep kwargs for every tracker they
        # may switch on); an unknown key is almost always a typo that would otherwise be silently ignored.
        known = set(known_trackers()) | set(self.names)
        for name, kwargs in per_tracker.items():
            if name not in known:
                raise ValueError(f"{what} has an entry for {name!r}, which is not a tracker name. "
                                 f"Trackers in use: {self.names}; known: {sorted(known)}.")
            if not isinstance(kwargs, Mapping):
                raise TypeError(f"{what}[{name!r}] must be a dict of keyword arguments. "
                                f"Received: {kwargs!r:.200}.")
        return dict(per_tracker)


def _resolve(log_with: TrackerSpec | Iterable[TrackerSpec] | None
             ) -> tuple[list[GeneralTracker | type[GeneralTracker]], bool]:
    """``log_with`` as tracker classes / instances, validated and de-duplicated by name; and whether it said "all"."""
    if log_with is None:
        return [], False
    items = [log_with] if isinstance(log_with, (str, GeneralTracker, type)) else list(log_with)
    asked_for_all = any(isinstance(item, str) and item.lower() == "all" for item in items)
    if asked_for_all:
        # "all": every installed built-in plus the user's own trackers given next to it.
        items = [*available_trackers(), *(item for item in items if not isinstance(item, str))]
    resolved: dict[str, GeneralTracker | type[GeneralTracker]] = {}
    for item in items:
        if isinstance(item, str):
            spec: GeneralTracker | type[GeneralTracker] = get_tracker_class(item)
        elif _is_tracker(item):
            spec = item
        else:
            raise TypeError("log_with entries must be tracker names, GeneralTracker subclasses or "
                            f"instances. Received: {item!r} ({type(item).__name__}).")
        resolved.setdefault(spec.name, spec)
    return list(resolved.values()), asked_for_all


def _is_tracker(item: Any) -> bool:
    return isinstance(item, GeneralTracker) or (isinstance(item, type) and issubclass(item, GeneralTracker))


def _check_step(step: Any) -> int | None:
    """``None`` or an int; numpy ints and 0-d integer tensors become an int (they implement ``__index__``)."""
    if step is None:
        return None
    try:
        if isinstance(step, bool):
            raise TypeError
        return operator.index(step)
    except TypeError:
        raise TypeError(f"step must be an int (or a 0-d integer tensor) or None. Received: {step!r:.80} "
                        f"({type(step).__name__}).") from None
