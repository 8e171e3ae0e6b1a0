"""The trainer on 2 real processes (gloo): sync_dist, predict order, DDP training, a stop on one rank.

Everything runs in one spawn (a module-level function per rank) to keep the test fast.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from callbacks import Callback
from tests.trainer.helpers import QUIET, MemoryTracker, Regressor, data, indexed
from trainer import Trainer


class Synced(Regressor):
    """Each rank logs values that differ by rank, with and without sync_dist."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("rank_step", float(self.trainer.global_rank), sync_dist=True)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        rank = self.trainer.global_rank
        value = torch.tensor(float(rank * 10 + batch_idx))
        self.log("local", value, sync_dist=False)  # Lightning's per-process value, asked for explicitly
        self.log("default", value)  # exact over both processes by default in evaluation
        self.log("synced", value, sync_dist=True)
        self.log("weighted", value, sync_dist=True, batch_size=rank + 1)
        self.log("max", value, reduce_fx="max", sync_dist=True)
        self.log("sum", value, reduce_fx="sum", sync_dist=True)
        self.log("median", value, reduce_fx=lambda t: t.median(), sync_dist=True)


class Indices(Regressor):
    def __init__(self) -> None:
        super().__init__(features=1)

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        index, x = batch
        return {"index": index, "double": 2 * x.squeeze(1)}


class StopOnRankOne(Callback):
    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_rank == 1 and trainer.global_step == 3:
            trainer.should_stop = True


def _per_rank() -> dict[str, Any]:
    out: dict[str, Any] = {}
    # sync_dist: validation with 6 samples in batches of 2 -> 3 batches per rank.
    tracker = MemoryTracker()
    torch.manual_seed(0)
    trainer = Trainer(**{**QUIET, "log_with": [tracker]}, max_epochs=1, log_every_n_steps=1)
    trainer.fit(Synced(), data(n=8, batch_size=2), data(n=12, batch_size=2))
    out["metrics"] = {k: float(v) for k, v in trainer.callback_metrics.items()}
    out["tracker_rows"] = len(tracker.rows)

    # DDP: 16 samples, 2 per process per step; every rank ends with the same weights.
    torch.manual_seed(0)
    module = Regressor()
    Trainer(**QUIET, max_epochs=1).fit(module, data(n=16, batch_size=2, seed=7))
    out["weights"] = [p.detach().tolist() for p in module.parameters()]  # plain lists cross the queue safely

    # predict: uneven datasets come back whole, in dataset order, on every rank.
    predictor = Trainer(**QUIET)
    out["predict"] = {}
    for n, batch_size in ((10, 4), (7, 2), (3, 4)):
        batches = predictor.predict(Indices(), indexed(n, batch_size))
        out["predict"][n, batch_size] = (torch.cat([b["index"] for b in batches]).tolist(),
                                         torch.cat([b["double"] for b in batches]).tolist(), len(batches))

    # A stop asked on rank 1 only stops both ranks at the same step.
    stopping = Trainer(**QUIET, max_epochs=3, callbacks=[StopOnRankOne()])
    stopping.fit(Regressor(), data(n=16, batch_size=2))
    out["stopped_at"] = stopping.global_step
    return out


def test_two_processes(run_distributed: Any) -> None:
    rank0, rank1 = run_distributed(_per_rank, world_size=2)

    # Per-rank values: rank 0 logs 0, 1, 2 and rank 1 logs 10, 11, 12.
    assert (rank0["metrics"]["local"], rank1["metrics"]["local"]) == (1.0, 11.0)
    for metrics in (rank0["metrics"], rank1["metrics"]):
        assert metrics["synced"] == metrics["default"] == pytest.approx(6.0)
        # The global batch-size-weighted mean (weights 1 on rank 0, 2 on rank 1), not the mean of rank means.
        assert metrics["weighted"] == pytest.approx((1 * 3 + 2 * 33) / 9)
        assert (metrics["max"], metrics["sum"], metrics["median"]) == (12.0, 36.0, 2.0)
        assert metrics["rank_step"] == 0.5  # on-step values are reduced when logged
    assert rank0["tracker_rows"] > 0 and rank1["tracker_rows"] == 0  # trackers run on the main process

    assert rank0["weights"] == rank1["weights"]
    torch.manual_seed(0)
    single = Regressor()
    Trainer(**QUIET, max_epochs=1).fit(single, data(n=16, batch_size=4, seed=7))
    for got, expected in zip(rank0["weights"], single.parameters()):
        torch.testing.assert_close(torch.tensor(got), expected.detach())  # DDP, 2 x 2 samples == 1 process, 4

    for (n, batch_size), (indices, doubles, count) in rank0["predict"].items():
        assert indices == list(range(n)), (n, batch_size)
        assert doubles == [2.0 * i for i in range(n)]
        assert count == -(-n // batch_size)  # what one process with the same batch size returns
    assert rank1["predict"] == rank0["predict"]

    assert rank0["stopped_at"] == rank1["stopped_at"] == 3
