"""The limit on waiting for a loader worker (engine/data/workers.py) in one process: settings and the user's own
DataLoader timeout. The 2-process case (every rank ends) is tests/distributed/test_loader_workers.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from engine import DataLoaderConfiguration
from engine.data.loader import prepare_data_loader
from engine.data.workers import DEFAULT_WORKER_TIMEOUT_S, LoaderWorkerTimeout


def never_returns() -> None:
    threading.Event().wait()


class StuckAfterFirstBatch(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= 2:
            never_returns()
        return torch.tensor([float(index)])


@pytest.mark.parametrize("value", [0, -1.0, "60", True])
def test_worker_timeout_must_be_positive_seconds_or_none(value: object) -> None:
    with pytest.raises(ValueError, match=rf"worker_timeout=\.\.\.\) must be a number of seconds > 0.*"
                                         rf"got worker_timeout={value!r}"):
        DataLoaderConfiguration(worker_timeout=value)  # type: ignore[arg-type]


def test_the_default_limit_is_ten_minutes_and_none_means_no_limit() -> None:
    assert DataLoaderConfiguration().worker_timeout == DEFAULT_WORKER_TIMEOUT_S == 600.0
    assert DataLoaderConfiguration(worker_timeout=None).worker_timeout is None


def _first_batches(loader: DataLoader) -> tuple[list[float], float, str]:
    seen: list[float] = []
    start = time.monotonic()
    with pytest.raises(LoaderWorkerTimeout) as raised:
        for batch in loader:
            seen.extend(batch.flatten().tolist())
    return seen, time.monotonic() - start, str(raised.value)


def test_the_users_own_dataloader_timeout_wins_and_the_error_carries_the_worker_stack() -> None:
    # The user's 1.5 s applies, not the configured 600 s: without the limit this test would never end.
    loader = prepare_data_loader(DataLoader(StuckAfterFirstBatch(), batch_size=2, num_workers=1, timeout=1.5,
                                            multiprocessing_context="fork"),
                                 num_processes=1, process_index=0, worker_timeout=600.0)
    assert loader.timeout == 1.5  # the user's setting is left as it was
    seen, seconds, message = _first_batches(loader)
    assert seen == []  # the look-ahead read of batch 1 is what waited
    assert 1.5 <= seconds < 10
    assert "within 1.5 s" in message and "the DataLoader's own timeout=... (set by you)" in message
    assert "in never_returns" in message and "in __getitem__" in message


def test_the_configured_limit_applies_when_the_dataloader_sets_none() -> None:
    loader = prepare_data_loader(DataLoader(StuckAfterFirstBatch(), batch_size=2, num_workers=1,
                                            multiprocessing_context="fork"),
                                 num_processes=1, process_index=0, worker_timeout=1.0)
    assert loader.timeout == 0
    _, seconds, message = _first_batches(loader)
    assert 1.0 <= seconds < 10
    assert "DataLoaderConfiguration(worker_timeout=...)" in message and "in never_returns" in message
