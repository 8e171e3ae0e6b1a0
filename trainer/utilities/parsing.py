"""Lightning's ``lightning.pytorch.utilities.parsing`` helper ``is_picklable``."""

from __future__ import annotations

import pickle
from typing import Any


def is_picklable(obj: Any) -> bool:
    """Whether ``obj`` survives ``pickle.dumps`` (e.g. before storing it as a hyper-parameter).

    Example:
        >>> import threading
        >>> is_picklable({"lr": 0.1}), is_picklable(lambda x: x), is_picklable(threading.Lock())
        (True, False, False)
    """
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True
