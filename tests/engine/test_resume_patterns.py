"""Both resume patterns are exact on one process: Accelerate's (load_state, skip_first_batches for the resumed
epoch, then the loader) and the engine's (load_state, then the loader), at every batch of an epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from engine import Accelerator
from tests.engine.resume_scripts import BATCHES_PER_EPOCH, resume_everywhere, same, train


@pytest.mark.parametrize("pattern", ["accelerate", "engine"])
def test_resume_at_every_batch_is_bitwise_exact(tmp_path: Path, pattern: str) -> None:
    assert resume_everywhere(str(tmp_path), pattern) == []


def test_a_checkpoint_taken_inside_the_skipped_epoch_resumes_exactly(tmp_path: Path) -> None:
    # save_state holds the prepared loader, not the skip_first_batches view: the view reports through it.
    full = train(str(tmp_path))
    train(str(tmp_path), checkpoint_at=3)
    again = train(str(tmp_path), checkpoint_at=5, resume_from=str(tmp_path / "step_3"), seed=7)
    assert same(again, full)
    resumed = train(str(tmp_path), resume_from=str(tmp_path / "step_5"), seed=8)
    assert same(resumed, full) and resumed["seen"] == full["seen"][5:]


def test_the_loader_after_a_skipped_epoch_yields_whole_epochs(tmp_path: Path) -> None:
    # The bug this guards against: the position restored by load_state stayed pending on the loader, so the
    # epoch after the skipped one lost its first batches (or all of them) while len() still said 7.
    for k in (3, BATCHES_PER_EPOCH):
        train(str(tmp_path / str(k)), checkpoint_at=k)
        resumed = train(str(tmp_path / str(k)), resume_from=str(tmp_path / str(k) / f"step_{k}"))
        skipped = k % BATCHES_PER_EPOCH
        expected = ([(BATCHES_PER_EPOCH - skipped, BATCHES_PER_EPOCH - skipped)] if k < BATCHES_PER_EPOCH else []) \
            + [(BATCHES_PER_EPOCH, BATCHES_PER_EPOCH)]
        assert resumed["lengths"] == expected


def test_a_skip_that_disagrees_with_the_restored_position_is_refused() -> None:
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(list(range(14)), batch_size=2, shuffle=True))
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    loader.load_state_dict(loader.state_dict())  # what load_state does with a checkpoint taken here
    with pytest.raises(ValueError, match=r"skip_first_batches\(dataloader, 2\).*batch 3 of epoch 0.*num_batches=3"):
        accelerator.skip_first_batches(loader, 2)
    view = accelerator.skip_first_batches(loader, 3)
    assert len(view) == 4 and len(list(view)) == 4
    assert len(loader) == 7 and len(list(loader)) == 7 and loader.iteration == 2
    # Claimed once: a later skip is a plain skip again, as in Accelerate.
    assert len(list(accelerator.skip_first_batches(loader, 2))) == 5
