"""`Tqdm`: Lightning's tqdm subclass, whose numbers keep their width so a bar's metrics do not flicker.

tqdm is imported on first use (``tqdm_class()``), so that ``import callbacks`` stays cheap; the class is made
once and cached. ``callbacks.tqdm_progress.Tqdm`` is this class, at Lightning's import path.
"""

from __future__ import annotations

import functools
from typing import Any

# Short numbers are padded with zeros to this many characters (Lightning's width).
PAD_SIZE = 5


def format_num(n: float | str, plain: Any) -> str:
    """``n`` as tqdm's ``plain(n)`` formats it, floats and number strings padded with zeros to ``PAD_SIZE``
    characters (``1.0`` -> ``"1.000"``), so a postfix keeps its width as values change; ints and exponents as is.
    """
    padded = isinstance(n, (float, str))
    text = n if isinstance(n, str) else plain(n)
    if not padded or "e" in text:
        return text
    if "." not in text and len(text) < PAD_SIZE:
        try:
            float(text)
        except ValueError:  # not a number: a string shown as it is
            return text
        text += "."
    return text + "0" * (PAD_SIZE - len(text))


@functools.cache
def tqdm_class() -> type:
    """The ``Tqdm`` class (a ``tqdm.tqdm`` subclass with the padded ``format_num``), made on first use.

    Example:
        >>> Tqdm = tqdm_class()
        >>> Tqdm.format_num(0.1), Tqdm.format_num(1e-5), Tqdm.format_num(3)
        ('0.100', '1e-5', '3')
    """
    from tqdm import tqdm  # imported here so that `import callbacks` stays cheap

    def padded(n: float | str) -> str:
        return format_num(n, tqdm.format_num)

    return type("Tqdm", (tqdm,), {"format_num": staticmethod(padded), "__module__": "callbacks.tqdm_progress",
                                  "__doc__": "tqdm whose float and string numbers are zero-padded to 5 characters."})
