"""Engine core on 2 real gloo processes: state, collectives, triggers, process control (ENGINE.md 1, 5, 7)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch


def _core_checks(tmp: str) -> dict[str, Any]:
    from engine import Accelerator, DistributedType, PartialState, broadcast_object_list, reduce
    from engine.operations import gather_object

    acc = Accelerator()  # no cpu=True: a CPU-only multi-process launch must still be MULTI_CPU (our decision)
    r = acc.process_index
    out: dict[str, Any] = {
        "type": acc.distributed_type, "backend": acc.state.backend, "n": acc.num_processes,
        "local": acc.local_process_index, "device": str(acc.device), "use_distributed": acc.use_distributed,
        "main": acc.is_main_process, "last": acc.is_last_process, "repr_first": repr(acc.state).splitlines()[0],
        "backend_object": type(acc.backend).__name__,
    }
    assert acc.distributed_type == DistributedType.MULTI_CPU
    # gather: 0-d becomes 1-d, rank order; non-tensors raise TypeError
    out["gather0d"] = acc.gather(torch.tensor(float(r))).tolist()
    out["gather_nested"] = {k: v.tolist() for k, v in acc.gather({"a": torch.tensor([r, r + 10])}).items()}
    try:
        acc.gather("text")
        out["gather_type_error"] = False
    except TypeError:
        out["gather_type_error"] = True
    out["gather_object"] = gather_object([r, "x"])
    try:
        gather_object(r)
        out["gather_object_int"] = "no error"
    except TypeError:
        out["gather_object_int"] = "TypeError"
    t = torch.tensor([1, 10]) if r == 0 else torch.tensor([2, 20])
    out["reduce"] = {red: acc.reduce(t, red).tolist() for red in ("sum", "max", "none")}
    out["reduce_mean"] = reduce(t.float(), "mean").tolist()
    try:
        acc.reduce(t, "mean")  # integer mean across processes: in-place true division fails
        out["int_mean"] = "no error"
    except RuntimeError:
        out["int_mean"] = "RuntimeError"
    # pad_across_processes: rank r holds 2 x (2 + r)
    x = torch.arange(2 * (2 + r)).reshape(2, 2 + r) + 10
    out["pad"] = acc.pad_across_processes(x, dim=1).tolist()
    out["pad_first"] = acc.pad_across_processes(x, dim=1, pad_index=-1, pad_first=True).tolist()
    out["pad_bad_dim"] = acc.pad_across_processes(x, dim=5).tolist()
    # broadcast
    obj = [f"from {r}", r]
    out["bcast_obj"] = broadcast_object_list(obj, from_process=1)
    bt = torch.tensor([float(r)] * 3)
    out["bcast"] = acc.gather(__import__("engine").broadcast(bt, from_process=1)).tolist()
    # triggers
    first = acc.check_trigger()
    if r == 1:
        acc.set_trigger()
    out["triggers"] = [first, acc.check_trigger(), acc.check_trigger()]
    # process control: the main process goes first
    order = Path(tmp) / "order.txt"
    with acc.main_process_first():
        if r == 1:
            time.sleep(0.05)
        with order.open("a") as f:
            f.write(str(r))
    acc.wait_for_everyone()
    out["order"] = order.read_text()
    local = Path(tmp) / "local.txt"
    with acc.local_main_process_first(), local.open("a") as f:
        f.write(str(r))
    acc.wait_for_everyone()
    out["local_order"] = local.read_text()
    # decorators (call time on the Accelerator, decoration time on PartialState)
    out["decorators"] = [acc.on_main_process(lambda: "main")(), acc.on_last_process(lambda: "last")(),
                         acc.on_process(lambda: "p1", process_index=1)(),
                         acc.on_local_main_process(lambda: "lmain")()]
    out["partial_decorator"] = PartialState().on_main_process(lambda: "pm")()
    # split_between_processes tables
    splits = {}
    for name, data, pad in (("list", ["A", "B", "C"], False), ("list_pad", ["A", "B", "C"], True),
                            ("one_pad", ["A"], True), ("dict", {"a": [1, 2, 3]}, False),
                            ("dict_pad", {"a": [1, 2, 3], "b": [4, 5, 6]}, True)):
        with acc.split_between_processes(data, apply_padding=pad) as part:
            splits[name] = part
    with acc.split_between_processes(torch.arange(5), apply_padding=True) as part:
        splits["tensor_pad"] = part.tolist()
    out["splits"] = splits
    # DDP broadcasts rank 0's parameters: ranks start different, end equal
    torch.manual_seed(100 + r)
    model = acc.prepare(torch.nn.Linear(3, 1))
    out["ddp_type"] = type(model).__name__
    out["ddp_weights"] = acc.unwrap_model(model).weight.detach().tolist()
    acc.print("printed once")
    return out


def test_core_on_two_processes(run_distributed, tmp_path: Path) -> None:
    r0, r1 = run_distributed(_core_checks, 2, str(tmp_path))
    assert (r0["n"], r1["n"]) == (2, 2) and (r0["local"], r1["local"]) == (0, 1)
    assert r0["backend"] == "gloo" and r0["device"] == r1["device"] == "cpu:0" and r0["use_distributed"]
    assert r0["backend_object"] == r1["backend_object"] == "DDP"  # the one object that owns what DDP changes
    assert (r0["main"], r1["main"], r0["last"], r1["last"]) == (True, False, False, True)
    assert r0["repr_first"] == "Distributed environment: DistributedType.MULTI_CPU  Backend: gloo"
    assert r0["gather0d"] == r1["gather0d"] == [0.0, 1.0]
    assert r0["gather_nested"] == {"a": [0, 10, 1, 11]}
    assert r0["gather_type_error"] and r1["gather_type_error"]
    assert r0["gather_object"] == [0, "x", 1, "x"] and r0["gather_object_int"] == "TypeError"
    assert r0["reduce"] == {"sum": [3, 30], "max": [2, 20], "none": [1, 10]}
    assert r1["reduce"]["none"] == [2, 20]  # "none" really returns the input (Accelerate sums)
    assert r0["reduce_mean"] == [1.5, 15.0] and r0["int_mean"] == "RuntimeError"
    assert r0["pad"] == [[10, 11, 0], [12, 13, 0]] and r1["pad"] == [[10, 11, 12], [13, 14, 15]]
    assert r0["pad_first"] == [[-1, 10, 11], [-1, 12, 13]]
    assert r0["pad_bad_dim"] == [[10, 11], [12, 13]]
    assert r0["bcast_obj"] == r1["bcast_obj"] == ["from 1", 1]
    assert r0["bcast"] == [1.0] * 6
    assert r0["triggers"] == r1["triggers"] == [False, True, False]
    assert r0["order"] == "01" and r0["local_order"] == "01"
    assert r0["decorators"] == ["main", None, None, "lmain"] and r1["decorators"] == [None, "last", "p1", None]
    assert r0["partial_decorator"] == "pm" and r1["partial_decorator"] is None
    s0, s1 = r0["splits"], r1["splits"]
    assert (s0["list"], s1["list"]) == (["A", "B"], ["C"])
    assert (s0["list_pad"], s1["list_pad"]) == (["A", "B"], ["C", "C"])
    assert (s0["one_pad"], s1["one_pad"]) == (["A"], ["A"])
    assert (s0["tensor_pad"], s1["tensor_pad"]) == ([0, 1, 2], [3, 4, 4])
    assert (s0["dict"], s1["dict"]) == ({"a": [1, 2]}, {"a": [3]})
    assert (s0["dict_pad"], s1["dict_pad"]) == ({"a": [1, 2], "b": [4, 5]}, {"a": [3, 3], "b": [6, 6]})
    assert r0["ddp_type"] == "DistributedDataParallel"
    assert r0["ddp_weights"] == r1["ddp_weights"]


def _scaler_and_bf16(_: int) -> dict[str, Any]:
    from engine import Accelerator, GradScalerKwargs

    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=4.0)])
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    out = model(torch.randn(4, 2))
    acc.backward(out.sum())
    for p in model.parameters():
        p.grad.fill_(float("inf") if acc.process_index == 1 else 1.0)
    opt.step()
    return {"skipped": opt.step_was_skipped, "scale": acc.scaler.get_scale(), "out_dtype": str(out.dtype)}


def test_fp16_scaler_on_two_processes(run_distributed) -> None:
    r0, r1 = run_distributed(_scaler_and_bf16, 2, 0)
    # inf on one rank only: that rank skips; fp16 outputs come back as fp32
    assert r1["skipped"] and r1["scale"] == 2.0 and r0["out_dtype"] == "torch.float32"
    assert os.environ.get("RANK") is None  # the parent environment was not touched
