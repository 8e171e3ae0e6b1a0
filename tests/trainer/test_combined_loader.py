"""``CombinedLoader`` (trainer.utilities): what each mode yields, ``len()``, the collection views and the errors.

The expected values were observed from Lightning 2.6.6's ``lightning.pytorch.utilities.CombinedLoader``
(tests/parity_scripts/record_combined_loader.py prints them).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from trainer.utilities import CombinedLoader


def plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def two() -> dict[str, DataLoader]:
    return {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}


A0, A1, B0, B1, B2 = [0, 1, 2, 3], [4, 5], [0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]
# Lightning 2.6.6, per mode: len() and the (batch, batch_idx, dataloader_idx) items of two() given as a dict.
RECORDED = {
    "min_size": (2, [({"a": A0, "b": B0}, 0, 0), ({"a": A1, "b": B1}, 1, 0)]),
    "max_size_cycle": (3, [({"a": A0, "b": B0}, 0, 0), ({"a": A1, "b": B1}, 1, 0), ({"a": A0, "b": B2}, 2, 0)]),
    "max_size": (3, [({"a": A0, "b": B0}, 0, 0), ({"a": A1, "b": B1}, 1, 0), ({"a": None, "b": B2}, 2, 0)]),
    "sequential": (5, [(A0, 0, 0), (A1, 1, 0), (B0, 0, 1), (B1, 1, 1), (B2, 2, 1)]),
}


@pytest.mark.parametrize("mode", list(RECORDED))
def test_each_mode_yields_lightnings_items_and_length(mode: str) -> None:
    length, items = RECORDED[mode]
    combined = CombinedLoader(two(), mode)  # type: ignore[arg-type]
    iter(combined)
    assert len(combined) == length
    assert [plain(item) for item in combined] == items


@pytest.mark.parametrize("mode", list(RECORDED))
def test_a_list_gives_list_shaped_batches(mode: str) -> None:
    _, items = RECORDED[mode]
    combined = CombinedLoader(list(two().values()), mode)  # type: ignore[arg-type]
    got = [plain(item) for item in combined]
    if mode == "sequential":
        assert got == items
    else:
        assert got == [([batch["a"], batch["b"]], i, d) for batch, i, d in items]


def test_default_mode_is_min_size_and_a_bad_mode_names_the_choices() -> None:
    assert CombinedLoader(two()).mode == "min_size"
    with pytest.raises(ValueError, match=r"Unsupported mode 'cycle', please select one of: \['min_size', "
                                         r"'max_size_cycle', 'max_size', 'sequential'\]"):
        CombinedLoader(two(), "cycle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unsupported mode 'MIN_SIZE'"):  # modes are case-sensitive
        CombinedLoader(two(), "MIN_SIZE")  # type: ignore[arg-type]


def test_len_needs_iter_first_and_again_after_reset() -> None:
    combined = CombinedLoader(two(), "max_size")
    with pytest.raises(RuntimeError, match=r"Please call `iter\(combined_loader\)` first"):
        len(combined)
    iter(combined)
    assert len(combined) == 3
    combined.reset()
    with pytest.raises(RuntimeError, match=r"Please call `iter\(combined_loader\)` first"):
        len(combined)


def test_nested_collections_flatten_and_keep_their_shape() -> None:
    nested = {"x": [DataLoader(range(4), batch_size=2), DataLoader(range(2))], "y": DataLoader(range(3))}
    combined = CombinedLoader(nested, "max_size_cycle")
    assert len(combined.flattened) == 3
    assert combined.flattened[2] is nested["y"]
    assert {k: [type(s).__name__ for s in v] if isinstance(v, list) else type(v).__name__
            for k, v in combined.sampler.items()} == {"x": ["SequentialSampler", "SequentialSampler"],
                                                      "y": "SequentialSampler"}
    assert {k: [type(s).__name__ for s in v] if isinstance(v, list) else type(v).__name__
            for k, v in combined.batch_sampler.items()} == {"x": ["BatchSampler", "BatchSampler"],
                                                            "y": "BatchSampler"}
    iter(combined)
    assert len(combined) == 3
    assert plain(next(combined)) == ({"x": [[0, 1], [0]], "y": [0]}, 0, 0)
    assert combined.iterables is nested


def test_flattened_can_be_replaced_one_for_one() -> None:
    combined = CombinedLoader(two(), "min_size")
    other = [DataLoader(range(2)), DataLoader(range(3))]
    combined.flattened = other
    assert combined.iterables == {"a": other[0], "b": other[1]}
    with pytest.raises(ValueError, match=r"Mismatch in flattened length \(1\) and existing length \(2\)"):
        combined.flattened = [DataLoader(range(2))]


def test_single_loader_ranges_and_containers_of_numbers() -> None:
    single = CombinedLoader(DataLoader(range(3)), "max_size_cycle")
    assert [plain(item) for item in single] == [([0], 0, 0), ([1], 1, 0), ([2], 2, 0)]
    ranges = CombinedLoader([range(3), range(5)], "max_size_cycle")
    iter(ranges)
    assert len(ranges) == 5
    assert [plain(item) for item in ranges] == [([0, 0], 0, 0), ([1, 1], 1, 0), ([2, 2], 2, 0), ([0, 3], 3, 0),
                                                 ([1, 4], 4, 0)]
    # A container of numbers is one iterable, not a collection (as in Lightning).
    assert CombinedLoader([[1, 2], [3, 4, 5]], "min_size").flattened == [[1, 2], [3, 4, 5]]


def test_tuples_and_namedtuples_come_back_as_given() -> None:
    Pair = namedtuple("Pair", "left right")
    combined = CombinedLoader(Pair(range(2), range(2)), "min_size")
    batch, _, _ = next(iter(combined))
    assert isinstance(batch, Pair) and batch == Pair(0, 0)
    batch, _, _ = next(iter(CombinedLoader((range(2), range(2)), "min_size")))
    assert batch == (0, 0)


def test_limits_shorten_len_but_not_the_walk_except_in_sequential_mode() -> None:
    combined = CombinedLoader({"a": DataLoader(range(10), batch_size=2), "b": DataLoader(range(4), batch_size=2)},
                              "max_size_cycle")
    combined.limits = [2, 1]
    iter(combined)
    assert combined.limits == [2, 1] and len(combined) == 2
    # As Lightning: max_size_cycle still walks to the longest loader's end (the trainer stops at len()).
    assert [plain(b) for b, _, _ in combined] == [{"a": [0, 1], "b": [0, 1]}, {"a": [2, 3], "b": [2, 3]},
                                                 {"a": [4, 5], "b": [0, 1]}, {"a": [6, 7], "b": [2, 3]},
                                                 {"a": [8, 9], "b": [0, 1]}]
    with pytest.raises(ValueError, match=r"Mismatch in number of limits \(3\) and number of iterables \(2\)"):
        combined.limits = [1, 2, 3]
    sequential = CombinedLoader([range(3), range(4)], "sequential")
    sequential.limits = 2
    iter(sequential)
    assert len(sequential) == 4
    assert list(sequential) == [(0, 0, 0), (1, 1, 0), (0, 0, 1), (1, 1, 1)]
