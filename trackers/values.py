"""Turn what a user passes to ``log`` into a flat ``{name: int | float | bool | str}`` dict, once per call."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

Scalar = int | float | bool | str
_V = TypeVar("_V")  # what _flatten's convert makes of each value

_ACCEPTED = ("int, float, bool, str, a 0-d tensor or numpy scalar, or a dict of those (flattened as 'a/b')")


def normalize_values(values: Mapping[str, Any]) -> dict[str, Scalar]:
    """Flatten nested dicts to ``"a/b"`` keys and turn 0-d tensors / numpy scalars into Python numbers.

    Each tensor is converted with one ``.item()`` (one host sync per tensor, done here once for every
    tracker). Non-finite floats are kept: a NaN loss is logged as NaN, never dropped.

    Example:
        >>> normalize_values({"loss": 0.5, "val": {"acc": 1, "name": "digits"}})
        {'loss': 0.5, 'val/acc': 1, 'val/name': 'digits'}

    Raises:
        TypeError: a key is not a str, or a value is of another type (a list, a tensor with more than one
            element, ``None``...); the message names the key and the type.
        ValueError: two entries flatten to the same key (``{"a/b": 1, "a": {"b": 2}}``).
    """
    return dict(_flatten(values, "", _to_python))


def flatten_config(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A run configuration with nested dicts flattened to ``"a/b"`` keys, values as they are (for a backend's
    parameter table: TensorBoard's hparams plugin, MLflow's params).

    Example:
        >>> flatten_config({"lr": 0.1, "model": {"width": 64}})
        {'lr': 0.1, 'model/width': 64}
    """
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def group_values(values: Mapping[str, Any], flat: Mapping[str, Scalar]) -> dict[str, Scalar | dict[str, Scalar]]:
    """``flat`` (``normalize_values(values)``) regrouped as ``values`` nests them, one level deep.

    A top-level dict becomes a dict of its leaves, each named by its path below it (``"b"``, ``"c/d"``); other
    values stay as they are. For trackers that show a dict as one group (TensorBoard's ``add_scalars``), with
    the values already converted: no second ``.item()``.

    Example:
        >>> values = {"loss": 0.5, "glue": {"acc": 1, "f1": {"macro": 0.25}}, "val/acc": 0.75}
        >>> group_values(values, normalize_values(values))
        {'loss': 0.5, 'glue': {'acc': 1, 'f1/macro': 0.25}, 'val/acc': 0.75}
    """
    grouped: dict[str, Scalar | dict[str, Scalar]] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            grouped[key] = {name: flat[f"{key}/{name}"] for name, _ in _flatten(value, "", _keep)}
        else:
            grouped[key] = flat[key]
    return grouped


def _keep(key: str, value: Any) -> None:
    return None


def check_values(values: Mapping[str, Any]) -> None:
    """Raise exactly as ``normalize_values`` would, without converting anything (no ``.item()``, no sync).

    Used on ranks that log nothing, so a bad value fails on every rank alike instead of only on the main one.
    """
    for _ in _flatten(values, "", _check_only):
        continue


def _flatten(values: Mapping[str, Any], prefix: str, convert: Callable[[str, Any], _V]) -> Iterator[tuple[str, _V]]:
    if not isinstance(values, Mapping):
        raise TypeError("Expected the logged values to be a dict of name -> value. "
                        f"Received: {type(values).__name__} ({values!r:.80}).")
    seen: set[str] = set()
    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"Logged metric names must be str. Received key {key!r} of type "
                            f"{type(key).__name__}.")
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            pairs: Iterable[tuple[str, _V]] = _flatten(value, f"{full}/", convert)
        else:
            pairs = ((full, convert(full, value)),)
        for name, item in pairs:
            if name in seen:
                raise ValueError(f"Two logged values flatten to the same name {name!r}: nested dicts are "
                                 "joined with '/', so rename one of them.")
            seen.add(name)
            yield name, item


def _to_python(key: str, value: Any) -> Scalar:
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # a plain int for int subclasses (IntEnum, ...)
    if isinstance(value, float):
        return float(value)  # numpy.float64 is a float subclass; trackers get a plain float
    _check_array_like(key, value)
    item = value.item()
    if isinstance(item, (bool, int, float)):
        return item
    raise TypeError(f"Cannot log {key!r}: its .item() is a {type(item).__name__}. Accepted: {_ACCEPTED}.")


def _check_only(key: str, value: Any) -> None:
    if not isinstance(value, (bool, str, int, float)):
        _check_array_like(key, value)


def _check_array_like(key: str, value: Any) -> None:
    """Accept 0-d tensors / numpy scalars (anything with ``ndim == 0`` and ``.item()``); reject the rest."""
    ndim = getattr(value, "ndim", None)
    if ndim == 0 and callable(getattr(value, "item", None)):
        return
    if ndim is not None:
        shape = tuple(getattr(value, "shape", ()))
        raise TypeError(f"Cannot log {key!r}: got a {type(value).__name__} of shape {shape}. "
                        f"Accepted: {_ACCEPTED}. Reduce it first (e.g. .mean()) or log its elements under "
                        "separate names.")
    raise TypeError(f"Cannot log {key!r}: got a value of type {type(value).__name__} ({value!r:.80}). "
                    f"Accepted: {_ACCEPTED}.")
