"""`LambdaCallback`: a callback whose hooks are plain functions given as keywords (Lightning's ``LambdaCallback``)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from callbacks.base import HOOK_NAMES, Callback


class LambdaCallback(Callback):
    """Each keyword names a hook and gives the function it runs, called with the hook's arguments
    (``trainer, module, ...``); the other hooks stay off (an unused hook costs nothing).

    Example:
        >>> seen = []
        >>> callback = LambdaCallback(on_fit_start=lambda trainer, module: seen.append("fit started"))
        >>> callback.on_fit_start(None, None)
        >>> seen
        ['fit started']
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        for name, function in hooks.items():
            if name not in HOOK_NAMES:
                close = difflib.get_close_matches(name, HOOK_NAMES, n=1)
                hint = f"e.g. {close[0]}" if close else f"one of {list(HOOK_NAMES)}"
                raise TypeError(f"LambdaCallback({name}=...) is not a callback hook: use one of the hook names, "
                                f"{hint}.")
            if function is not None:  # an instance attribute: the trainer calls it as this callback's hook
                setattr(self, name, function)
