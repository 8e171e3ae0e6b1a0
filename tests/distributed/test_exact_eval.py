"""Exact evaluation on 2 real processes (promise 8): every sample counted once, the same value on every rank,
equal to one process; ``sync_dist=False`` keeps per-rank values."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import run_distributed
from tests.trainer.helpers import QUIET
from trainer import Trainer, TrainModule

N = 13  # with batches of 4 on 2 processes: 4 batches, the last short, then a whole round of repeats


def _loader(split_batches_size: int = 4) -> DataLoader:
    values = torch.arange(N, dtype=torch.float32) ** 2  # distinct values: a repeat would change every statistic
    return DataLoader(TensorDataset(values, torch.arange(N)), batch_size=split_batches_size)


class Stats(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(1, 1)

    def _log_all(self, prefix: str, batch: Any) -> None:
        values, _ = batch
        self.log(f"{prefix}/mean", values.mean())
        self.log(f"{prefix}/count", float(len(values)), reduce_fx="sum")
        self.log(f"{prefix}/max", values.max(), reduce_fx="max")
        self.log(f"{prefix}/min", values.min(), reduce_fx="min")
        self.log(f"{prefix}/median", values.median(), reduce_fx=lambda v: v.sort().values.sum())
        self.log(f"{prefix}/rank_mean", values.mean(), sync_dist=False)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._log_all("val", batch)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._log_all("test", batch)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _evaluate() -> tuple[dict[str, float], dict[str, float]]:
    trainer = Trainer(**QUIET, accelerator="cpu")
    val = trainer.validate(Stats(), _loader(), verbose=False)[0]
    test = trainer.test(Stats(), _loader(), verbose=False)[0]
    return val, test


def test_validation_and_test_metrics_count_every_sample_once_on_every_rank() -> None:
    one = _evaluate()  # this process: one rank
    ranks = run_distributed(_evaluate, 2)
    values = torch.arange(N, dtype=torch.float32) ** 2
    for stage, index in (("val", 0), ("test", 1)):
        single, r0, r1 = one[index], ranks[0][index], ranks[1][index]
        assert single[f"{stage}/mean"] == pytest.approx(values.mean().item())
        assert single[f"{stage}/count"] == N
        for name in ("mean", "count", "max", "min"):
            key = f"{stage}/{name}"
            assert r0[key] == r1[key] == pytest.approx(single[key], rel=1e-6), key
        # A custom reduction sees each real batch value once, from every rank (here: the batch medians).
        assert r0[f"{stage}/median"] == r1[f"{stage}/median"]
        # sync_dist=False: each rank's own share (without the repeats), as Lightning's per-process value.
        assert r0[f"{stage}/rank_mean"] != r1[f"{stage}/rank_mean"]
