"""Errors the trainer raises for a module or data module that lacks something a stage needs."""

from __future__ import annotations


class MisconfigurationError(NotImplementedError):
    """A required method is not defined (e.g. ``training_step`` for ``fit``); the message says what to add.

    It subclasses ``NotImplementedError`` so code written against Lightning's base classes keeps catching it.
    """
