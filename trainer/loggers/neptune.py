"""`NeptuneLogger`: Lightning 2.6 keeps the name only to say that Neptune is gone; so does Ember."""

from __future__ import annotations

from typing import Any


class NeptuneLogger:
    """Neptune has been sunset: building one raises ``RuntimeError`` with Lightning's message (use ``LitLogger``).

    Example:
        >>> NeptuneLogger()
        Traceback (most recent call last):
        RuntimeError: NeptuneLogger is no longer supported. Neptune has been sunset...
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("NeptuneLogger is no longer supported. Neptune has been sunset.\n\nPlease migrate to "
                           "LitLogger (trainer.loggers.LitLogger), the logger for the Lightning AI platform: pip "
                           'install "ember-train[litlogger]".')
