"""Close-match suggestions for a mistyped keyword argument, at no cost when every keyword is right.

``@suggest_keywords`` on a class (or a function) turns Python's bare ``TypeError: __init__() got an unexpected
keyword argument 'max_epoch'`` into ``Trainer() got an unexpected keyword argument 'max_epoch'. Did you mean
'max_epochs'?``, or, when nothing is close, the list of accepted keywords. The error is an
``UnexpectedKeywordError``, a ``TypeError`` subclass, so code that catches ``TypeError`` still does.

Nothing is checked on a call that succeeds: the wrapper only calls through, inside a ``try`` that costs nothing
until something is raised. The signature is read only when Python has already refused the call.

>>> @suggest_keywords
... class Schedule:
...     def __init__(self, max_epochs: int = 1, min_epochs: int = 0) -> None:
...         self.max_epochs = max_epochs
>>> Schedule(max_epochs=3).max_epochs
3
>>> Schedule(max_epoch=3)
Traceback (most recent call last):
  ...
engine.keywords.UnexpectedKeywordError: Schedule() got an unexpected keyword argument 'max_epoch'. Did you mean 'max_epochs'?
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T", bound=Callable[..., Any])  # a class or a function

_UNEXPECTED = re.compile(r"got an unexpected keyword argument '([^']+)'")
# Matches this much worse than the best one are left out: 'max_epoch' suggests max_epochs, not min_epochs too.
_WITHIN_BEST = 0.1


class UnexpectedKeywordError(TypeError):
    """A keyword argument the callable does not take, with the close matches (``suggestions``) if any."""

    def __init__(self, message: str, keyword: str, suggestions: list[str]) -> None:
        super().__init__(message)
        self.keyword = keyword
        self.suggestions = suggestions


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates that look like ``word`` (``difflib``, case-insensitive), best first; near-ties are kept.

    >>> close_matches("epochs", ["max_epochs", "min_epochs", "devices"])
    ['max_epochs', 'min_epochs']
    """
    by_lower = {c.lower(): c for c in candidates}
    target = word.lower()
    # A stable sort on the score alone: ties keep the candidates' own order (a signature's order).
    scored = sorted(((difflib.SequenceMatcher(None, target, low).ratio(), low) for low in by_lower),
                    key=lambda item: -item[0])
    scored = [(score, low) for score, low in scored if score >= 0.6][:n]
    if not scored:
        return []
    best = scored[0][0]
    return [by_lower[low] for score, low in scored if score >= best - _WITHIN_BEST]


def keyword_error(owner: str, keyword: str, accepted: Iterable[str], docs: str | None = None) -> UnexpectedKeywordError:
    """The error for ``owner(keyword=...)``: the close matches among ``accepted``, else every accepted name.

    Code that checks keywords itself (a ``**kwargs`` passed on, a config file's keys) raises this too, so every
    such message reads the same.

    >>> str(keyword_error("EarlyStopping", "patiance", ["monitor", "patience", "mode"]))
    "EarlyStopping() got an unexpected keyword argument 'patiance'. Did you mean 'patience'?"
    >>> str(keyword_error("Thing", "zzz", ["alpha", "beta"], docs="the 'Thing' page"))
    "Thing() got an unexpected keyword argument 'zzz'. Accepted keywords: alpha, beta (see the 'Thing' page)."
    """
    names = [name for name in accepted if not name.startswith("_")]
    suggestions = close_matches(keyword, names)
    message = f"{owner}() got an unexpected keyword argument {keyword!r}."
    if suggestions:
        quoted = [repr(s) for s in suggestions]
        message += " Did you mean " + (" or ".join([", ".join(quoted[:-1]), quoted[-1]]) if len(quoted) > 1
                                       else quoted[0]) + "?"
    else:
        message += f" Accepted keywords: {', '.join(names)}" + (f" (see {docs})." if docs else ".")
    return UnexpectedKeywordError(message, keyword, suggestions)


def _keyword_names(function: Callable[..., Any]) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = list(inspect.signature(function).parameters.values())
    return [p.name for p in parameters if p.kind in kinds and p.name not in ("self", "cls")]


def _rewritten(error: TypeError, function: Callable[..., Any], owner: str, docs: str | None) -> TypeError | None:
    """The suggestion error for ``error``, or None when ``error`` is not Python refusing this very call."""
    # Python refuses a keyword before the callee's frame exists, so the traceback stops at the wrapper's own
    # frame. A TypeError with the same text from deeper down (the function calling something else with a bad
    # keyword) has more frames and is left alone: its names belong to another callable.
    if isinstance(error, UnexpectedKeywordError) or error.__traceback__ is None or error.__traceback__.tb_next:
        return None
    match = _UNEXPECTED.search(str(error))
    if match is None:
        return None
    return keyword_error(owner, match.group(1), _keyword_names(function), docs)


def suggest_keywords(target: T | None = None, *, docs: str | None = None) -> Any:
    """Decorate a class (its ``__init__``) or a function so that an unknown keyword names the close match.

    Put it above ``@dataclass`` so that it wraps the generated ``__init__``. ``docs`` says where the keywords are
    documented; it is shown when no keyword is close. ``inspect.signature`` of the decorated callable is
    unchanged (``functools.wraps``), so tools that read signatures (jsonargparse, ``help()``) see the original.

    >>> @suggest_keywords(docs="help(scale)")
    ... def scale(value: float, *, factor: float = 2.0) -> float:
    ...     return value * factor
    >>> scale(1.0, factr=3.0)
    Traceback (most recent call last):
      ...
    engine.keywords.UnexpectedKeywordError: scale() got an unexpected keyword argument 'factr'. Did you mean 'factor'?
    """
    if target is None:
        return functools.partial(suggest_keywords, docs=docs)
    if isinstance(target, type):
        _wrap_init(target, docs)
        return target
    return _wrap_function(target, docs)


def _wrap_init(cls: type[Any], docs: str | None) -> None:
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError as error:
            # A subclass that inherits this __init__ is what the user wrote; one with its own __init__ passed
            # the keyword on to ours, so ours is named.
            owner = type(self).__name__ if type(self).__init__ is __init__ else cls.__name__
            better = _rewritten(error, init, owner, docs)
            if better is None:
                raise
            raise better from None

    cls.__init__ = __init__


def _wrap_function(function: Callable[..., Any], docs: str | None) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except TypeError as error:
            better = _rewritten(error, function, function.__name__, docs)
            if better is None:
                raise
            raise better from None

    return wrapper


__all__ = ["UnexpectedKeywordError", "close_matches", "keyword_error", "suggest_keywords"]
