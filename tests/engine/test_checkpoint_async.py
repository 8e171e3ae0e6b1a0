"""save_state(async_save=True) in one process: the checkpoint holds the state at the call although training goes
on, exact resume, one save in flight, failures raised at the next save naming the checkpoint, pruning only after
the commit, reused snapshot buffers (DESIGN.md promise 9)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import Accelerator, ProjectConfiguration
from engine.checkpoint import io as checkpoint_io
from engine.checkpoint import save as checkpoint_save
from engine.checkpoint.folders import committed_checkpoints
from engine.checkpoint.io import CheckpointError
from tests.engine.test_checkpoint import Run, assert_same_run

WRITER = "ember-checkpoint-writer"


@pytest.fixture
def held_writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The background writer waits for this event before writing anything (training runs meanwhile)."""
    release = threading.Event()
    real = checkpoint_save.write_state

    def held(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith(WRITER):
            assert release.wait(60), "the test never released the writer"
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_save, "write_state", held)
    yield release
    release.set()


def _state(run: Run) -> dict[str, Any]:
    return {"params": [p.detach().clone() for p in run.model.parameters()],
            "optimizer": {k: {n: t.clone() for n, t in v.items()} for k, v in run.optimizer.state_dict()["state"].items()},
            "batches": run.batches.n, "step": run.acc.step}


def test_the_checkpoint_holds_the_state_at_the_call_while_training_changes_it(tmp_path: Path,
                                                                              held_writer: threading.Event) -> None:
    run = Run(str(tmp_path))
    run.train(stop_at=6)
    expected = _state(run)
    folder = run.acc.save_state(async_save=True)
    assert not os.path.exists(folder)  # not visible before the commit
    run.train(stop_at=12)  # weights, optimizer state, counters and RNG all move on while the write waits
    assert not all(torch.equal(a, b) for a, b in zip(expected["params"], _state(run)["params"]))
    held_writer.set()
    assert run.acc.wait_for_checkpoint() == folder == str(tmp_path / "checkpoints" / "checkpoint_0")

    fresh = Run(str(tmp_path))
    fresh.acc.load_state()
    got = _state(fresh)
    assert all(torch.equal(a, b) for a, b in zip(expected["params"], got["params"]))
    assert expected["optimizer"].keys() == got["optimizer"].keys()
    for index, values in expected["optimizer"].items():
        assert all(torch.equal(values[n], got["optimizer"][index][n]) for n in values)
    assert (got["batches"], got["step"]) == (expected["batches"], expected["step"])


@pytest.mark.parametrize("stop_at", [7, 13])  # mid-accumulation, in epoch 0 and in epoch 1
def test_resume_from_an_async_checkpoint_is_bitwise_exact(tmp_path: Path, stop_at: int) -> None:
    reference = Run()
    reference.train()
    expected = reference.snapshot()

    interrupted = Run(str(tmp_path), total_limit=2)

    def save() -> None:  # every batch up to stop_at: each save waits for the one before
        if interrupted.batches.n <= stop_at:
            interrupted.acc.save_state(async_save=True)

    interrupted.train(stop_at=stop_at + 3, after_batch=save)  # trains on past the last save, then "dies"
    interrupted.acc.wait_for_checkpoint()
    assert [n for n, _ in committed_checkpoints(str(tmp_path / "checkpoints"))] == [stop_at - 2, stop_at - 1]

    resumed = Run(str(tmp_path))
    resumed.acc.load_state()
    assert resumed.batches.n == stop_at
    resumed.train()
    assert_same_run(expected, resumed.snapshot())


def test_one_save_in_flight_and_pruning_only_after_the_commit(tmp_path: Path, held_writer: threading.Event) -> None:
    run = Run(str(tmp_path), total_limit=1)
    run.train(stop_at=2)
    first = run.acc.save_state()  # synchronous
    run.train(stop_at=4)
    second = run.acc.save_state(async_save=True)
    run.train(stop_at=6)
    # In flight: the previous checkpoint is still the newest committed one and is not pruned.
    assert [path for _, path in committed_checkpoints(str(tmp_path / "checkpoints"))] == [first]
    waiter = threading.Thread(target=run.acc.save_state)  # the next save waits for the one in flight
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()
    held_writer.set()
    waiter.join(60)
    third = str(tmp_path / "checkpoints" / "checkpoint_2")
    assert second == str(tmp_path / "checkpoints" / "checkpoint_1")
    assert [path for _, path in committed_checkpoints(str(tmp_path / "checkpoints"))] == [third]


