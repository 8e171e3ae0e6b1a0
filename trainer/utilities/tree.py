"""Flatten a (nested) collection of iterables into a list and rebuild the same shape around new leaves.

``CombinedLoader`` uses it: its iterables may be given as a dict, list or tuple (nested too) and each batch comes
back in that shape. As in Lightning, a container holding only ints, floats and strings (and an empty one) is a
leaf, not a collection: ``[[1, 2], [3, 4, 5]]`` is two iterables.

Example:
    >>> leaves, shape = flatten({"a": [1, 2], "b": (range(2), range(3))})
    >>> leaves
    [[1, 2], range(0, 2), range(0, 3)]
    >>> unflatten(["x", "y", "z"], shape)
    {'a': 'x', 'b': ('y', 'z')}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_PRIMITIVES = (int, float, str)


@dataclass(frozen=True)
class Shape:
    """Where the leaves of a flattened collection go: ``kind`` ``"leaf"``, ``"dict"``, ``"list"``, ``"tuple"``
    or ``"namedtuple"``; ``keys`` of a dict; ``children`` the shapes of the items; ``cls`` the container type."""

    kind: str
    cls: type | None = None
    keys: tuple[Any, ...] = ()
    children: tuple[Shape, ...] = ()

    @property
    def is_leaf(self) -> bool:
        return self.kind == "leaf"


LEAF = Shape("leaf")


def _items(value: Any) -> tuple[str, list[Any], tuple[Any, ...]] | None:
    """``(kind, children, keys)`` of a collection that is walked into, else None (a leaf)."""
    if isinstance(value, dict):
        return "dict", list(value.values()), tuple(value.keys())
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return "namedtuple", list(value), ()
    if isinstance(value, (list, tuple)):
        return ("list" if isinstance(value, list) else "tuple"), list(value), ()
    return None


def flatten(value: Any) -> tuple[list[Any], Shape]:
    """The leaves of ``value`` in order (dict insertion order) and the shape to rebuild it with."""
    found = _items(value)
    if found is None or all(isinstance(child, _PRIMITIVES) for child in found[1]):
        return [value], LEAF
    kind, children, keys = found
    leaves: list[Any] = []
    shapes: list[Shape] = []
    for child in children:
        child_leaves, child_shape = flatten(child)
        leaves += child_leaves
        shapes.append(child_shape)
    return leaves, Shape(kind, type(value), keys, tuple(shapes))


def unflatten(leaves: list[Any], shape: Shape) -> Any:
    """``leaves`` put back in the places ``shape`` (from ``flatten``) describes."""
    position = iter(leaves)
    return _build(position, shape)


def _build(leaves: Any, shape: Shape) -> Any:
    if shape.is_leaf:
        return next(leaves)
    children = [_build(leaves, child) for child in shape.children]
    cls = shape.cls
    assert cls is not None
    if shape.kind == "dict":
        return {key: child for key, child in zip(shape.keys, children)} if cls is dict else \
            _rebuild_mapping(cls, shape.keys, children)
    if shape.kind == "namedtuple":
        return cls(*children)
    return children if cls is list else cls(children)


def _rebuild_mapping(cls: type, keys: tuple[Any, ...], children: list[Any]) -> Any:
    try:
        return cls(zip(keys, children))
    except TypeError:  # a mapping type that cannot be built from pairs (defaultdict): a plain dict, same order
        return dict(zip(keys, children))


def map_shape(fn: Callable[[Any], Any], leaves: list[Any], shape: Shape) -> Any:
    """``fn`` applied to each leaf, in ``shape``."""
    return unflatten([fn(leaf) for leaf in leaves], shape)
