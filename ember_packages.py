"""Ember's top-level packages (``engine``, ``trackers``, ``callbacks``, ``trainer``) must be the ones Python imports.

A user's own ``callbacks.py`` (or ``engine.py``, ``trainer.py``, ``trackers/``, ...) beside the script they run
comes first on ``sys.path`` and hides Ember's package of that name; Python then fails deep inside Ember with
``cannot import name 'Callback' from 'callbacks' (/path/to/callbacks.py)``. Each Ember package calls
``check_siblings`` first thing, before it imports the others, and names the file that hides which package. The
check asks the import system where each name would be found (``importlib.util.find_spec``), without running the
user's file. This module sits outside the four packages because it must work when any of them is hidden; it
imports nothing of Ember's.

>>> check_siblings("trainer", __import__("trainer").__file__)  # nothing hidden: silent
"""

from __future__ import annotations

import importlib.util
import os

# The packages each one imports when it is imported (the layering of DESIGN.md).
NEEDS = {"trackers": (), "engine": ("trackers",), "callbacks": ("trackers", "engine"),
         "trainer": ("trackers", "engine", "callbacks")}


class ShadowedPackageError(ImportError):
    """Another module or package hides one of Ember's top-level packages."""


def check_siblings(package: str, package_file: str) -> None:
    """Raise ``ShadowedPackageError`` if a package ``package`` needs would not be Ember's own.

    ``package_file``: the ``__file__`` of ``package``'s ``__init__``; Ember's packages sit side by side there.
    """
    home = os.path.dirname(os.path.dirname(os.path.abspath(package_file)))
    for name in NEEDS[package]:
        expected = os.path.join(home, name, "__init__.py")
        try:
            spec = importlib.util.find_spec(name)  # an imported module answers from sys.modules
        except (ImportError, ValueError):
            spec = None
        origin = None if spec is None else spec.origin
        if origin is not None and _same_file(origin, expected):
            continue
        raise ShadowedPackageError(_message(package, name, spec, home), name=name)


def _same_file(a: str, b: str) -> bool:
    if os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b)):
        return True  # the usual answer, without resolving links (which costs a system call per path part)
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _message(package: str, name: str, spec: object, home: str) -> str:
    origin = getattr(spec, "origin", None)
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    if origin and os.path.basename(origin) == "__init__.py":
        what = f"the package {os.path.dirname(origin)}{os.sep}"
    elif origin and origin not in ("namespace", "built-in", "frozen"):
        what = f"the file {origin}"
    elif locations:
        what = f"the folder {locations[0]}{os.sep}"
    else:
        what = "nothing Python can import"
    if what == "nothing Python can import":
        return (f"`import {package}` needs Ember's package {name!r}, which Python cannot find (expected at "
                f"{os.path.join(home, name)}): reinstall ember-train.")
    mine = origin if origin and os.path.basename(origin) != "__init__.py" else (
        os.path.dirname(origin) if origin else locations[0])
    return (f"Ember's package {name!r} is shadowed by {what}: Python finds it first on sys.path (the folder of "
            f"the script you run, or the current folder, comes before installed packages), so `import {package}` "
            f"would import it instead of Ember's {name!r} ({os.path.join(home, name)}). Rename {mine} (for example "
            f"to my_{name}{'.py' if mine.endswith('.py') else ''}) and update the imports of it.")


__all__ = ["NEEDS", "ShadowedPackageError", "check_siblings"]
