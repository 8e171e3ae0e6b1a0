"""Two-process behaviour that must match Hugging Face Accelerate 1.15 (values observed under torchrun, gloo).

The expected values were produced by the same user code with ``from accelerate import ...`` and
``Accelerator(cpu=True)``; the tests do not import ``accelerate``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from engine import Accelerator, AcceleratorState, GradientState


def _fresh() -> Accelerator:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(cpu=True)


def _stream(shuffle: bool) -> dict[str, Any]:
    accelerator = _fresh()
    torch.manual_seed(3)
    loader = accelerator.prepare(DataLoader(list(range(10)), batch_size=2, shuffle=shuffle))
    out: dict[str, Any] = {"after_prepare": round(torch.rand(1).item(), 6)}
    out["epochs"] = [[[b.tolist(), round(torch.rand(1).item(), 6)] for b in loader] for _ in range(2)]
    out["after"] = round(torch.rand(1).item(), 6)
    return out


def _split(inputs: Any) -> Any:
    try:
        with _fresh().split_between_processes(inputs) as share:
            return share
    except TypeError:
        return "TypeError"


def _parity() -> dict[str, Any]:
    accelerator = _fresh()
    rank = accelerator.process_index
    return {"device": str(accelerator.device), "repr": repr(accelerator.state).splitlines()[4],
            "seq": _stream(shuffle=False), "shuffle": _stream(shuffle=True),
            "split": [_split("abcde"), _split(range(5)), _split({"a": "abc"}), _split(5)],
            "reduce_scale": _fresh().reduce(torch.tensor([1.0 + rank]), "sum", scale=2.0).tolist()}


def test_two_processes_match_accelerate(run_distributed: Any) -> None:
    r0, r1 = run_distributed(_parity, 2)
    assert r0["device"] == r1["device"] == "cpu:0" and r0["repr"] == "Device: cpu:0"
    # One global draw per epoch (DataLoader's iterator seed); shuffling adds one at prepare (the shared seed).
    draws = {"seq": ([0.026955, 0.471614, 0.060116], [0.594421, 0.887857, 0.451031], 0.004264, 0.799491),
             "shuffle": ([0.060116, 0.771866, 0.743699], [0.451031, 0.799491, 0.149841], 0.285842, 0.401469)}
    batches = {("seq", 0): ([[0, 1], [4, 5], [8, 9]], [[0, 1], [4, 5], [8, 9]]),
               ("seq", 1): ([[2, 3], [6, 7], [0, 1]], [[2, 3], [6, 7], [0, 1]]),
               ("shuffle", 0): ([[7, 0], [6, 4], [2, 8]], [[8, 2], [9, 6], [1, 0]]),
               ("shuffle", 1): ([[9, 1], [5, 3], [7, 0]], [[5, 4], [3, 7], [8, 2]])}
    for case, (epoch0, epoch1, after_prepare, after) in draws.items():
        for rank, got in enumerate((r0[case], r1[case])):
            epochs = [[list(step) for step in zip(batches[case, rank][0], epoch0)],
                      [list(step) for step in zip(batches[case, rank][1], epoch1)]]
            assert got == {"after_prepare": after_prepare, "epochs": epochs, "after": after}, (case, rank)
    # Only lists, tuples, tensors and dicts are split; other sized inputs go whole to every process.
    assert r0["split"] == r1["split"] == ["abcde", range(5), {"a": "abc"}, "TypeError"]
    assert r0["reduce_scale"] == r1["reduce_scale"] == [3.0]  # scale applies on XLA only
