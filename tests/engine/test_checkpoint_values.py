"""``Accelerator.state_values`` / ``load_state_values``: what ``save_state`` writes, as values that survive
``torch.save`` / ``torch.load(weights_only=True)``, restored exactly; refused where the backend writes shards."""

from __future__ import annotations

import io

import torch
from torch.utils.data import DataLoader, TensorDataset

from engine import Accelerator


def _setup() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer, DataLoader]:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def test_values_round_trip_through_torch_load_defaults_and_restore_exactly() -> None:
    accelerator, model, optimizer, loader = _setup()
    batches = iter(loader)
    x, y = next(batches)
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))  # pending gradients
    values = accelerator.state_values(include_gradients=True)
    assert values is not None and values["world_size"] == 1 and len(values["ranks"]) == 1
    buffer = io.BytesIO()
    torch.save(values, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only=True: only tensors and plain containers
    expected_next, expected_draw = next(batches)[0], torch.rand(3)
    weights, grads = model.weight.detach().clone(), model.weight.grad.clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    model.weight.grad = None
    accelerator.load_state_values(loaded, "values")
    assert torch.equal(model.weight, weights) and torch.equal(model.weight.grad, grads)
    assert torch.equal(next(iter(loader))[0], expected_next)  # the loader's exact position
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG states
    assert accelerator.state_values(include_gradients=False)["ranks"][0]["gradients"] == {}
