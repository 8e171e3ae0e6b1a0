"""Gradient accumulation trace vectors (ENGINE.md 4) on 1 and 2 real processes, and the GA=3 equivalence oracle."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


def _trace(ga: int, epochs: int = 1, split_batches: bool = False, sync_with_dataloader: bool = True,
           step_with_optimizer: bool = True) -> dict[str, Any]:
    """Linear(1,1), SGD lr 0.1, LambdaLR 1/(1+e), 20 samples, batch size 2 (ENGINE.md 4 'Trace vectors')."""
    from engine import Accelerator, DataLoaderConfiguration, GradientAccumulationPlugin

    plugin = GradientAccumulationPlugin(num_steps=ga, sync_with_dataloader=sync_with_dataloader)
    acc = Accelerator(gradient_accumulation_plugin=plugin, step_scheduler_with_optimizer=step_with_optimizer,
                      dataloader_config=DataLoaderConfiguration(split_batches=split_batches))
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1 / (1 + e))
    x = torch.arange(20, dtype=torch.float32).unsqueeze(1) / 20
    data = DataLoader(TensorDataset(x, 2 * x), batch_size=2)
    model, opt, data, sched = acc.prepare(model, opt, data, sched)
    syncs: list[bool] = []
    steps = 0
    for _ in range(epochs):
        for xb, yb in data:
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                acc.backward(loss)
                syncs.append(acc.sync_gradients)
                before = acc.unwrap_model(model).weight.detach().clone()
                opt.step()
                sched.step()
                opt.zero_grad()
                steps += int(not torch.equal(before, acc.unwrap_model(model).weight))
    return {"syncs": syncs, "opt_steps": steps, "last_epoch": sched.scheduler.last_epoch, "acc_step": acc.step,
            "weight": acc.unwrap_model(model).weight.item()}


T, F = True, False


@pytest.mark.parametrize("ga, epochs, sync_dl, syncs, opt_steps, last_epoch, acc_step", [
    (1, 1, True, [T] * 10, 10, 10, 0),
    (2, 1, True, [F, T] * 5, 5, 5, 0),
    (3, 1, True, [F, F, T, F, F, T, F, F, T, T], 4, 4, 0),
    (3, 2, False, [(i + 1) % 3 == 0 for i in range(20)], 6, 6, 20),
])
def test_single_process_traces(ga: int, epochs: int, sync_dl: bool, syncs: list[bool], opt_steps: int,
                               last_epoch: int, acc_step: int) -> None:
    out = _trace(ga, epochs, sync_with_dataloader=sync_dl)
    assert out["syncs"] == syncs
    assert (out["opt_steps"], out["last_epoch"], out["acc_step"]) == (opt_steps, last_epoch, acc_step)


def _two_process_traces(_: int) -> dict[str, Any]:
    from engine import AcceleratorState, GradientState

    results = {}
    for name, kwargs in (("ga1", {"ga": 1}), ("ga2", {"ga": 2}), ("ga3_split", {"ga": 3, "split_batches": True}),
                         ("no_sched_with_opt", {"ga": 2, "step_with_optimizer": False})):
        results[name] = _trace(**kwargs)
        AcceleratorState._reset_state()  # keep the process group, rebuild the Accelerator state
        GradientState._reset_state()
    return results


def test_two_process_traces_and_equivalence(run_distributed) -> None:
    r0, r1 = run_distributed(_two_process_traces, 2, 0)
    assert r0["ga1"]["syncs"] == [T] * 5 and (r0["ga1"]["opt_steps"], r0["ga1"]["last_epoch"]) == (5, 10)
    assert r0["ga2"]["syncs"] == [F, T, F, T, T] and (r0["ga2"]["opt_steps"], r0["ga2"]["last_epoch"]) == (3, 6)
    split = r0["ga3_split"]
    assert split["syncs"] == [F, F, T, F, F, T, F, F, T, T] and (split["opt_steps"], split["last_epoch"]) == (4, 4)
    assert r0["no_sched_with_opt"]["last_epoch"] == 5  # one scheduler step per call, no multiplication
    # The oracle: GA=3 with split batches on 2 ranks gives the same weights as GA=3 on 1 rank.
    single = _trace(3)
    assert split["weight"] == r1["ga3_split"]["weight"]
    assert split["weight"] == single["weight"]  # bitwise, as Accelerate
