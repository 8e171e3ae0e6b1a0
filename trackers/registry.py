"""Tracker names -> classes: the built-ins plus whatever users register, and the "is it installed?" check."""

from __future__ import annotations

import importlib.util
import sys

from trackers.base import GeneralTracker
from trackers.comet_tracker import CometMLTracker
from trackers.csv_tracker import CSVTracker
from trackers.mlflow_tracker import MLflowTracker
from trackers.tensorboard_tracker import TensorBoardTracker
from trackers.wandb_tracker import WandBTracker

# Importing these modules is cheap: each imports its backend package only inside `start()`.
BUILTIN_TRACKERS: tuple[type[GeneralTracker], ...] = (
    CSVTracker, TensorBoardTracker, WandBTracker, CometMLTracker, MLflowTracker)

_registry: dict[str, type[GeneralTracker]] = {cls.name: cls for cls in BUILTIN_TRACKERS}


def register_tracker_class(cls: type[GeneralTracker], replace: bool = False) -> type[GeneralTracker]:
    """Make ``cls`` usable by its ``name`` in ``log_with=``; returns ``cls``, so it also works as a decorator.

    Registering the same class twice is a no-op; taking a name held by another class needs ``replace=True``
    (built-in names cannot be taken).

    Example:
        >>> class MyTracker(CSVTracker):
        ...     name = "my_csv"
        >>> register_tracker_class(MyTracker) is MyTracker
        True
        >>> get_tracker_class("my_csv") is MyTracker
        True
        >>> unregister_tracker_class("my_csv")
    """
    if not (isinstance(cls, type) and issubclass(cls, GeneralTracker)):
        raise TypeError(f"register_tracker_class expects a GeneralTracker subclass. Received: {cls!r}.")
    current = _registry.get(cls.name)
    if current is cls:
        return cls
    builtin = current in BUILTIN_TRACKERS
    if current is not None and (builtin or not replace):
        what = "the built-in tracker" if builtin else "the registered tracker"
        hint = "give your tracker another `name`" + ("" if builtin else " or pass replace=True")
        raise ValueError(f"Tracker name {cls.name!r} is already used by {what} {current.__qualname__}: "
                         f"{hint}.")
    _registry[cls.name] = cls
    return cls


def unregister_tracker_class(name: str) -> None:
    """Forget a user-registered tracker name (built-ins stay)."""
    cls = _registry.get(name)
    if cls is None:
        raise ValueError(f"No tracker named {name!r} is registered. Known: {known_trackers()}.")
    if cls in BUILTIN_TRACKERS:
        raise ValueError(f"{name!r} is a built-in tracker and cannot be unregistered.")
    del _registry[name]


def known_trackers() -> list[str]:
    """Every registered name, installed or not (built-ins first)."""
    return list(_registry)


def is_installed(cls: type[GeneralTracker]) -> bool:
    """Whether the package ``cls`` needs can be imported (checked without importing it; one already imported, or
    put in ``sys.modules`` as a test's stand-in, counts)."""
    if cls.package is None or sys.modules.get(cls.package) is not None:
        return True
    return importlib.util.find_spec(cls.package) is not None


def require_installed(cls: type[GeneralTracker], user: str | None = None) -> None:
    """Raise ``ModuleNotFoundError`` naming the extra to install when ``cls``'s package is missing.

    Example:
        >>> require_installed(CSVTracker)  # needs nothing
    """
    if not is_installed(cls):
        install = f'pip install "ember-train[{cls.extra}]"' if cls.extra else f"pip install {cls.package}"
        raise ModuleNotFoundError(f"{user or f'Logging with {cls.name!r}'} needs the `{cls.package}` package, which "
                                  f"is not installed: {install}", name=cls.package)


def available_trackers() -> list[str]:
    """The built-in trackers whose package is installed (``"csv"`` always is): what ``"all"`` means."""
    return [cls.name for cls in BUILTIN_TRACKERS if is_installed(cls)]


def get_tracker_class(name: str) -> type[GeneralTracker]:
    """The tracker class registered as ``name`` (case-insensitive), checked to be installed.

    Raises:
        ValueError: ``name`` is not registered; the message lists the known names.
        ModuleNotFoundError: the tracker's package is missing; the message says which extra to install.
    """
    if not isinstance(name, str):
        raise TypeError(f"A tracker name must be a str. Received: {name!r} ({type(name).__name__}).")
    cls = _registry.get(name) or _registry.get(name.lower())
    if cls is None:
        raise ValueError(f"Unknown tracker {name!r}. Known trackers: {known_trackers()}; add your own with "
                         "trackers.register_tracker_class(MyTracker) or pass a GeneralTracker instance.")
    require_installed(cls)
    return cls
