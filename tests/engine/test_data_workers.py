"""The limit on waiting for a loader worker (engine/data/workers.py) in one process: settings and the user's own
DataLoader timeout. The 2-process case (every rank ends) is tests/distributed/test_loader_workers.py."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from engine import DataLoaderConfiguration
from engine.data.loader import prepare_data_loader
from engine.data.workers import DEFAULT_WORKER_TIMEOUT_S, LoaderWorkerTimeout, WorkerStacks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


class StuckInWorkerOne(Dataset):
    """Worker 0 reads batch 0 and answers; worker 1 reads batch 1 and never does (DataLoader's round robin)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in (2, 3):
            worker_one_is_stuck()
        return torch.tensor([float(index)])


def worker_one_is_stuck() -> None:
    threading.Event().wait()


def _stack_folders() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("ember-loader-stacks-")}


def test_forked_workers_write_their_stacks_to_inherited_files_and_leave_nothing_on_disk(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a folder of its own: other workers' tests make theirs
    before = _stack_folders()
    loader = prepare_data_loader(DataLoader(StuckInWorkerOne(), batch_size=2, num_workers=2,
                                            multiprocessing_context="fork"),
                                 num_processes=1, process_index=0, worker_timeout=1.0)
    _, _, message = _first_batches(loader)
    assert _stack_folders() == before  # a SIGKILLed run cannot leave a folder behind: there is none
    # Each worker's stack is under its own pid: worker 1 (the second pid) is the one in worker_one_is_stuck.
    sections = message.split("--- loader worker pid ")[1:]
    assert len(sections) == 2
    assert "in worker_one_is_stuck" not in sections[0] and "in worker_one_is_stuck" in sections[1]


def test_a_worker_started_without_fork_writes_its_stacks_into_a_folder_removed_with_the_loader(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a folder of its own: other workers' tests make theirs
    # spawn / forkserver workers inherit no open file: each opens {pid}.stack in the loader's folder. A plain
    # subprocess stands in for such a worker (a spawned DataLoader worker takes longer to start than a test waits).
    before = _stack_folders()
    stacks = WorkerStacks()
    target = stacks.start_pass(persistent=False, num_workers=1, forked=False)
    assert target.directory is not None and not target.descriptors
    code = ("import sys, threading; from engine.data.workers import StackTarget, register_stack_dump\n"
            # 'ready' from inside the frame the stack must show: the parent may dump as soon as it reads it.
            "def waiting_for_ever(): print('ready', flush=True); threading.Event().wait()\n"
            "keep = register_stack_dump(StackTarget(directory=sys.argv[1]), 0)\n"
            "waiting_for_ever()\n")
    worker = subprocess.Popen([sys.executable, "-c", code, target.directory], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        dumped = stacks.collect([(0, worker.pid)])
    finally:
        worker.kill()
        worker.wait()
    assert "in waiting_for_ever" in dumped[worker.pid]
    assert len(_stack_folders() - before) == 1
    del stacks
    gc.collect()
    assert _stack_folders() == before


class NeverUnpickles(Dataset):
    """A dataset a spawned worker never finishes unpickling: the worker never reaches its worker_init_fn."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])

    def __setstate__(self, state: dict[str, object]) -> None:
        never_returns()


def test_a_worker_stuck_before_its_init_ends_the_pass_with_the_timeout_error_not_a_crash_report(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Asking it for its stacks ends it (no handler yet): torch's SIGCHLD check must not turn that into "killed by
    # signal" in place of the error that says what happened (benchmarks/fork_hang.py met exactly this).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its stack folder stays out of the others' count
    loader = prepare_data_loader(DataLoader(NeverUnpickles(), batch_size=2, num_workers=1,
                                            multiprocessing_context="spawn"),
                                 num_processes=1, process_index=0, worker_timeout=1.0)
    _, seconds, message = _first_batches(loader)
    assert seconds < 30
    assert "(no stack: the worker had not started its worker_init_fn, or is gone)" in message
