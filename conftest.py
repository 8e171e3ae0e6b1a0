"""State hygiene for every collected item: the tests under ``tests/`` and the doctests in the packages.

At the repository root (not in ``tests/conftest.py``) because ``--doctest-modules`` collects ``engine/``,
``trainer/``, ... too: a doctest that builds ``AcceleratorState`` must not depend on whether an earlier item in
the same xdist worker left an ``Accelerator`` behind (which item that is depends on how the files were split).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest


def _reset_engine_state() -> None:
    state = sys.modules.get("engine.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Each test or doctest gets the environment, process group and engine state it started with."""
    import torch.distributed as dist  # here, not at import: tests/conftest.py pins the kernels before torch starts

    saved = dict(os.environ)
    _reset_engine_state()
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _reset_engine_state()
    os.environ.clear()
    os.environ.update(saved)
