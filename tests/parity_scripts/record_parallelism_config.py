"""Record Accelerate 1.15's ParallelismConfig and write tests/distributed/parallelism_config_expected.py.

    /work/venvs/bigmodel/bin/python tests/parity_scripts/record_parallelism_config.py

In this process: the dataclass fields and defaults, the properties (dimension names, sizes, the mesh's names and
shape) for a set of configurations, and every constructor check with its exact message. Then, per configuration,
4 (or 2) real processes on CPU with gloo (started with torch's launcher, as ``accelerate launch`` would): what
``Accelerator(parallelism_config=...)`` does on a CPU machine (it refuses, after building the mesh), the mesh it
built (read back from ``AcceleratorState().device_mesh``, Accelerate's own singleton: nothing is patched), the
flattened dimensions that exist on it, and which ranks Accelerate's ``prepare_data_loader`` hands the same
batches when given that mesh.

TP needs ``transformers`` (``TorchTensorParallelConfig.__post_init__`` checks its version); it is not installed
here, so the TP configurations pass a handler built without ``__post_init__`` (``object.__new__``), which only
skips that version check.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import dataclasses
import json
import os
import pprint
import socket
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "distributed", "parallelism_config_expected.py")
PROPERTIES = ("dp_dim_names", "non_dp_dim_names", "dp_shard_cp_dim_names", "dp_cp_dim_names", "fsdp_dim_names",
              "total_size", "data_parallel_size", "non_data_parallel_size", "active_mesh_dims",
              "dp_replicate_enabled", "dp_shard_enabled", "tp_enabled", "cp_enabled", "sp_enabled")
# name -> (ParallelismConfig kwargs, processes)
CONFIGS: dict[str, tuple[dict[str, int], int]] = {
    "all_ones": ({}, 2),
    "fsdp4": ({"dp_shard_size": 4}, 4),
    "hsdp2x2": ({"dp_replicate_size": 2, "dp_shard_size": 2}, 4),
    "fsdp2_tp2": ({"dp_shard_size": 2, "tp_size": 2}, 4),
    "tp4": ({"tp_size": 4}, 4),
    "tp2": ({"tp_size": 2}, 2),
    "fsdp2_cp2": ({"dp_shard_size": 2, "cp_size": 2}, 4),
    "hsdp2x2_tp2": ({"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2}, 8),
    "size_mismatch": ({"dp_shard_size": 2}, 4),
}
ERROR_CASES: dict[str, str] = {
    "dp_replicate_size_0": "ParallelismConfig(dp_replicate_size=0)",
    "dp_shard_size_0": "ParallelismConfig(dp_shard_size=0)",
    "tp_size_0": "ParallelismConfig(tp_size=0)",
    "cp_size_0": "ParallelismConfig(cp_size=0)",
    "sp_size_0": "ParallelismConfig(sp_size=0)",
    "cp_backend_bad": "ParallelismConfig(cp_backend='ring')",
    "sp_backend_bad": "ParallelismConfig(sp_backend='ulysses')",
    "tp_without_transformers": "ParallelismConfig(tp_size=2)",
    "replicate_with_tp": "ParallelismConfig(dp_replicate_size=2, tp_size=2, tp_handler=tp_handler())",
    "replicate_with_cp": "ParallelismConfig(dp_replicate_size=2, cp_size=2)",
    "replicate_shard_tp_ok": "ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2, "
                             "tp_handler=tp_handler()).total_size",
    "cp_and_sp": "ParallelismConfig(cp_size=2, sp_size=2)",
    "cp_handler_wrong_type": "ParallelismConfig(cp_size=2, cp_handler=tp_handler())",
    "cp_comm_strategy_bad": "TorchContextParallelConfig(cp_comm_strategy='ring')",
    "float_size": "ParallelismConfig(dp_shard_size=2.0).total_size",
    "tp_handler_with_tp_1": "ParallelismConfig(tp_handler=tp_handler()).tp_handler is not None",
}


def tp_handler() -> Any:
    from accelerate.utils import TorchTensorParallelConfig

    handler = object.__new__(TorchTensorParallelConfig)  # skips only the transformers version check
    handler.enable_async_tp = False
    return handler


def describe(config: Any) -> dict[str, Any]:
    names, shape = config._get_mesh() if config.total_size > 1 else ((), ())
    return {**{p: getattr(config, p) for p in PROPERTIES}, "mesh_dim_names": list(names), "mesh_shape": list(shape),
            "sizes": dict(config._sizes), "cp_backend": config.cp_backend, "sp_backend": config.sp_backend,
            "tp_handler": type(config.tp_handler).__name__ if config.tp_handler is not None else None,
            "cp_handler": repr(config.cp_handler) if config.cp_handler is not None else None}


def in_process() -> dict[str, Any]:
    from accelerate import parallelism_config as pc_module
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import TorchContextParallelConfig

    fields = [{"name": f.name, "type": str(f.type), "default": repr(f.default)}
              for f in dataclasses.fields(ParallelismConfig)]
    configs = {}
    for name, (kwargs, _) in CONFIGS.items():
        if "tp_size" in kwargs:
            kwargs = {**kwargs, "tp_handler": tp_handler()}
        configs[name] = describe(ParallelismConfig(**kwargs))
    errors = {}
    scope = {"ParallelismConfig": ParallelismConfig, "TorchContextParallelConfig": TorchContextParallelConfig,
             "tp_handler": tp_handler}
    for name, expr in ERROR_CASES.items():
        try:
            errors[name] = "OK " + repr(eval(expr, scope))
        except Exception as e:  # noqa: BLE001 - the message is what is recorded
            errors[name] = f"{type(e).__name__}: {e}"
    env_names = ("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "PARALLELISM_CONFIG_DP_SHARD_SIZE",
                 "PARALLELISM_CONFIG_TP_SIZE", "PARALLELISM_CONFIG_CP_SIZE", "PARALLELISM_CONFIG_CP_BACKEND",
                 "PARALLELISM_CONFIG_SP_SIZE", "PARALLELISM_CONFIG_SP_BACKEND", "PARALLELISM_CONFIG_CP_COMM_STRATEGY")
    os.environ["PARALLELISM_CONFIG_DP_SHARD_SIZE"] = "2"
    from_env = ParallelismConfig()
    del os.environ["PARALLELISM_CONFIG_DP_SHARD_SIZE"]
    with open(pc_module.__file__) as f:
        source = f.read()
    return {"fields": fields, "configs": configs, "errors": errors, "env_names": env_names,
            "env_names_in_source": [n for n in env_names if n in source],
            "dp_shard_2_from_env": {"dp_shard_size": from_env.dp_shard_size, "total_size": from_env.total_size},
            "repr_fsdp2_tp2": repr(ParallelismConfig(dp_shard_size=2, tp_size=2, tp_handler=tp_handler())),
            "canonical_mesh_order": ["dp_replicate", "dp_shard", "cp", "sp", "tp"]}


def worker(name: str, out: str) -> None:
    """One rank: Accelerator(cpu=True, parallelism_config=...) on CPU, then the mesh it built and the batches."""
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.state import AcceleratorState
    from accelerate.utils import FullyShardedDataParallelPlugin

    kwargs = dict(CONFIGS[name][0])
    if "tp_size" in kwargs:
        kwargs["tp_handler"] = tp_handler()
    rank = int(os.environ["RANK"])
    result: dict[str, Any] = {}
    for label, extra in (("cpu", {"cpu": True}),
                         ("cpu_fsdp2", {"cpu": True, "fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2)}),
                         ("no_cpu_flag", {})):
        AcceleratorState._reset_state(True)
        try:
            acc = Accelerator(parallelism_config=ParallelismConfig(**kwargs), **extra)
            result[label] = {"ok": True, "distributed_type": str(acc.distributed_type),
                             "num_processes": acc.num_processes}
        except Exception as e:  # noqa: BLE001 - recorded
            state = AcceleratorState()
            result[label] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                             "distributed_type": str(state.distributed_type),
                             "num_processes": state.num_processes,
                             "fsdp_plugin_kept": getattr(state, "fsdp_plugin", None) is not None}
        if label == "cpu":
            mesh = AcceleratorState().device_mesh
            try:
                result["mesh"] = None if mesh is None else {
                    "dim_names": list(mesh.mesh_dim_names), "shape": list(mesh.shape),
                    "device_type": mesh.device_type,
                    "reachable": {n: {"size": mesh[n].size(), "local_rank": mesh[n].get_local_rank()}
                                  for n in ("dp_replicate", "dp_shard", "tp", "cp", "dp", "dp_shard_cp", "dp_cp")
                                  if _has(mesh, n)}}
            except Exception as e:  # noqa: BLE001 - a rank outside a mesh smaller than the world
                result["mesh"] = {"error": f"{type(e).__name__}: {e}"}
                mesh = None
            if mesh is not None and dist.is_initialized():
                loader = torch.utils.data.DataLoader(list(range(16)), batch_size=2)
                prepared = prepare_data_loader(loader, torch.device("cpu"), num_processes=dist.get_world_size(),
                                               process_index=rank, put_on_device=False, torch_device_mesh=mesh)
                result["batches"] = [b.tolist() for b in prepared]
    if dist.is_initialized():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
    else:
        gathered = [result]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    if dist.is_initialized():
        dist.destroy_process_group()


def _has(mesh: Any, name: str) -> bool:
    try:
        mesh[name]
        return True
    except Exception:  # noqa: BLE001 - absent dimension
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def multi_process() -> dict[str, Any]:
    found = {}
    for name, (_, nproc) in CONFIGS.items():
        with tempfile.TemporaryDirectory() as workdir:
            out = os.path.join(workdir, "out.json")
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                   "--master-addr=127.0.0.1", f"--master-port={free_port()}", __file__, "--worker", name, out]
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
            if proc.returncode != 0:
                raise RuntimeError(f"{name}: {proc.stderr[-4000:]}")
            with open(out) as f:
                ranks = json.load(f)
        first = ranks[0]
        found[name] = {"kwargs": CONFIGS[name][0], "processes": nproc,
                       **{k: first[k] for k in ("cpu", "cpu_fsdp2", "no_cpu_flag", "mesh")},
                       "batches_per_rank": [r.get("batches") for r in ranks],
                       "mesh_local_ranks": [{n: v["local_rank"] for n, v in
                                             ((r["mesh"] or {}).get("reachable") or {}).items()} for r in ranks]}
        print(name, json.dumps(found[name]["cpu"])[:200], flush=True)
    return found


def main() -> None:
    import accelerate
    import torch

    expected = {"versions": {"accelerate": accelerate.__version__, "torch": torch.__version__},
                **in_process(), "processes": multi_process()}
    with open(OUT, "w") as f:
        f.write(f'"""Observed from accelerate {accelerate.__version__} (torch {torch.__version__}, CPU, gloo) by '
                'tests/parity_scripts/record_parallelism_config.py under the pinned CPU kernel path of tests/kernel_path.py; do not edit."""\n\n')
        f.write(f"EXPECTED = {pprint.pformat(expected, width=116, sort_dicts=False)}\n")
    print("wrote", OUT)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
