"""The value normaliser: what `log` accepts, how it is flattened and converted, and the errors otherwise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trackers import check_values, normalize_values


def test_flattens_nested_dicts_and_converts_scalars_to_python() -> None:
    values = {
        "loss": torch.tensor(0.25),
        "count": torch.tensor(7),
        "flag": torch.tensor(True),
        "np_float": np.float32(0.5),
        "np_int": np.int64(3),
        "np_bool": np.bool_(False),
        "plain": 2,
        "name": "digits",
        "val": {"acc": 1.0, "deep": {"f1": np.float64(0.75)}},
    }
    out = normalize_values(values)
    assert out == {"loss": 0.25, "count": 7, "flag": True, "np_float": 0.5, "np_int": 3, "np_bool": False,
                   "plain": 2, "name": "digits", "val/acc": 1.0, "val/deep/f1": 0.75}
    # Plain Python types, so no tracker ever sees a tensor or a numpy scalar.
    assert {k: type(v) for k, v in out.items()} == {
        "loss": float, "count": int, "flag": bool, "np_float": float, "np_int": int, "np_bool": bool,
        "plain": int, "name": str, "val/acc": float, "val/deep/f1": float}


def test_non_finite_values_are_kept() -> None:
    out = normalize_values({"nan": float("nan"), "inf": torch.tensor(float("inf")),
                            "ninf": np.float64(-np.inf)})
    assert list(out) == ["nan", "inf", "ninf"]
    assert math.isnan(out["nan"]) and out["inf"] == math.inf and out["ninf"] == -math.inf


@pytest.mark.parametrize(("value", "fragment"), [
    (torch.tensor([1.0, 2.0]), "shape (2,)"),
    (np.zeros((2, 2)), "shape (2, 2)"),
    ([1, 2], "type list"),
    (None, "type NoneType"),
    (torch.tensor(1 + 2j), ".item() is a complex"),
])
def test_unsupported_values_raise_naming_key_and_type(value: object, fragment: str) -> None:
    with pytest.raises(TypeError) as info:
        normalize_values({"outer": {"bad": value}})
    message = str(info.value)
    assert "'outer/bad'" in message and fragment in message and "Accepted: int, float, bool, str" in message


def test_bad_keys_and_collisions() -> None:
    with pytest.raises(TypeError, match=r"names must be str. Received key 3 of type int"):
        normalize_values({3: 1.0})
    with pytest.raises(ValueError, match=r"same name 'a/b'"):
        normalize_values({"a/b": 1, "a": {"b": 2}})
    with pytest.raises(TypeError, match=r"dict of name -> value. Received: list"):
        normalize_values([("a", 1)])  # type: ignore[arg-type]


class _NoItem:
    """Array-like that must not be converted: check_values runs on ranks that log nothing, without a sync."""

    ndim = 0

    def item(self) -> float:
        raise AssertionError("check_values must not call .item()")


def test_check_values_validates_without_converting() -> None:
    check_values({"x": _NoItem(), "y": {"z": 1.0}, "s": "text"})
    with pytest.raises(TypeError, match=r"'y/z'.*type list"):
        check_values({"x": _NoItem(), "y": {"z": [1.0]}})
    with pytest.raises(AssertionError, match="must not call"):
        normalize_values({"x": _NoItem()})
