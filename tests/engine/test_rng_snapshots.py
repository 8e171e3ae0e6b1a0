"""`RNGSnapshots`: the cheap repeated RNG snapshot equals the full one after any sequence of draws.

It re-reads Python's and numpy's states only when their Mersenne Twister words moved, and every time while a
gaussian is cached (a draw can consume it without moving the words): each case below would return a stale state
if that check were missing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from engine.random import RNGSnapshots, restore_snapshot, snapshot_rng


def _same(a: Any, b: Any) -> bool:
    (ta, pa, na, _), (tb, pb, nb, _) = a, b
    return torch.equal(ta, tb) and pa == pb and na[0] == nb[0] and np.array_equal(na[1], nb[1]) \
        and na[2:] == nb[2:]


DRAWS: dict[str, Callable[[], Any]] = {
    "nothing": lambda: None,
    "torch": lambda: torch.rand(3),
    "random": random.random,
    "random.gauss (caches one)": lambda: random.gauss(0.0, 1.0),
    "numpy": np.random.rand,
    "numpy gaussian (caches one)": np.random.randn,
    "numpy seeded again": lambda: np.random.seed(7),
    "random seeded again": lambda: random.seed(7),
    "random.setstate": lambda: random.setstate(random.getstate()),
}


@pytest.mark.parametrize("fast", [True, False])
def test_snapshots_equal_the_full_state_after_any_draws(fast: bool) -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    snapshots = RNGSnapshots()
    if not fast:  # the fallback, as where the words cannot be read
        snapshots._python_view = snapshots._numpy_view = None
    else:
        assert snapshots._python_view is not None and snapshots._numpy_view is not None  # CPython, numpy's MT19937
    order = list(DRAWS) * 3
    generator = random.Random(1)
    for _ in range(200):
        name = generator.choice(order)
        for _ in range(generator.randint(1, 3)):
            DRAWS[name]()
        assert _same(snapshots(), snapshot_rng()), name


def test_a_gaussian_cached_at_rest_is_seen_whichever_draw_consumes_it() -> None:
    snapshots = RNGSnapshots()
    np.random.randn()  # caches the second gaussian of the pair
    random.gauss(0.0, 1.0)
    before = snapshots()
    np.random.randn()  # consumes the cache: the words do not move
    random.gauss(0.0, 1.0)
    after = snapshots()
    assert not _same(before, after) and _same(after, snapshot_rng())
    restore_snapshot(before)
    assert _same(snapshot_rng(), before)
