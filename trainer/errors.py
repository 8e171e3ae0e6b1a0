"""Errors the trainer raises for a module or data module that lacks something a stage needs."""

from __future__ import annotations

from callbacks.exceptions import MisconfigurationException


class MisconfigurationError(MisconfigurationException, NotImplementedError):
    """A required method is not defined (e.g. ``training_step`` for ``fit``); the message says what to add.

    It is Lightning's ``MisconfigurationException`` (what Lightning raises here, and what code written for it
    catches) and a ``NotImplementedError`` (what Lightning's base-class methods raise when called directly).
    """
