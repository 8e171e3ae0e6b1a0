"""Differential run for issue 17: the same cases against Accelerate and against Ember's engine.

    /work/refvenv/bin/python tests/parity_scripts/issue17_differential.py accelerate
    PYTHONPATH=$PWD .venv/bin/python tests/parity_scripts/issue17_differential.py engine

Each case runs on 2 CPU processes started by the package's own ``debug_launcher`` and prints one JSON line per
case (rank 0's observations). The values asserted in tests/distributed/test_issue17_parity.py were recorded from
the ``accelerate`` run (accelerate 1.15.0, torch 2.13.0, CPU, gloo).
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import importlib
import json
import os
import sys

import torch

PKG = sys.argv[1] if len(sys.argv) > 1 else "accelerate"
pkg = importlib.import_module(PKG)
utils = importlib.import_module(f"{PKG}.utils")
state_module = importlib.import_module(f"{PKG}.state")


class MockModel(torch.nn.Module):
    def __init__(self, shape: tuple[int, int]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.p = torch.nn.Parameter(torch.randn(*shape))

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        return self.p * (x ** (1 + rank))


def grads(model: torch.nn.Module, rank: int, steps: int, shape: tuple[int, int]) -> torch.Tensor:
    for step in range(steps):
        torch.manual_seed(2024 + step)
        model.zero_grad()
        model(torch.randn(*shape), rank).mean().backward()
    return next(model.parameters()).grad.detach().clone()


CASES = [
    ("no", "no", {}), ("fp16", "no", {}), ("bf16", "no", {}),
    ("power_sgd", "no", {}), ("power_sgd", "fp16", {}), ("power_sgd", "bf16", {}),
    ("power_sgd", "no", {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2}),
    ("power_sgd", "no", {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}),
    ("batched_power_sgd", "no", {}), ("batched_power_sgd", "fp16", {}),
    ("batched_power_sgd", "no", {"matrix_approximation_rank": 3, "start_powerSGD_iter": 2}),
    ("batched_power_sgd", "fp16", {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}),
]


def comm_hooks() -> None:
    from torch.nn.parallel import DistributedDataParallel

    results = []
    for hook, wrapper, option in CASES:
        state_module.AcceleratorState._reset_state()
        kwargs = pkg.DistributedDataParallelKwargs(comm_hook=utils.DDPCommunicationHookType(hook),
                                                   comm_wrapper=utils.DDPCommunicationHookType(wrapper),
                                                   comm_state_option=dict(option))
        accelerator = pkg.Accelerator(cpu=True, kwargs_handlers=[kwargs])
        shape = (30, 30)
        steps = 3 if option.get("start_powerSGD_iter") else 1
        rank = accelerator.process_index
        try:
            prepared = accelerator.prepare(MockModel(shape))
        except Exception as err:  # noqa: BLE001 - recording what is raised
            results.append({"hook": hook, "wrapper": wrapper, "option": option,
                            "error": [type(err).__name__, str(err)]})
            continue
        try:
            hooked = grads(prepared, rank, steps, shape)
        except Exception as err:  # noqa: BLE001 - recording what is raised
            results.append({"hook": hook, "wrapper": wrapper, "option": option,
                            "error": [type(err).__name__, str(err)]})
            continue
        reference = grads(DistributedDataParallel(MockModel(shape)), rank, steps, shape)
        local = grads(MockModel(shape), rank, steps, shape)
        everyone = [None, None]
        torch.distributed.all_gather_object(everyone, local)
        expected = None
        if hook in ("fp16", "bf16") or wrapper in ("fp16",) and hook == "no":
            dtype = torch.float16 if "fp16" in (hook, wrapper) else torch.bfloat16
            expected = float(((everyone[0].to(dtype) / 2) + (everyone[1].to(dtype) / 2)).float().sub(hooked).abs().max())
        results.append({"hook": hook, "wrapper": wrapper, "option": option,
                        "type": type(prepared).__name__, "err_vs_emulation": expected,
                        "max_abs_err": float((hooked - reference).abs().max()),
                        "rank": int(torch.linalg.matrix_rank(hooked)),
                        "sum": float(hooked.double().sum()),
                        "equal_across_ranks": bool(torch.equal(*[t for t in _gather(hooked)]))})
    if rank == 0:
        print("COMM_HOOKS " + json.dumps(results), flush=True)


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    out = [None, None]
    torch.distributed.all_gather_object(out, t)
    return out


def debug_mode() -> None:
    state = pkg.PartialState(cpu=True)
    rank = state.process_index
    observed: dict[str, object] = {"debug_default": state.debug}
    state.debug = True
    observed["debug_after_set"] = pkg.PartialState(cpu=True).debug
    first = {"tensor": torch.tensor([[0.0, 1, 2, 3, 4]])}
    other = {"tensor": torch.tensor([[[0.0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]])}
    data = first if rank == 0 else other
    for name in ("gather", "reduce", "broadcast", "pad_across_processes"):
        try:
            getattr(utils, name)(data)
            observed[name] = None
        except Exception as err:  # noqa: BLE001 - recording what is raised
            cause = err.__cause__
            observed[name] = {"type": type(err).__name__, "message": str(err),
                              "cause": None if cause is None else [type(cause).__name__, str(cause)]}
    # The same shapes pass.
    observed["same_shapes_gather"] = utils.gather(torch.ones(2) * rank).tolist()
    # Different sizes along the padded dim only: allowed in debug mode.
    observed["pad_ok"] = utils.pad_across_processes(torch.ones(rank + 1, 2), dim=0).shape[0]
    state.debug = False
    everyone = [None, None]
    torch.distributed.all_gather_object(everyone, observed)
    if rank == 0:
        print("DEBUG_MODE " + json.dumps(everyone, default=str), flush=True)


def launcher_env() -> None:
    state = pkg.PartialState(cpu=True)
    seen = {"num_processes": state.num_processes, "process_index": state.process_index,
            "local_process_index": state.local_process_index, "distributed_type": str(state.distributed_type),
            "FORK_LAUNCHED": os.environ.get("FORK_LAUNCHED"), "ACCELERATE_USE_CPU": os.environ.get("ACCELERATE_USE_CPU"),
            "LOCAL_RANK": os.environ.get("LOCAL_RANK"), "RANK": os.environ.get("RANK")}
    everyone = [None, None]
    torch.distributed.all_gather_object(everyone, seen)
    if state.process_index == 0:
        print("DEBUG_LAUNCHER " + json.dumps(everyone), flush=True)


def save_different_folders() -> None:
    import tempfile

    accelerator = pkg.Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 1))
    folder = tempfile.mkdtemp(prefix=f"rank{accelerator.process_index}_")
    try:
        accelerator.save_state(os.path.join(folder, "ckpt"))
        accelerator.load_state(os.path.join(folder, "ckpt"))
        seen = {"ok": True, "files": sorted(os.listdir(os.path.join(folder, "ckpt")))}
    except Exception as err:  # noqa: BLE001 - recording what is raised
        seen = {"ok": False, "type": type(err).__name__, "message": str(err)}
    everyone = [None, None]
    torch.distributed.all_gather_object(everyone, seen)
    if accelerator.process_index == 0:
        print("SAVE_DIFFERENT_FOLDERS " + json.dumps(everyone), flush=True)


def notebook_function(tag: str) -> str:
    state = pkg.PartialState(cpu=True)
    acc = pkg.Accelerator(cpu=True)
    print("NOTEBOOK_CHILD " + json.dumps({
        "tag": tag, "process_index": state.process_index, "local_process_index": state.local_process_index,
        "num_processes": state.num_processes, "distributed_type": str(state.distributed_type),
        "mixed_precision": acc.mixed_precision, "FORK_LAUNCHED": os.environ.get("FORK_LAUNCHED"),
        "MIXED_PRECISION": os.environ.get("MIXED_PRECISION"),
        "ACCELERATE_MIXED_PRECISION": os.environ.get("ACCELERATE_MIXED_PRECISION")}), flush=True)
    return f"{tag}-{state.process_index}"


def reset_state() -> None:
    acc = pkg.Accelerator(cpu=True)
    state_module.AcceleratorState._reset_state()
    out = {}
    for expr, get in (("acc.state.mixed_precision", lambda: acc.state.mixed_precision),
                      ("AcceleratorState().mixed_precision", lambda: state_module.AcceleratorState().mixed_precision)):
        try:
            out[expr] = repr(get())
        except Exception as err:  # noqa: BLE001
            out[expr] = [type(err).__name__, str(err)]
    state_module.AcceleratorState._reset_state(True)
    try:
        out["acc.state.num_processes (partial reset)"] = repr(acc.state.num_processes)
    except Exception as err:  # noqa: BLE001
        out["acc.state.num_processes (partial reset)"] = [type(err).__name__, str(err)]
    print("RESET_STATE " + json.dumps(out), flush=True)


def free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _child(fn, rank: int, port: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"})
    fn()
    torch.distributed.destroy_process_group()


def torchrun_like(fn) -> None:
    """Two forked ranks with torchrun's variables (what `accelerate launch --multi_gpu` would give them)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, rank, port)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)


def utils_answers() -> None:
    names = sorted(n for n in dir(utils) if n.startswith("is_") and n.endswith("_available"))
    answers = {}
    for name in names:
        try:
            answers[name] = getattr(utils, name)()
        except Exception as err:  # noqa: BLE001 - recording what is raised
            answers[name] = f"{type(err).__name__}: {err}"
    print("UTILS " + json.dumps(answers, default=str), flush=True)


def main() -> None:
    utils_answers()

    reset_state()
    state_module.AcceleratorState._reset_state(True)
    pkg.debug_launcher(launcher_env, num_processes=2)
    torchrun_like(launcher_env)
    torchrun_like(debug_mode)
    torchrun_like(comm_hooks)
    torchrun_like(save_different_folders)
    port = free_port()
    returned = pkg.notebook_launcher(notebook_function, ("nb",), num_processes=2, use_port=port,
                                     mixed_precision="bf16")
    print("NOTEBOOK_RETURNED " + json.dumps(returned, default=str), flush=True)


if __name__ == "__main__":
    main()
