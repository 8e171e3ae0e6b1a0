"""``MisconfigurationException``: Lightning's error for a setting that cannot work, shared by callbacks and trainer.

It lives at the bottom layer that both ``callbacks`` and ``trainer`` import (``trainer.utilities.exceptions``
re-exports it under Lightning's path). It is a ``ValueError`` too, so code catching either keeps working.

Example:
    >>> try:
    ...     raise MisconfigurationException("EarlyStopping(mode='up'): `mode` can be 'min' or 'max', got 'up'.")
    ... except ValueError as error:
    ...     type(error).__name__
    'MisconfigurationException'
"""

from __future__ import annotations


class MisconfigurationException(ValueError):
    """A setting (a Trainer keyword, a callback argument, a module's hook) that cannot work; the message says
    what was received and what to do."""


__all__ = ["MisconfigurationException"]
