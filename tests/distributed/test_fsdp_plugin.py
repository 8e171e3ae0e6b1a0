"""FullyShardedDataParallelPlugin: validation, unit selection, precision, and the less common prepare paths."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from engine.backends.fsdp import FullyShardedDataParallelPlugin
from engine.backends.fsdp_checkpoint import read_sharded_model, save_sharded
from engine.checkpoint.io import UnsafeCheckpointError
from tests.distributed.test_fsdp import _batch, _net


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"state_dict_type": "LOCAL_STATE_DICT"}, "state_dict_type='LOCAL_STATE_DICT'"),
    ({"min_num_params": 0}, "min_num_params=...) must be a positive int, got 0"),
    ({"min_num_params": 10, "transformer_cls_names_to_wrap": ["Block"]}, "choose one way"),
    ({"transformer_cls_names_to_wrap": [3]}, "list of class names"),
    ({"reshard_after_forward": "yes"}, "reshard_after_forward=...) must be a bool or a positive int, got 'yes'"),
    ({"mixed_precision_policy": "fp8"}, "mixed_precision_policy='fp8'"),
    ({"mixed_precision_policy": {"param_dtype": "int3"}}, "param_dtype='int3'"),
    ({"mixed_precision_policy": {"compute": "bf16"}}, r"unknown keys \['compute'\]"),
])
def test_bad_plugin_values_fail_naming_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FullyShardedDataParallelPlugin(**kwargs)
    with pytest.raises(TypeError, match=r"cpu_offload=...\) must be a bool, got 1"):
        FullyShardedDataParallelPlugin(cpu_offload=1)
    with pytest.raises(NotImplementedError, match="fsdp_version=1"):
        FullyShardedDataParallelPlugin(fsdp_version=1)


def test_units_are_chosen_by_class_name_or_size_innermost_first() -> None:
    model = _net()  # Linear(6,16) 112 params, Block 272 each, Linear(16,1) 17
    by_name = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap="Block").units(model)
    assert by_name == [model[2], model[1]]
    by_size = FullyShardedDataParallelPlugin(min_num_params=100).units(model)
    assert by_size == [model[0], model[1].linear, model[2].linear]  # the blocks' params are already covered
    assert FullyShardedDataParallelPlugin().units(model) == []  # only the root
    with pytest.raises(ValueError, match=r"no submodule of class \['Decoder'\].*'Block'"):
        FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Decoder"]).units(model)


def test_mixed_precision_policy_follows_the_accelerator_unless_given() -> None:
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.resolve_mixed_precision("no") is None
    bf16 = plugin.resolve_mixed_precision("bf16")
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert plugin.resolve_mixed_precision("fp16").param_dtype == torch.float16
    given = FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": "bf16"})
    assert given.resolve_mixed_precision("fp16").param_dtype == torch.bfloat16
    assert FullyShardedDataParallelPlugin(mixed_precision_policy="no").resolve_mixed_precision("bf16") is None


def test_sharded_checkpoint_metadata_is_never_unpickled_blindly(tmp_path: Path) -> None:
    model = _net()
    save_sharded(str(tmp_path), [model], [])
    folder = tmp_path / "pytorch_model_fsdp_0"
    restored = read_sharded_model(str(folder))  # a sharded folder becomes one full state dict
    assert all(torch.equal(restored[k], v) for k, v in model.state_dict().items())

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    (folder / ".metadata").write_bytes(pickle.dumps(Exploit()))
    with pytest.raises(UnsafeCheckpointError, match="refers to posix.system"):
        read_sharded_model(str(folder))
    assert not (tmp_path / "pwned").exists()


# -- on 2 processes ------------------------------------------------------------------------------------------
def _less_common_paths(tmp: str) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from engine import Accelerator

    # ACCELERATE_USE_FSDP (what `ember launch --use-fsdp` sets) gives a default plugin; bf16 gives FSDP2 a
    # bf16 compute policy; the optimizer is prepared in a later call than the model.
    acc = Accelerator(mixed_precision="bf16")
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model = acc.prepare(model)
    opt = acc.prepare(opt)
    seen: list[torch.dtype] = []
    model[3].register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    before = model[3].weight.full_tensor().clone()
    x, y = _batch(0, acc.num_processes, acc.process_index)
    acc.backward(F.mse_loss(model(x).float(), y))
    opt.step()
    out: dict[str, Any] = {"type": str(acc.distributed_type), "compute_dtype": str(seen[0]),
                           "param_dtype": str(model[3].weight.dtype),
                           "moved": not torch.equal(before, model[3].weight.full_tensor()),
                           "grad_is_dtensor": isinstance(model[3].weight.grad, DTensor)}
    # Mid-accumulation, FSDP2's gradients live in buffers no checkpoint can hold: saving must refuse.
    acc.gradient_accumulation_steps = 2
    with acc.accumulate(model):
        acc.backward(F.mse_loss(model(x).float(), y))
    try:
        acc.save_state(os.path.join(tmp, "mid"))
        out["mid_accumulation"] = "saved"
    except ValueError as err:
        out["mid_accumulation"] = str(err)
    # An optimizer that already stepped before prepare holds unsharded state: refused with the fix.
    stepped_model = torch.nn.Linear(4, 4)
    stepped = torch.optim.Adam(stepped_model.parameters())
    stepped_model(torch.ones(1, 4)).sum().backward()
    stepped.step()
    try:
        acc.prepare(stepped_model, stepped)
        out["stepped"] = "prepared"
    except ValueError as err:
        out["stepped"] = str(err)
    return out


def test_env_plugin_bf16_policy_and_late_optimizer(run_distributed: Any, tmp_path: Path) -> None:
    result = run_distributed(_less_common_paths, 2, str(tmp_path), env={"ACCELERATE_USE_FSDP": "true"})[0]
    assert result["type"] == "DistributedType.FSDP"
    assert result["compute_dtype"] == "torch.bfloat16" and result["param_dtype"] == "torch.float32"
    assert result["moved"] and result["grad_is_dtensor"]  # the late-prepared optimizer updates the shards
    assert "middle of gradient accumulation under FSDP2" in result["mid_accumulation"]
    assert "already holds state" in result["stepped"]


def _cpu_offload_trains() -> list[float]:
    from engine import Accelerator

    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(min_num_params=100, cpu_offload=True,
                                                                 reshard_after_forward=False))
    net = _net()
    opt = acc.prepare(torch.optim.SGD(net.parameters(), lr=0.02))  # prepared before its model is sharded
    model = acc.prepare(net)
    losses = []
    for step in range(3):
        x, y = _batch(0, acc.num_processes, acc.process_index)
        loss = F.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(acc.reduce(loss.detach(), "mean").item())
    return losses


def test_cpu_offload_and_size_based_units_train(run_distributed: Any) -> None:
    losses = run_distributed(_cpu_offload_trains, 2)[0]
    assert losses[2] < losses[1] < losses[0]  # the same batch each step: the loss goes down
