"""Record Accelerate 1.15 + DeepSpeed 0.19.8 on 2 CPU processes and write tests/distributed/deepspeed_expected.py.

    python3 -m venv /work/venvs/ds && /work/venvs/ds/bin/pip install torch==2.13.0
    /work/venvs/ds/bin/pip install accelerate==1.15.0 deepspeed==0.19.8 transformers numpy safetensors
    DS_ACCELERATOR=cpu /work/venvs/ds/bin/python tests/parity_scripts/record_deepspeed.py [WORKDIR]

(Accelerate imports transformers whenever a DeepSpeedPlugin is selected: without it every DeepSpeed run fails.)

What it runs, each on 2 processes (torch.distributed.run, gloo, 127.0.0.1), with DS_SCRIPT_API=accelerate:
- tests/distributed/deepspeed_script.py for every entry of RUNS, saving the state after batches 6 and 16; then in
  new processes from the state of batch 6 to the end (RESUME), compared with the uninterrupted run;
- DeepSpeed's zero_to_fp32 on the final state, compared with ``accelerator.get_state_dict``;
- the pickled globals of each checkpoint file and the allow-list ``torch.load(weights_only=True)`` needs for it;
- tests/distributed/deepspeed_probe_script.py (defaults, "auto" filling, checks and their messages);
- ``accelerate launch`` with the DeepSpeed flags of LAUNCHES (the launched processes' environment);
- the first-start build of DeepSpeed's comm op (a fresh TORCH_EXTENSIONS_DIR), timed.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_deepspeed_tools as tools

sys.path.insert(0, tools.SCRIPTS)
from deepspeed_script import summary  # the same summary the runs write

OUT_MODULE = os.path.join(tools.ROOT, "tests", "distributed", "deepspeed_expected.py")
SAVE_AT = [6, 16]
RESUME_AT = 6


def _matrix() -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for stage in (1, 2, 3):
        for precision in ("fp32", "bf16"):
            for offload in ("none", "cpu"):
                name = f"z{stage}_{precision}" + ("_offload" if offload == "cpu" else "")
                runs[name] = {"zero_stage": stage, "offload_optimizer": offload,
                              "mixed_precision": "no" if precision == "fp32" else precision}
    runs["z3_fp32_offload_param"] = {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}
    runs["z3_fp32_persisted"] = {"zero_stage": 3, "persistence_threshold": None}  # DeepSpeed's default threshold
    runs["z2_fp32_sgd"] = {"zero_stage": 2, "optimizer": "sgd", "lr": 0.1}
    # DummyOptim / DummyScheduler with an "auto" config defining AdamW (torch_adam) and WarmupDecayLR.
    runs["config_z1_fp32"] = {"mode": "config", "zero_stage": 1}
    runs["config_z2_fp32"] = {"mode": "config", "zero_stage": 2}
    runs["config_z3_fp32"] = {"mode": "config", "zero_stage": 3}
    runs["config_z2_bf16"] = {"mode": "config", "zero_stage": 2, "mixed_precision": "bf16"}
    runs["config_z3_bf16_offload"] = {"mode": "config", "zero_stage": 3, "mixed_precision": "bf16",
                                      "offload_optimizer": "cpu"}
    return runs


RUNS = _matrix()
# Whose checkpoint files are read for their pickled globals (one of each layout and optimizer kind).
FILE_RUNS = ("z1_fp32", "z2_bf16", "z2_fp32_offload", "z3_fp32", "z3_bf16_offload", "config_z2_fp32", "z2_fp32_sgd")
LAUNCHES = {
    "zero_stage_2": ["--use_deepspeed", "--zero_stage", "2", "--num_processes", "2"],
    "config_file": ["--use_deepspeed", "--deepspeed_config_file", "CONFIG", "--num_processes", "2"],
    "zero_stage_and_config_file": ["--use_deepspeed", "--zero_stage", "2", "--deepspeed_config_file", "CONFIG",
                                   "--num_processes", "2"],
    "all_flags": ["--use_deepspeed", "--zero_stage", "3", "--offload_optimizer_device", "cpu",
                  "--offload_param_device", "cpu", "--gradient_accumulation_steps", "2", "--gradient_clipping", "1.0",
                  "--zero3_init_flag", "true", "--zero3_save_16bit_model", "true", "--mixed_precision", "bf16",
                  "--num_processes", "2"],
    "use_deepspeed_only": ["--use_deepspeed", "--num_processes", "2"],
    "config_file_and_mixed_precision": ["--use_deepspeed", "--deepspeed_config_file", "CONFIG", "--mixed_precision",
                                        "bf16", "--num_processes", "2"],
    # An accelerate config file whose deepspeed_config names a config file and a zero_stage.
    "accelerate_config_file_with_both": ["--config_file", "ACCELERATE_CONFIG"],
}
# Kept from each run's record (the rest is per-run noise such as train_seconds).
KEEP = ("distributed_type", "num_processes", "device", "gradient_accumulation_steps", "mixed_precision",
        "param_dtypes", "local_numels", "deepspeed_config", "plugin_config_is_same", "losses", "grad_norms", "lrs",
        "sync_gradients", "state_dict_sizes", "weights", "sha256", "probes", "seconds", "retried_after")


def record_run(name: str, run: dict[str, Any], workdir: str) -> dict[str, Any]:
    folder = os.path.join(workdir, name)
    full = tools.run_training({**run, "save_at": SAVE_AT, "probes": True}, folder)
    if "failed" in full:
        print(name, "FAILED", full["log_tail"][-1:], flush=True)
        return {"run": run, **full}
    out: dict[str, Any] = {"run": run, **{k: full[k] for k in KEEP if k in full}}
    out["save_state_files"] = {k: [name for name, _ in v] for k, v in full["save_state_files"].items()}
    resumed = tools.run_training({**run, "resume_from": os.path.join(folder, f"state_{RESUME_AT}"),
                                  "resume_at": RESUME_AT}, os.path.join(folder, "resumed"))
    if "failed" in resumed:
        out["resume"] = resumed
    else:
        out["resume"] = {"losses_equal": resumed["losses"] == full["losses"][RESUME_AT:],
                         "grad_norms_equal": resumed["grad_norms"] == full["grad_norms"][RESUME_AT // 2:],
                         "lrs_equal": resumed["lrs"] == full["lrs"][RESUME_AT // 2:],
                         "sha256_equal": resumed["sha256"] == full["sha256"], "seconds": resumed["seconds"]}
        if "retried_after" in resumed:
            out["resume"]["retried_after"] = resumed["retried_after"]
        if not all(v for k, v in out["resume"].items() if k.endswith("_equal")):
            out["resume"].update(losses=resumed["losses"], sha256=resumed["sha256"])
    fp32 = tools.zero_to_fp32_weights(os.path.join(folder, f"state_{SAVE_AT[-1]}"))
    weights, sha = summary(fp32)
    import torch

    rounded = summary({k: v.to(torch.bfloat16) for k, v in fp32.items()})[1]
    out["zero_to_fp32"] = {"sha256": sha, "equals_get_state_dict": sha == full["sha256"],
                           "as_bf16_equals_get_state_dict": rounded == full["sha256"],
                           "dtypes": sorted({str(v.dtype) for v in fp32.values()})}
    if not out["zero_to_fp32"]["equals_get_state_dict"]:
        out["zero_to_fp32"]["weights"] = weights
    print(name, "ok", full["seconds"], "s; resume", out["resume"], flush=True)
    return out


def op_build_seconds(workdir: str) -> dict[str, Any]:
    """One run with an empty TORCH_EXTENSIONS_DIR (DeepSpeed builds its comm op) and one with the cache warm."""
    cache = os.path.join(workdir, "torch_extensions")
    cold = tools.run_training({"zero_stage": 2}, os.path.join(workdir, "cold"), {**tools.ENV, "TORCH_EXTENSIONS_DIR": cache})
    warm = tools.run_training({"zero_stage": 2}, os.path.join(workdir, "warm"), {**tools.ENV, "TORCH_EXTENSIONS_DIR": cache})
    return {"cold_start_run_seconds": cold.get("seconds"), "warm_run_seconds": warm.get("seconds"),
            "built": sorted(os.listdir(os.path.join(cache, os.listdir(cache)[0]))) if os.path.isdir(cache) else None}


def probes(workdir: str) -> dict[str, Any]:
    out = os.path.join(workdir, "probes.json")
    rc, log, seconds = tools.torchrun("deepspeed_probe_script.py", [out])
    if rc != 0:
        return {"failed": rc, "log_tail": log.splitlines()[-12:]}
    with open(out) as f:
        rank0 = json.load(f)
    with open(out + ".rank1") as f:
        rank1 = json.load(f)
    return {"cases": rank0, "rank1_differs": {k: rank1[k] for k in rank0 if rank1.get(k) != rank0[k]},
            "seconds": round(seconds, 1)}


def main(workdir: str) -> None:
    import accelerate
    import deepspeed
    import torch

    started = time.perf_counter()
    results: dict[str, Any] = {"versions": {"accelerate": accelerate.__version__, "deepspeed": deepspeed.__version__,
                                            "torch": torch.__version__}}
    results["op_build"] = op_build_seconds(os.path.join(workdir, "op_build"))
    print("op build", results["op_build"], flush=True)
    results["probes"] = probes(workdir)
    print("probes", results["probes"].get("seconds"), flush=True)
    results["launch"] = {name: tools.launch_env(flags, os.path.join(workdir, "launch", name))
                         for name, flags in LAUNCHES.items()}
    results["runs"] = {name: record_run(name, run, workdir) for name, run in RUNS.items()}
    results["checkpoint_files"] = {name: tools.checkpoint_files(os.path.join(workdir, name, f"state_{SAVE_AT[-1]}"))
                                   for name in FILE_RUNS}
    results["zero_to_fp32_script"] = tools.zero_to_fp32_script_outputs(
        os.path.join(workdir, "z2_fp32", f"state_{SAVE_AT[-1]}"), workdir)
    results["record_seconds"] = round(time.perf_counter() - started, 1)
    tools.write_expected(OUT_MODULE, f"Observed from accelerate {accelerate.__version__} + deepspeed "
                         f"{deepspeed.__version__} (torch {torch.__version__}, DS_ACCELERATOR=cpu, 2 processes, gloo) "
                         "by\ntests/parity_scripts/record_deepspeed.py running tests/distributed/deepspeed_script.py "
                         "and deepspeed_probe_script.py under the pinned CPU kernel path of tests/kernel_path.py; do not edit.", results, workdir)
    print("wrote", OUT_MODULE, "in", results["record_seconds"], "s")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        target = sys.argv[1]
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        main(target)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
