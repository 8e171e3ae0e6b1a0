"""Record Accelerate 1.15's activation checkpointing for FSDP2 and write
tests/distributed/activation_checkpointing_expected.py.

    /work/venvs/bigmodel/bin/python tests/parity_scripts/record_activation_checkpointing.py

``FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True)`` is applied in
``Accelerator._prepare_fsdp2`` by ``accelerate.utils.fsdp_utils.fsdp2_apply_ac(accelerator, model)``, after
``plugin.set_auto_wrap_policy(model)``. On CPU, Accelerate never reaches that code (several CPU processes are
``MULTI_CPU``, which drops the FSDP plugin and wraps the model in DDP; recorded below), so the wrapping is observed by
calling those two functions of Accelerate's, in that order, with an object that has only ``.state.fsdp_plugin``
(all ``fsdp2_apply_ac`` reads). Recorded per wrap policy: which submodules become ``CheckpointWrapper`` (names and
classes), the wrapper's settings, the parameter and state-dict names afterwards, whether forward/backward run and
give the same gradients as without, and the bytes saved for backward with and without. Then 2 gloo processes:
Accelerate's wrapping + torch's ``fully_shard`` (as Accelerate's FSDP2 path does), against the same without AC.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import gc
import json
import os
import pprint
import re
import socket
import subprocess
import sys
import tempfile
import types
import warnings
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "distributed", "activation_checkpointing_expected.py")

CASES: dict[str, dict[str, Any]] = {
    "default_no_wrap": {},
    "transformer_based_wrap_names": {"auto_wrap_policy": "transformer_based_wrap",
                                     "transformer_cls_names_to_wrap": ["Block"]},
    "transformer_based_wrap_no_split_modules": {"auto_wrap_policy": "transformer_based_wrap",
                                                "_no_split_modules": ["Block"]},
    "transformer_based_wrap_no_names": {"auto_wrap_policy": "transformer_based_wrap"},
    "transformer_based_wrap_unknown_class": {"auto_wrap_policy": "transformer_based_wrap",
                                             "transformer_cls_names_to_wrap": ["Missing"]},
    "size_based_wrap_5000": {"auto_wrap_policy": "size_based_wrap", "min_num_params": 5000},
    "size_based_wrap_1000": {"auto_wrap_policy": "size_based_wrap", "min_num_params": 1000},
    "offload": {"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": ["Block"],
                "activation_checkpointing_offload": True},
}
PLUGIN_ERRORS = {
    "offload_without_ac": {"fsdp_version": 2, "activation_checkpointing_offload": True},
    "offload_fsdp1": {"fsdp_version": 1, "activation_checkpointing": True, "activation_checkpointing_offload": True},
}


def net(no_split: list[str] | None = None) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.fc1 = nn.Linear(32, 128)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(128, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc2(self.act(self.fc1(self.norm(x))))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(16, 32)
            self.blocks = nn.ModuleList(Block() for _ in range(3))
            self.head = nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            for block in self.blocks:
                h = block(h)
            return self.head(h)

    torch.manual_seed(0)
    model = Net()
    if no_split is not None:
        model._no_split_modules = no_split
    return model


def batch() -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(3)
    return torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g)


def saved_bytes(model: Any) -> tuple[int, dict[str, list[float]]]:
    """Bytes of the tensors autograd saves for backward in one forward, and the gradients of one backward."""
    import torch

    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    x, y = batch()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    # Keyed by the unwrapped names, so runs with and without wrappers compare parameter by parameter.
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.flatten().tolist()
             for n, p in model.named_parameters()}
    return total, grads


def apply_ac(case: dict[str, Any]) -> tuple[Any, Any]:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac

    case = dict(case)
    model = net(case.pop("_no_split_modules", None))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True, **case)
    plugin.set_auto_wrap_policy(model)  # what Accelerator._prepare_fsdp2 does first
    stub = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin))
    return fsdp2_apply_ac(stub, model), plugin


def describe_wrapped(model: Any) -> dict[str, Any]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    wrappers = {name: type(m).__name__ for name, m in model.named_modules()
                if "Wrapper" in type(m).__name__}
    settings = {}
    for name, m in model.named_modules():
        if isinstance(m, CheckpointWrapper):
            settings[name] = {"checkpoint_impl": str(m.checkpoint_impl),
                              "checkpoint_fn": getattr(m.checkpoint_fn, "func", m.checkpoint_fn).__qualname__,
                              "checkpoint_fn_kwargs": {k: repr(v) for k, v in
                                                       getattr(m.checkpoint_fn, "keywords", {}).items()},
                              "inner": type(m._checkpoint_wrapped_module).__name__}
    return {"wrappers": wrappers, "settings": settings,
            "parameter_names_sample": [n for n, _ in model.named_parameters()][:6],
            "state_dict_keys_sample": list(model.state_dict())[:6]}


def record_cases() -> dict[str, Any]:
    reference_bytes, reference_grads = saved_bytes(net())
    found: dict[str, Any] = {"no_ac_saved_bytes": reference_bytes}
    for name, case in CASES.items():
        try:
            model, plugin = apply_ac(case)
        except Exception as e:  # noqa: BLE001 - recorded
            found[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        # Without the " at 0x..." addresses, so a rerun writes the same file.
        policy = re.sub(r" at 0x[0-9a-f]+", "", repr(plugin.auto_wrap_policy))
        entry = {"auto_wrap_policy": policy[:160], **describe_wrapped(model)}
        try:
            nbytes, grads = saved_bytes(model)
            diffs = [abs(a - b) for k in reference_grads for a, b in zip(reference_grads[k], grads[k])]
            entry.update({"saved_bytes": nbytes, "grads_max_abs_diff_vs_no_ac": max(diffs)})
        except Exception as e:  # noqa: BLE001 - recorded
            entry["forward_backward_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        found[name] = entry
    for name, kwargs in PLUGIN_ERRORS.items():
        from accelerate.utils import FullyShardedDataParallelPlugin

        try:
            FullyShardedDataParallelPlugin(**kwargs)
            found[name] = "OK"
        except Exception as e:  # noqa: BLE001 - recorded
            found[name] = f"{type(e).__name__}: {e}"
    return found


def worker(out: str) -> None:
    """2 ranks: (a) Accelerator(cpu=True, fsdp_plugin=FSDP2 + AC) — what Accelerate does on CPU; (b) Accelerate's
    AC wrapping then torch's fully_shard on the root, against the same without AC."""
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from accelerate.utils.other import get_module_children_bottom_up
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    result: dict[str, Any] = {}
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True,
                                            auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["Block"])
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    model = net()
    prepared, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    result["accelerator_cpu"] = {"distributed_type": str(acc.distributed_type), "is_fsdp2": acc.is_fsdp2,
                                 "model_type": type(prepared).__name__,
                                 "checkpoint_wrappers": sum("CheckpointWrapper" == type(m).__name__
                                                            for m in prepared.modules())}
    x, y = batch()
    losses = {}
    for label in ("fsdp2_no_ac", "fsdp2_ac"):
        if label == "fsdp2_ac":
            model, policy_plugin = apply_ac(CASES["transformer_based_wrap_names"])
        else:
            model = net()
            policy_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                           transformer_cls_names_to_wrap=["Block"])
            policy_plugin.set_auto_wrap_policy(model)
        # Sharded as fsdp2_prepare_model does: bottom-up, each module the policy picks (it looks through the
        # CheckpointWrapper), then the root.
        policy = fsdp2_prepare_auto_wrap_policy(policy_plugin, model)
        for module in get_module_children_bottom_up(model)[:-1]:
            if policy(module) and not isinstance(module, FSDPModule):
                fully_shard(module)
        fully_shard(model)
        result[label + "_fsdp_modules"] = [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run = []
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(model(x[rank * 32:(rank + 1) * 32]), y[rank * 32:(rank + 1) * 32])
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.append(float(loss.detach()))
        losses[label] = run
        result[label + "_state_dict_keys_sample"] = list(model.state_dict())[:4]
    result["losses"] = losses
    result["losses_equal"] = losses["fsdp2_no_ac"] == losses["fsdp2_ac"]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    # The DDP wrapper must go before the process group, or its reducer aborts the interpreter at exit.
    del prepared, acc
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def multi_process() -> Any:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        out = os.path.join(workdir, "out.json")
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                               "--master-addr=127.0.0.1", f"--master-port={port}", __file__, "--worker", out],
                              check=False, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            return {"error": proc.stderr[-3000:]}
        with open(out) as f:
            return json.load(f)


def main() -> None:
    import accelerate
    import torch

    found = {"versions": {"accelerate": accelerate.__version__, "torch": torch.__version__},
             "cases": record_cases(), "two_processes": multi_process()}
    with open(OUT, "w") as f:
        f.write(f'"""Observed from accelerate {accelerate.__version__} (torch {torch.__version__}, CPU) by '
                'tests/parity_scripts/record_activation_checkpointing.py under the pinned CPU kernel path of tests/kernel_path.py; do not edit."""\n\n')
        f.write(f"EXPECTED = {pprint.pformat(found, width=116, sort_dicts=False)}\n")
    print("wrote", OUT)


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