def _fail_writes_in_the_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk, for the writer thread only: its file objects fail on the first large write."""
    real = checkpoint_io._write_all

    def full(fd: int, view: memoryview) -> None:
        if threading.current_thread().name.startswith(WRITER):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, view)

    monkeypatch.setattr(checkpoint_io, "_write_all", full)


def test_a_failed_background_write_is_raised_at_the_next_save_naming_the_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(str(tmp_path))
    run.train(stop_at=2)
    good = run.acc.save_state(async_save=True)
    run.acc.wait_for_checkpoint()
    _fail_writes_in_the_writer(monkeypatch)
    bad = run.acc.save_state(async_save=True)  # returns: the failure happens later, in the background
    run.train(stop_at=4)
    with pytest.raises(CheckpointError, match=f"asynchronous save of checkpoint {bad} failed.*No space left"):
        run.acc.save_state()
    base = tmp_path / "checkpoints"
    assert [path for _, path in committed_checkpoints(str(base))] == [good]  # nothing of the failed one is visible
    assert sorted(os.listdir(base)) == ["checkpoint_0"]
    assert run.acc.wait_for_checkpoint() is None  # raised once, not again
    monkeypatch.undo()
    assert run.acc.save_state(async_save=True) == str(base / "checkpoint_2")  # the run can go on saving
    run.acc.end_training()
    assert [n for n, _ in committed_checkpoints(str(base))] == [0, 2]


def test_end_training_waits_and_raises_a_failed_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(str(tmp_path))
    run.train(stop_at=2)
    _fail_writes_in_the_writer(monkeypatch)
    bad = run.acc.save_state(async_save=True)
    with pytest.raises(CheckpointError, match=f"checkpoint {bad} failed"):
        run.acc.end_training()
    assert not os.path.exists(bad) and os.listdir(tmp_path / "checkpoints") == []


def test_snapshot_buffers_are_allocated_once_reused_and_reported(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path),
                                                                   automatic_checkpoint_naming=True, total_limit=1))
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = acc.prepare(model, optimizer)
    model(torch.ones(2, 256)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    assert acc.checkpoint_snapshot_bytes == 0
    acc.save_state(async_save=True)
    buffers = acc._checkpointer.async_checkpointer.buffers  # type: ignore[union-attr]
    pointers = {path: b.data_ptr() for path, b in buffers._buffers.items()}
    state_bytes = 3 * sum(p.numel() * 4 for p in model.parameters())  # weights, exp_avg, exp_avg_sq
    assert state_bytes <= acc.checkpoint_snapshot_bytes < state_bytes + 64 * 1024
    for _ in range(2):
        with torch.no_grad():
            model.weight.add_(1)
        acc.save_state(async_save=True)
        assert {path: b.data_ptr() for path, b in buffers._buffers.items()} == pointers
    acc.wait_for_checkpoint()
    loaded = Accelerator(cpu=True)
    twin = loaded.prepare(torch.nn.Linear(256, 256))
    loaded.load_state(str(tmp_path / "checkpoints" / "checkpoint_2"), strict=False)
    assert torch.equal(twin.weight, model.weight)


def test_async_save_argument_is_checked(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    acc.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="async_save='yes'"):
        acc.save_state(str(tmp_path / "c"), async_save="yes")  # type: ignore[arg-type]


def test_snapshots_copy_every_dtype_and_layout_and_keep_ties_and_metadata() -> None:
    from collections import OrderedDict

    from engine.checkpoint.snapshot import SnapshotBuffers

    shared = torch.randn(3, 4)
    state: Any = OrderedDict(
        bf16=torch.randn(5).to(torch.bfloat16), flags=torch.tensor([True, False]), scalar=torch.tensor(7),
        empty=torch.empty(0, 3), strided=torch.randn(4, 6)[:, ::2], tied_a=shared, tied_b=shared,
        nested={"xs": [torch.arange(3), (torch.ones(2), 1.5)], "name": "adamw"})
    state._metadata = {"": {"version": 1}}
    expected = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    buffers = SnapshotBuffers()
    buffers.begin()
    snap = buffers.copy(state, ("model",))
    buffers.end()
    for value in (state["bf16"], state["strided"], shared):
        value.add_(1)  # training changes the live state afterwards
    for name in ("bf16", "flags", "scalar", "empty", "strided", "tied_a"):
        assert torch.equal(snap[name], expected[name]) and snap[name].dtype == expected[name].dtype, name
    assert snap["tied_a"] is snap["tied_b"]  # still one tensor: written once, as a tie
    assert torch.equal(snap["nested"]["xs"][0], torch.arange(3)) and snap["nested"]["xs"][1][1] == 1.5
    assert type(snap) is OrderedDict and snap._metadata == {"": {"version": 1}}


def test_a_large_snapshot_is_copied_by_two_threads_and_exactly() -> None:
    from engine.checkpoint import snapshot as checkpoint_snapshot
    from engine.checkpoint.snapshot import SnapshotBuffers

    copiers: set[str] = set()
    real = checkpoint_snapshot._copy_all

    def recording(pieces: Any) -> None:
        if pieces:
            copiers.add(threading.current_thread().name)
        real(pieces)

    state = {"a": torch.randn(3_000_000), "b": torch.randn(2_500_000).to(torch.float64), "c": torch.arange(5)}
    expected = {k: v.clone() for k, v in state.items()}
    buffers = SnapshotBuffers()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint_snapshot, "_copy_all", recording)
        buffers.begin()
        snap = buffers.copy(state, ("model",))
        buffers.end()
    for value in state.values():
        value.add_(1)
    assert all(torch.equal(snap[k], expected[k]) for k in state)
    assert len(copiers) == 2 and any(name.startswith("ember-snapshot") for name in copiers), copiers


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
def test_the_background_writer_runs_only_on_idle_cpu_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, int] = {}
    real = checkpoint_save.write_state

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen[threading.current_thread().name] = os.sched_getscheduler(0)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_save, "write_state", recording)
    acc = Accelerator(cpu=True)
    acc.prepare(torch.nn.Linear(2, 2))
    acc.save_state(str(tmp_path / "a"), async_save=True)
    acc.wait_for_checkpoint()
    acc.save_state(str(tmp_path / "b"))
    assert seen == {WRITER: os.SCHED_IDLE, threading.current_thread().name: os.sched_getscheduler(0)}
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the training thread keeps its priority
