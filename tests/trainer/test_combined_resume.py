"""Exact resume with several training loaders: a run over ``{"a": loader, "b": shorter loader}`` (combined in
``"max_size_cycle"`` mode, "b" starting over twice an epoch) SIGKILLed at several points resumes bitwise.

The kill points cover a checkpoint with "b" half-way through a pass, one right after "b" handed out its last
batch (it starts over at the next step), and one at an epoch's end, where "b" was cut in its third pass: the next
epoch must start "b" from the same sampler state in the resumed run as in the uninterrupted one.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.trainer.resume_script import launch
from tests.trainer.test_resume import assert_same_run, resumed_from


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = str(tmp_path_factory.mktemp("combined_reference"))
    assert launch(directory, "--combined") == 0
    return directory


def test_combined_loaders_sigkill_then_resume_is_bitwise_exact(reference: str, tmp_path: Any) -> None:
    run = str(tmp_path)
    # 11 combined batches per epoch ("b" has 5: its passes start at batches 0, 5 and 10); accumulation 2, so
    # checkpoints after batches 2, 4, 6, 8, 10 and 11 of each epoch.
    assert launch(run, "--combined", "--kill-at", "3") == "killed"
    assert launch(run, "--combined", "--ckpt-path", "last", "--kill-at", "16") == "killed"
    assert resumed_from(run) == (0, 2, 1)
    assert launch(run, "--combined", "--ckpt-path", "last", "--kill-at", "21") == "killed"
    assert resumed_from(run) == (1, 4, 8)  # "b" 4 batches into its first pass
    assert launch(run, "--combined", "--ckpt-path", "last", "--kill-at-epoch-end", "1") == "killed"
    assert resumed_from(run) == (1, 10, 11)  # "b" just handed out the last batch of its second pass
    assert launch(run, "--combined", "--ckpt-path", "last") == 0
    assert resumed_from(run) == (1, 11, 12)  # epoch 1 done; "b" was cut 1 batch into its third pass
    assert_same_run(reference, run)


def test_the_combined_run_differs_from_the_single_loader_run(reference: str, tmp_path: Any) -> None:
    """The second loader is really trained on (the exactness above is not the one-loader run's)."""
    import torch

    single = str(tmp_path)
    assert launch(single) == 0
    a = torch.load(os.path.join(reference, "final.pt"))
    b = torch.load(os.path.join(single, "final.pt"))
    assert any(not torch.equal(a[name], b[name]) for name in a)
