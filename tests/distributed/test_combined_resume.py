"""Exact resume with combined training loaders on 2 real processes (torchrun): each loader is sharded by the
engine and each rank's position of each loader is restored."""

from __future__ import annotations

from typing import Any

import pytest

from tests.trainer.resume_script import launch
from tests.trainer.test_resume import assert_same_run, resumed_from


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = str(tmp_path_factory.mktemp("combined_reference2"))
    assert launch(directory, "--combined", nproc=2) == 0
    return directory


def test_combined_loaders_sigkill_then_resume_on_two_processes_is_bitwise_exact(reference: str,
                                                                              tmp_path: Any) -> None:
    run = str(tmp_path)
    # Per rank: "a" 6 batches, "b" 3 (20 samples, 2 x 4 per batch, evened out): "b" starts over after batch 3.
    assert launch(run, "--combined", "--kill-at", "3", nproc=2) == "killed"
    assert launch(run, "--combined", "--ckpt-path", "last", "--kill-at", "10", nproc=2) == "killed"
    assert resumed_from(run) == (0, 2, 1)
    assert launch(run, "--combined", "--ckpt-path", "last", "--kill-at-epoch-end", "1", nproc=2) == "killed"
    assert resumed_from(run) == (1, 4, 5)  # "b" 1 batch into its second pass of epoch 1
    assert launch(run, "--combined", "--ckpt-path", "last", nproc=2) == 0
    assert resumed_from(run) == (1, 6, 6)
    assert_same_run(reference, run)
