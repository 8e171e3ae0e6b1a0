"""fp8 (torchao) with FSDP2 and DDP on 2 real gloo processes: float8 all-gather, scales precomputed after each
step, losses as Accelerate + torchao recorded them (tests/distributed/fp8_expected.py), exact resume.

One 2-process run does all of it (each part builds a new Accelerator on the same process group).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from engine.imports import is_torchao_available
from tests.distributed.fp8_expected import EXPECTED
from tests.kernel_path import FP8_PINNED, cpu_runs_fp8_training

pytestmark = pytest.mark.skipif(not is_torchao_available(), reason='needs torchao: pip install "ember-train[fp8]"')
STEPS, LR, BATCH = 12, 1e-2, 16


def _mlp() -> nn.Module:
    torch.manual_seed(0)  # the recorder's MLP (tests/parity_scripts/record_fp8.py)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 16))


def _accelerator(**kwargs: Any) -> Any:
    from engine import Accelerator
    from engine.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()  # keep the process group, build a new Accelerator per part
    GradientState._reset_state()
    return Accelerator(mixed_precision="fp8", **kwargs)


def _train(acc: Any, steps: range, state: str | None = None, save: str | None = None) -> tuple[list[float], Any]:
    """Each rank trains on its half of every batch (AdamW built before prepare)."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    model, opt = acc.prepare(model, opt)
    if state is not None:
        acc.load_state(state)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH, 32, generator=g)
    y = torch.sin(x[..., :16] * 2) + 0.1 * x[..., 16:]
    half = slice(acc.process_index * BATCH // 2, (acc.process_index + 1) * BATCH // 2)
    losses = []
    for i in steps:
        loss = nn.functional.mse_loss(model(x[i, half]).float(), y[i, half])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    if save is not None:
        acc.save_state(save)
    return losses, model


def _fp8_as_recorded() -> dict[str, Any]:
    """As recorded: torchao's conversion and fully_shard, no autocast, fp32 parameters; the first run of its
    processes, as in the recorder (after another fp8 run in the same process a loss came out 1 ulp apart)."""
    from engine import AutocastKwargs
    from engine.backends.fsdp import FullyShardedDataParallelPlugin

    torch.set_num_threads(1)
    acc = _accelerator(kwargs_handlers=[AutocastKwargs(enabled=False)],
                       fsdp_plugin=FullyShardedDataParallelPlugin(mixed_precision_policy="no"))
    raw, model = _train(acc, range(STEPS))
    return {"raw": raw,
            "local_types": {n: type(p._local_tensor).__name__ for n, p in model.named_parameters()},
            "precomputed": [getattr(p._local_tensor, "_precomputed_scale", None) is not None
                            for n, p in model.named_parameters() if n.endswith("2.weight")]}


def _fp8_everywhere(folder: str) -> dict[str, Any]:
    from engine.backends.fsdp import FullyShardedDataParallelPlugin

    torch.set_num_threads(1)
    result: dict[str, Any] = {}
    acc = _accelerator()  # first: once a state with an FSDP plugin was built, the process stays FSDP
    result["ddp"], model = _train(acc, range(STEPS))
    result["ddp_type"] = type(model).__name__
    # Ember's default: a bf16 autocast and bf16 FSDP parameters around the float8 products; then a resume.
    result["fsdp"], _ = _train(_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()), range(STEPS))
    _train(_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()), range(6), save=folder)
    result["fsdp_resumed"], _ = _train(_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()), range(6, STEPS),
                                       state=folder)
    return result


@pytest.mark.skipif(not cpu_runs_fp8_training(),
                    reason="torch's CPU fp8 training kernels need AVX512-FP16, which this CPU lacks")
@pytest.mark.recorded_bits
def test_fp8_with_fsdp2_and_ddp_on_2_processes(run_distributed: Any, tmp_path: Any) -> None:
    # oneDNN capped at the fp8 kernels' level, as the recording (tests/kernel_path.py: FP8_PINNED).
    raw = run_distributed(_fp8_as_recorded, 2, timeout=300, env=FP8_PINNED)
    recorded = EXPECTED["fsdp2_fp8_all_gather_2_processes"]
    assert [rank["raw"] for rank in raw] == recorded["losses_per_rank"]  # bitwise, each rank
    assert raw[0]["local_types"] == recorded["local_tensor_types"]  # the float8 all-gather wrapper is in place
    assert raw[0]["precomputed"] == [True]  # the optimizer's step hook precomputed the float8 scales
    ranks = run_distributed(_fp8_everywhere, 2, str(tmp_path / "ckpt"), timeout=300, env=FP8_PINNED)
    fp32 = EXPECTED["training"]["fp32"]  # one process, the whole batch
    mean = [sum(pair) / 2 for pair in zip(ranks[0]["fsdp"], ranks[1]["fsdp"])]
    # Half batches: each rank scales its own inputs. Measured 6.2e-3 from fp32 over the 12 steps.
    assert max(abs(a - b) / b for a, b in zip(mean, fp32)) < 2e-2
    for rank in ranks:
        assert rank["fsdp_resumed"] == rank["fsdp"][6:]  # exact resume from float8 shards
        assert rank["ddp_type"] == "DistributedDataParallel"
        # DDP (fp32 parameters under the autocast) and FSDP2 (bf16 parameters, fp32 gradient reduction) compute
        # the same products: bitwise equal here.
        assert rank["ddp"] == rank["fsdp"]
