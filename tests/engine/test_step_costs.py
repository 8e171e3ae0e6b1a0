"""Per-step costs the engine leaves out: torch's profiler ranges around ``zero_grad`` and ``DataLoader.__next__``,
which cost more than the work they wrap on a small model, are skipped only when no profiler records and the
result is the same (benchmarks/trainer_overhead.py shows the figures)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from engine import Accelerator
from engine.prepare.optimizer import clear_grads, zeroes_plainly


@contextmanager
def counted_ranges() -> Iterator[list[str]]:
    """Every ``torch.autograd.profiler.record_function`` opened inside the block (torch looks it up per call)."""
    names: list[str] = []
    real = torch.autograd.profiler.record_function

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
            names.append(name)
            super().__init__(name, *args, **kwargs)

    torch.autograd.profiler.record_function = Counting  # type: ignore[misc]
    try:
        yield names
    finally:
        torch.autograd.profiler.record_function = real  # type: ignore[misc]


def _stepped(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 3)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    optimizer.step()


def test_the_prepared_optimizer_zeroes_without_torchs_profiler_range(accelerator: Accelerator) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    _stepped(model, optimizer)
    with counted_ranges() as ranges:
        optimizer.zero_grad()
    assert ranges == []  # torch's Optimizer.zero_grad would have opened "Optimizer.zero_grad#SGD.zero_grad"
    assert all(p.grad is None for p in model.parameters())


def test_zeroing_calls_torch_while_a_profiler_records() -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _stepped(model, optimizer)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        clear_grads(optimizer, plain=zeroes_plainly(optimizer))
    assert "Optimizer.zero_grad#SGD.zero_grad" in {event.name for event in prof.events()}
    assert all(p.grad is None for p in model.parameters())


def test_an_optimizer_with_its_own_zero_grad_is_called() -> None:
    class KeepsZeros(torch.optim.SGD):
        calls = 0

        def zero_grad(self, set_to_none: bool = True) -> None:
            KeepsZeros.calls += 1
            super().zero_grad(set_to_none=False)

    model = torch.nn.Linear(3, 2)
    optimizer = KeepsZeros(model.parameters(), lr=0.1)
    assert not zeroes_plainly(optimizer)
    _stepped(model, optimizer)
    clear_grads(optimizer, plain=zeroes_plainly(optimizer))
    assert KeepsZeros.calls == 1
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())

    patched = torch.optim.SGD(model.parameters(), lr=0.1)
    patched.zero_grad = lambda set_to_none=True: None  # type: ignore[method-assign]
    assert not zeroes_plainly(patched)


@pytest.fixture
def accelerator() -> Iterator[Accelerator]:
    from engine import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_a_prepared_loader_reads_batches_without_a_range_each(accelerator: Accelerator) -> None:
    data = TensorDataset(torch.arange(40.0).reshape(20, 2))
    plain = [batch[0] for batch in DataLoader(data, batch_size=4, shuffle=False)]
    loader = accelerator.prepare(DataLoader(data, batch_size=4, shuffle=False))
    with counted_ranges() as ranges:
        read = [batch[0] for batch in loader]
    assert [b.tolist() for b in read] == [b.tolist() for b in plain]
    # The first batch goes through DataLoader.__next__ (it may reset the iterator); the other four do not.
    assert len([name for name in ranges if "DataLoader" in name]) == 1
    assert loader.end_of_dataloader


def test_a_prepared_loader_keeps_its_ranges_while_a_profiler_records(accelerator: Accelerator) -> None:
    data = TensorDataset(torch.arange(40.0).reshape(20, 2))
    loader = accelerator.prepare(DataLoader(data, batch_size=4, shuffle=False))
    counts = []
    for source in (DataLoader(data, batch_size=4, shuffle=False), loader):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            assert len(list(source)) == 5
        counts.append(len([event for event in prof.events() if event.name.startswith("enumerate(DataLoader)")]))
    assert counts[1] == counts[0] == 6  # as a plain DataLoader: five batches and the call that ends the pass
