"""GPU-only paths: bf16 on CUDA, FSDP2 on CUDA (nccl), DDP vs FSDP2 and fail-fast on 2 GPUs.

Every test here skips cleanly without CUDA (and the 2-process ones without 2 GPUs); run them on a GPU host
with ``pytest tests/gpu``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (one per nccl rank)")


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 1))


def _batch(step: int, world_size: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(16, 32, generator=generator)
    y = x[:, :4].sum(dim=1, keepdim=True)
    per = 16 // world_size
    return x[rank * per:(rank + 1) * per].to(device), y[rank * per:(rank + 1) * per].to(device)


def test_bf16_autocast_trains_on_cuda() -> None:
    from engine import Accelerator

    acc = Accelerator(mixed_precision="bf16")
    assert acc.device.type == "cuda"
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    losses = []
    for _ in range(20):
        x, y = _batch(0, 1, 0, acc.device)
        loss = F.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert seen[0] == torch.bfloat16  # computed in bf16 ...
    assert model(x).dtype == torch.float32  # ... returned in fp32
    assert losses[-1] < losses[0] / 2


def _fsdp2_on_cuda_one_rank(folder: str) -> dict[str, Any]:
    import torch.distributed as dist

    from engine.backends.fsdp import FullyShardedDataParallelPlugin, apply_fsdp2, full_state_dict
    from engine.backends.fsdp_checkpoint import load_sharded_model, save_sharded

    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    model = apply_fsdp2(_net(), FullyShardedDataParallelPlugin(min_num_params=1000), "bf16", device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen: list[torch.dtype] = []
    model[2].register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    for _ in range(5):
        x, y = _batch(0, 1, 0, device)
        F.mse_loss(model(x).float(), y).backward()
        opt.step()
        opt.zero_grad()
    save_sharded(folder, [model], [opt])
    fresh = apply_fsdp2(_net(seed=1), FullyShardedDataParallelPlugin(), "no", device)
    load_sharded_model(folder, 0, fresh)
    trained, loaded = full_state_dict(model), full_state_dict(fresh)
    return {"device": str(next(model.parameters()).device), "compute": str(seen[0]),
            "same": all(torch.equal(trained[k], loaded[k]) for k in trained)}


def test_fsdp2_on_cuda_with_nccl_and_bf16(run_distributed: Any, tmp_path: Path) -> None:
    result = run_distributed(_fsdp2_on_cuda_one_rank, 1, str(tmp_path / "shards"))[0]
    assert result["device"].startswith("cuda") and result["compute"] == "torch.bfloat16" and result["same"]


def _train_two_gpus(use_fsdp: bool) -> list[float]:
    from engine import Accelerator
    from engine.backends.fsdp import FullyShardedDataParallelPlugin

    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(min_num_params=1000) if use_fsdp else None)
    assert acc.state.backend == "nccl"
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    losses = []
    for step in range(5):
        x, y = _batch(step, acc.num_processes, acc.process_index, acc.device)
        loss = F.mse_loss(model(x), y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(acc.reduce(loss.detach(), "mean").item())
    return losses


@two_gpus
def test_nccl_fsdp2_matches_ddp(run_distributed: Any) -> None:
    fsdp = run_distributed(_train_two_gpus, 2, True)[0]
    ddp = run_distributed(_train_two_gpus, 2, False)[0]
    torch.testing.assert_close(fsdp, ddp, rtol=1e-4, atol=1e-5)  # TF32 / reduction order differ slightly


@two_gpus
def test_nccl_rank_failure_ends_every_rank(tmp_path: Path) -> None:
    # NCCL does not notice a dead peer: only the launcher's teardown can end the rank waiting in all_reduce.
    (tmp_path / "fail.py").write_text(textwrap.dedent('''
        import torch
        from engine import Accelerator
        acc = Accelerator()
        for step in range(1, 1000):
            if acc.process_index == 1 and step == 5:
                raise ValueError("boom at step 5 on rank 1")
            acc.reduce(torch.ones(1, device=acc.device))
    '''))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["EMBER_CONFIG_FILE"] = str(tmp_path / "none.yaml")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "engine.launch.cli", "launch", "--nproc-per-node", "2", "fail.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and time.monotonic() - start < 30
    assert (done.stdout + done.stderr).count("ValueError: boom at step 5 on rank 1") == 1
