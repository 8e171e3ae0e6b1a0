"""The trainer's resilience on 2 real processes: exact resume after SIGKILL / SIGTERM under torchrun, cross-rank
EarlyStopping, a non-finite loss on one rank, and a rank that fails while the other waits in a collective."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch

from callbacks import EarlyStopping
from tests.conftest import run_distributed
from tests.trainer.helpers import QUIET, SAVING, Regressor, data
from tests.trainer.resume_script import launch
from tests.trainer.test_resume import assert_same_run, resumed_from
from trainer import Trainer


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = str(tmp_path_factory.mktemp("reference2"))
    assert launch(directory, nproc=2) == 0
    return directory


def test_sigkill_then_resume_on_two_processes_is_bitwise_exact(reference: str, tmp_path: Any) -> None:
    run = str(tmp_path)
    # Per rank: 6 batches per epoch (44 samples, 2 x 4 per batch, the last evened out), steps after 2, 4, 6.
    assert launch(run, "--kill-at", "3", nproc=2) == "killed"  # between the two micro-batches of step 2
    assert launch(run, "--ckpt-path", "last", "--kill-at", "9", nproc=2) == "killed"  # mid-epoch 1, mid-window
    assert resumed_from(run) == (0, 2, 1)
    assert launch(run, "--ckpt-path", "last", "--kill-at-epoch-end", "1", nproc=2) == "killed"
    assert resumed_from(run) == (1, 2, 4)
    assert launch(run, "--ckpt-path", "last", nproc=2) == 0
    assert resumed_from(run) == (1, 6, 6)
    assert_same_run(reference, run)


def test_sigterm_on_one_rank_stops_both_with_a_checkpoint(reference: str, tmp_path: Any) -> None:
    run = str(tmp_path)
    # Only rank 1 gets the signal; both agree at the next optimizer step, save, and exit with status 0.
    assert launch(run, "--no-step-checkpoints", "--sigterm-at", "4", "--signal-rank", "1", "--exit-code", "0",
                  nproc=2) == 0
    assert os.listdir(os.path.join(run, "checkpoints")) == ["preempted"]
    assert launch(run, "--no-step-checkpoints", "--ckpt-path", "last", nproc=2) == 0
    assert resumed_from(run) == (0, 6, 3)  # the signal came mid-window: saved after the window's step
    assert_same_run(reference, run)


# -- in processes started by run_distributed ------------------------------------------------------------------
class RankMetric(Regressor):
    """Validation logs "score": 1.0 on rank 0 always; on rank 1 it gets worse from epoch 2 on."""

    def __init__(self, sync: bool) -> None:
        super().__init__()
        self.sync = sync

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        rank, epoch = self.trainer.global_rank, self.trainer.current_epoch
        value = 1.0 - 0.1 * epoch if rank == 0 or epoch < 2 else 1.0 + epoch
        self.log("score", value, sync_dist=self.sync)


def _early_stopping(sync: bool) -> tuple[int, int, int]:
    stop = EarlyStopping(monitor="score", patience=1)
    trainer = Trainer(**QUIET, max_epochs=8, callbacks=[stop])
    trainer.fit(RankMetric(sync), data(n=16, batch_size=2), data(n=8, batch_size=2))
    return trainer.global_step, trainer.current_epoch, stop.wait_count


def _early_stopping_both() -> dict[str, Any]:
    return {"local": _early_stopping(sync=False), "synced": _early_stopping(sync=True)}


def test_early_stopping_stops_every_rank_at_the_same_step(run_distributed: Any) -> None:
    rank0, rank1 = run_distributed(_early_stopping_both, world_size=2)
    # Only rank 1's own value worsens (epoch 2): it alone decides, both stop after that epoch's validation.
    assert rank0["local"][:2] == rank1["local"][:2] == (12, 3)
    assert (rank0["local"][2], rank1["local"][2]) == (0, 1)
    # The synced mean worsens too (from 0.9 to 1.9 at epoch 2): both decide, both stop at the same step.
    assert rank0["synced"] == rank1["synced"] == (12, 3, 1)


class NanOnRankOne(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.trainer.global_rank == 1 and self.trainer.global_step == 2 else loss


def _nan_on_rank_one() -> str:
    trainer = Trainer(**QUIET, max_epochs=2, log_every_n_steps=1)
    try:
        trainer.fit(NanOnRankOne(), data(n=16, batch_size=2))
    except FloatingPointError as error:
        return f"{error} at step {trainer.global_step}"
    return "no error"


def test_a_non_finite_loss_on_one_rank_stops_both_naming_it(run_distributed: Any) -> None:
    rank0, rank1 = run_distributed(_nan_on_rank_one, world_size=2)
    for message in (rank0, rank1):
        assert message.startswith("Non-finite loss: rank 1: nan at optimizer step 3 (epoch 0, batch 2).")
        assert message.endswith("at step 3")


class FailsOnRankOne(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_rank == 1 and batch_idx == 2:
            raise RuntimeError("rank 1 broke")
        return super().training_step(batch, batch_idx)


def _one_rank_fails(directory: str) -> None:
    trainer = Trainer(**QUIET, max_epochs=1)
    start = time.monotonic()
    try:
        trainer.fit(FailsOnRankOne(), data(n=16, batch_size=2))
    except RuntimeError as error:
        with open(os.path.join(directory, f"rank{trainer.global_rank}"), "w") as handle:
            handle.write(f"{time.monotonic() - start:.1f} {str(error).splitlines()[0][:100]}")
        if trainer.global_rank == 1:
            time.sleep(60)  # a caught error, or a stuck shutdown: the process would not end by itself


def test_a_rank_that_fails_does_not_leave_the_other_waiting(run_distributed: Any, tmp_path: Any) -> None:
    with pytest.raises(RuntimeError, match="rank 1 died with exit code 1"):  # ended by the trainer, not at 60 s
        run_distributed(_one_rank_fails, 2, str(tmp_path), timeout=40)
    with open(tmp_path / "rank1") as handle:
        assert handle.read().endswith("rank 1 broke")
    with open(tmp_path / "rank0") as handle:
        elapsed, message = handle.read().split(" ", 1)
    # gloo words a peer that went away in one of these ways, depending on where its read was when it happened.
    assert any(words in message for words in ("Connection closed by peer", "Connection reset", "Read error")), message
    assert float(elapsed) < 15  # rank 0's collective failed once rank 1 was gone, not at a timeout


def _fit_named(project: str, name: str, max_epochs: int, prefix: str, ckpt_path: str | None = None) -> dict[str, Any]:
    import warnings

    from callbacks import ModelCheckpoint
    from tests.trainer import test_fallback

    checkpoint = ModelCheckpoint(save_top_k=-1, filename=prefix + "-{epoch}")
    trainer = Trainer(**SAVING, max_epochs=max_epochs, seed=0, project_dir=project, callbacks=[checkpoint])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(getattr(test_fallback, name)(), data(n=16, batch_size=4), data(n=8), ckpt_path=ckpt_path)
    return {"step": trainer.global_step, "warnings": [str(w.message) for w in caught if "Falling back" in str(w.message)]}


def test_last_falls_back_only_within_its_run_on_two_processes(tmp_path: Any) -> None:
    from tests.trainer.test_fallback import _flip

    project, folders = str(tmp_path), tmp_path / "checkpoints"
    run_distributed(_fit_named, 2, project, "Regressor", 1, "a")  # run A: a-epoch=0 (2 steps per epoch here)
    run_distributed(_fit_named, 2, project, "Other", 2, "b")  # run B, same parameters: b-epoch=0, b-epoch=1
    run_distributed(_fit_named, 2, project, "Regressor", 2, "a", str(folders / "a-epoch=0.ckpt"))  # A: a-epoch=1
    _flip(folders / "a-epoch=1.ckpt")
    ranks = run_distributed(_fit_named, 2, project, "Regressor", 3, "a", "last")
    assert [r["step"] for r in ranks] == [6, 6]  # from a-epoch=0 (step 2), not B's b-epoch=1 (step 4)
    assert len(ranks[0]["warnings"]) == 1 and ranks[0]["warnings"][0].endswith(f"{folders / 'a-epoch=0.ckpt'}.")
    assert ranks[1]["warnings"] == []  # the main process warns
    with pytest.raises(RuntimeError, match=r"whose parameters do not match the tests\.trainer\.test_fallback\.Wider"):
        run_distributed(_fit_named, 2, project, "Wider", 4, "w", "last")
