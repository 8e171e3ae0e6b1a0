"""Activation checkpointing on 2 real gloo processes, one run: gradients equal with and without it under DDP and
tensor parallelism (``apply_activation_checkpointing``), and under FSDP2 through
``FullyShardedDataParallelPlugin(activation_checkpointing=True)`` the losses Accelerate 1.15's wrapping gave
(tests/distributed/activation_checkpointing_expected.py), bitwise.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

from tests.distributed.activation_checkpointing_expected import EXPECTED
from tests.engine.test_activation_checkpointing import Block, batch, net


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n.replace("_checkpoint_wrapped_module.", ""): (p.grad.to_local() if hasattr(p.grad, "to_local")
                                                           else p.grad).clone() for n, p in model.named_parameters()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _ddp_grads(checkpointed: bool, rank: int) -> dict[str, torch.Tensor]:
    from engine import Accelerator
    from engine.utils import apply_activation_checkpointing

    model = net(dropout=0.5)  # dropout: the recomputation must draw the same masks
    if checkpointed:
        apply_activation_checkpointing(model, [Block])
    acc = Accelerator()
    model = acc.prepare(model)
    x, y = batch()
    torch.manual_seed(7)
    acc.backward(nn.functional.mse_loss(model(x[rank * 32:(rank + 1) * 32]), y[rank * 32:(rank + 1) * 32]))
    return _grads(model)


def _tp_grads(checkpointed: bool) -> dict[str, torch.Tensor]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from engine.utils import apply_activation_checkpointing

    model = net()
    mesh = init_device_mesh("cpu", (2,))
    for block in model.blocks:  # each block's MLP split across the 2 ranks; both ranks see the whole batch
        parallelize_module(block, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    if checkpointed:  # after the plan, as in TrainModule.configure_model
        apply_activation_checkpointing(model, "Block")
    x, y = batch()
    nn.functional.mse_loss(model(x), y).backward()
    return _grads(model)


def _fsdp_run(checkpointed: bool, rank: int) -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule

    from engine import Accelerator
    from engine.backends.fsdp import FullyShardedDataParallelPlugin
    from engine.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()  # keep the process group, build a new Accelerator
    GradientState._reset_state()
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"],
                                            activation_checkpointing=checkpointed)
    acc = Accelerator(fsdp_plugin=plugin)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # the recorder's loop: 3 steps, half of the batch each
    model, opt = acc.prepare(model, opt)
    x, y = batch()
    losses = []
    for _ in range(3):
        loss = nn.functional.mse_loss(model(x[rank * 32:(rank + 1) * 32]), y[rank * 32:(rank + 1) * 32])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return {"losses": losses, "fsdp_modules": [n for n, m in model.named_modules() if isinstance(m, FSDPModule)],
            "state_dict_keys": list(model.state_dict())[:4], "state": acc.get_state_dict(model)}


def _checkpointed_everywhere() -> dict[str, Any]:
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    ddp = [_ddp_grads(flag, rank) for flag in (False, True)]  # first: an FSDP state would make the process FSDP
    tp = [_tp_grads(flag) for flag in (False, True)]
    fsdp = [_fsdp_run(flag, rank) for flag in (False, True)]
    same_state = all(torch.equal(v, fsdp[1]["state"][k]) for k, v in fsdp[0]["state"].items())
    dist.barrier()
    return {"ddp_equal": _same(*ddp), "tp_equal": _same(*tp), "tp_sharded": tp[0]["blocks.0.fc1.weight"].shape[0],
            "fsdp": [{k: v for k, v in run.items() if k != "state"} for run in fsdp], "fsdp_same_state": same_state}


@pytest.mark.recorded_bits
def test_gradients_equal_with_and_without_checkpointing_on_ddp_tp_and_fsdp2(run_distributed: Any) -> None:
    ranks = run_distributed(_checkpointed_everywhere, 2, timeout=300)
    for rank, (result, recorded) in enumerate(zip(ranks, EXPECTED["two_processes"])):
        assert result["ddp_equal"] and result["tp_equal"], rank  # bitwise
        assert result["tp_sharded"] == 64  # fc1's 128 output rows, half on each rank
        plain, checkpointed = result["fsdp"]
        assert plain["losses"] == checkpointed["losses"] == recorded["losses"]["fsdp2_ac"]  # Accelerate's, bitwise
        assert plain["fsdp_modules"] == recorded["fsdp2_no_ac_fsdp_modules"]
        # One unit per block (the wrapper); Accelerate also shards the block inside it (the policy matches both).
        assert checkpointed["fsdp_modules"] == plain["fsdp_modules"]
        assert "blocks.0._checkpoint_wrapped_module" in recorded["fsdp2_ac_fsdp_modules"]
        assert checkpointed["state_dict_keys"] == recorded["fsdp2_ac_state_dict_keys_sample"]
    assert ranks[0]["fsdp_same_state"]  # the full state, gathered on rank 0
