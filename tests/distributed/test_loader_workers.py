"""Loader workers on 2 real gloo processes: a stuck worker ends every rank, with its stack, within a bounded time.

Without the limit, rank 1 waits in DataLoader._get_data for the stuck worker forever and rank 0 waits in DDP's
all-reduce for rank 1 (issue 39): here `run_distributed` would time out instead.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from engine import Accelerator, DataLoaderConfiguration

LIMIT_S = 3.0


def wait_forever_in_getitem() -> None:
    threading.Event().wait()  # a read that never returns (what a deadlocked worker looks like to its rank)


class StuckOnRankOne(Dataset):
    """16 samples; on rank 1, reading any sample after the first batch never returns."""

    def __init__(self) -> None:
        self.rank = int(os.environ["RANK"])

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rank == 1 and index >= 4:
            wait_forever_in_getitem()
        return torch.full((2,), float(index))


def _train_with_a_stuck_worker() -> dict[str, Any]:
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(worker_timeout=LIMIT_S))
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    # Forked workers, as a torchrun job on Linux starts them by default (the rank is a forkserver child here).
    loader = accelerator.prepare(DataLoader(StuckOnRankOne(), batch_size=2, num_workers=1,
                                            multiprocessing_context="fork"))
    start = time.monotonic()
    try:
        for batch in loader:
            accelerator.backward(model(batch).sum())  # DDP's all-reduce: rank 0 waits here for rank 1
    except Exception as error:  # noqa: BLE001 - each rank reports what ended it
        return {"error": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}
    return {"error": None, "seconds": time.monotonic() - start}


def test_a_stuck_loader_worker_ends_every_rank_with_its_stack(run_distributed: Any) -> None:
    start = time.monotonic()
    rank0, rank1 = run_distributed(_train_with_a_stuck_worker, 2, daemon=False, timeout=90)
    assert time.monotonic() - start < 60
    assert rank1["error"] == "LoaderWorkerTimeout", rank1
    assert f"within {LIMIT_S:g} s" in rank1["message"]
    assert "DataLoaderConfiguration(worker_timeout=...)" in rank1["message"]  # names the setting to change
    assert "wait_forever_in_getitem" in rank1["message"] and "__getitem__" in rank1["message"]  # the worker's stack
    assert LIMIT_S <= rank1["seconds"] < LIMIT_S + 15
    # Rank 0 was in DDP's all-reduce: it ends as soon as rank 1 has left the group, not at gloo's 30-minute limit.
    assert rank0["error"] is not None and rank0["seconds"] < LIMIT_S + 30, rank0
