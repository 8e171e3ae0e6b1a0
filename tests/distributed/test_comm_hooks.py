"""DDP communication hooks (``DistributedDataParallelKwargs(comm_hook, comm_wrapper, comm_state_option)``) judged
by the gradients they produce on 2 gloo processes.

The expected figures were recorded from Accelerate 1.15.0 (torch 2.13.0, CPU, gloo) with
``tests/parity_scripts/issue17_differential.py accelerate``: same model (a 30x30 parameter, seed 0), same inputs
(seeds 2024, 2025, ...), rank 0's gradient after the last step. ``max_abs_err`` is measured against a plain
``DistributedDataParallel`` run of the same steps.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

SHAPE = (30, 30)

# (comm_hook, comm_wrapper, comm_state_option) -> what Accelerate 1.15 produced (rank 0).
RECORDED: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("no", "no", {}, {"max_abs_err": 0.0, "rank": 30, "sum": 0.5411012821009589}),
    ("fp16", "no", {}, {"max_abs_err": 2.4954788386821747e-06, "rank": 30, "sum": 0.5410940647125244}),
    ("power_sgd", "no", {}, {"max_abs_err": 0.0, "rank": 30, "sum": 0.5411012821009589}),  # vanilla phase
    ("power_sgd", "fp16", {}, {"max_abs_err": 2.4954788386821747e-06, "rank": 30, "sum": 0.5410940647125244}),
    ("power_sgd", "no", {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2},
     {"max_abs_err": 0.0056261708959937096, "rank": 2, "sum": 0.3320939702250598}),
    ("power_sgd", "no", {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
     {"max_abs_err": 0.0050204116851091385, "rank": 1, "sum": 0.39619824599549247}),
    ("batched_power_sgd", "no", {}, {"max_abs_err": 0.0, "rank": 30, "sum": 0.5411012821009589}),
    ("batched_power_sgd", "fp16", {}, {"max_abs_err": 2.4954788386821747e-06, "rank": 30, "sum": 0.5410940647125244}),
]
# Accelerate 1.15 on gloo: torch refuses the bf16 hook and wrapper when they are registered (at `prepare`).
BF16_ON_GLOO = "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ or XPU and XCCL"


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.p = torch.nn.Parameter(torch.randn(*SHAPE))

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        return self.p * (x ** (1 + rank))  # a different gradient on each rank


def _grads(model: torch.nn.Module, rank: int, steps: int) -> torch.Tensor:
    for step in range(steps):
        torch.manual_seed(2024 + step)
        model.zero_grad()
        model(torch.randn(*SHAPE), rank).mean().backward()
    return next(model.parameters()).grad.detach().clone()


def _run_hooks() -> list[dict[str, Any]]:
    from torch.nn.parallel import DistributedDataParallel

    from engine import Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs
    from engine.state import AcceleratorState

    out: list[dict[str, Any]] = []
    cases = [(h, w, o) for h, w, o, _ in RECORDED] + [("bf16", "no", {}), ("power_sgd", "bf16", {})]
    for hook, wrapper, option in cases:
        AcceleratorState._reset_state()  # keep the process group, build a new Accelerator per case
        kwargs = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType(hook), comm_wrapper=wrapper,
                                               comm_state_option=dict(option))
        accelerator = Accelerator(cpu=True, kwargs_handlers=[kwargs])
        rank = accelerator.process_index
        try:
            model = accelerator.prepare(_Model())
        except TypeError as err:
            out.append({"hook": hook, "wrapper": wrapper, "error": str(err)})
            continue
        steps = 3 if option.get("start_powerSGD_iter") else 1
        hooked = _grads(model, rank, steps)
        reference = _grads(DistributedDataParallel(_Model()), rank, steps)
        local = [torch.empty(0)] * 2
        torch.distributed.all_gather_object(local, _grads(_Model(), rank, steps))
        # What the fp16 hook must give: each rank's gradient cast to fp16, divided by 2, summed in fp16.
        emulated = ((local[0].half() / 2) + (local[1].half() / 2)).float()
        both = [torch.empty(0)] * 2
        torch.distributed.all_gather_object(both, hooked)
        out.append({"hook": hook, "wrapper": wrapper, "option": option,
                    "max_abs_err": float((hooked - reference).abs().max()),
                    "rank": int(torch.linalg.matrix_rank(hooked)), "sum": float(hooked.double().sum()),
                    "fp16_emulation_err": float((hooked - emulated).abs().max()),
                    "same_on_both_ranks": bool(torch.equal(both[0], both[1]))})
    return out


def test_comm_hooks_give_accelerates_gradients_on_two_processes(run_distributed: Any) -> None:
    rank0, rank1 = run_distributed(_run_hooks, 2)
    for got in (rank0, rank1):
        assert all(case["same_on_both_ranks"] for case in got if "error" not in case)
    by_case = {(c["hook"], c["wrapper"], str(c.get("option"))): c for c in rank0}
    for hook, wrapper, option, expected in RECORDED:
        got = by_case[(hook, wrapper, str(option))]
        assert got["rank"] == expected["rank"], (hook, wrapper, option)
        assert got["max_abs_err"] == pytest.approx(expected["max_abs_err"], rel=1e-5, abs=1e-12), (hook, wrapper)
        assert got["sum"] == pytest.approx(expected["sum"], rel=1e-6), (hook, wrapper, option)
    # fp16 compression: exactly the fp16 emulation, lossy (not the fp32 average) but within fp16 rounding.
    fp16 = by_case[("fp16", "no", "{}")]
    assert fp16["fp16_emulation_err"] == 0.0
    assert 0.0 < fp16["max_abs_err"] < 2 ** -10 * 0.1
    # The fp16 wrapper around PowerSGD (vanilla phase) compresses too; without it the result is exact.
    assert by_case[("power_sgd", "fp16", "{}")]["fp16_emulation_err"] == 0.0
    assert by_case[("power_sgd", "no", "{}")]["max_abs_err"] == 0.0
    # bf16 needs NCCL: torch's own error reaches the caller, as with Accelerate.
    errors = {(c["hook"], c["wrapper"]): c["error"] for c in rank0 if "error" in c}
    assert errors == {("bf16", "no"): BF16_ON_GLOO, ("power_sgd", "bf16"): BF16_ON_GLOO}
