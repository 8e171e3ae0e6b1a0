"""Asynchronous checkpoints of CUDA tensors: the snapshot goes to pinned host memory with non-blocking copies
queued on the current stream, so kernels queued after the call cannot change what is written. Skips without
CUDA; run on a GPU host with ``pytest tests/gpu``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import Accelerator
from engine.checkpoint.snapshot import SnapshotBuffers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_the_snapshot_is_pinned_and_holds_the_values_at_the_call() -> None:
    live = {"w": torch.full((1024, 1024), 1.0, device="cuda")}
    buffers = SnapshotBuffers()
    buffers.begin()
    snap = buffers.copy(live, ("model",))
    buffers.end()
    live["w"].add_(1)  # queued after the copy on the same stream
    buffers.ready()
    assert snap["w"].is_pinned() and snap["w"].device.type == "cpu"
    assert bool((snap["w"] == 1.0).all())


def test_async_save_of_a_cuda_model_loads_back_exactly(tmp_path: Path) -> None:
    acc = Accelerator()
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = acc.prepare(model, optimizer)
    model(torch.ones(4, 256, device=acc.device)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    expected = model.weight.detach().clone()
    folder = acc.save_state(str(tmp_path / "ckpt"), async_save=True)
    for _ in range(3):  # training goes on while the write is in flight
        model(torch.ones(4, 256, device=acc.device)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert acc.wait_for_checkpoint() == folder
    assert acc.checkpoint_snapshot_bytes >= 3 * 256 * 256 * 4
    acc.load_state(folder)
    assert torch.equal(model.weight, expected)
