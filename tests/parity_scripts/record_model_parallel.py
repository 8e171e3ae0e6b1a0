"""Record Lightning 2.6.6's ModelParallelStrategy on CPU with gloo; write tests/distributed/model_parallel_expected.py.

    MODEL_PARALLEL_FRAMEWORK=lightning /work/venvs/bigmodel/bin/python tests/parity_scripts/record_model_parallel.py

The training runs are tests/distributed/model_parallel_script.py, unchanged, started as a user would (one plain
process; Lightning's launcher starts the others): TP=2 (2 processes), TP=2 with sequence parallelism, DP=2 x TP=2
(4 processes, FSDP2 over the data-parallel dimension), their single-process references, a 1 x 1 mesh; then save
after one epoch and resume for the second (sharded and full checkpoints), and the checkpoint's layout on disk; save
with one layout and resume with another (RESHARDS). The
errors Lightning raises come from small probes, each in its own process.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "distributed", "model_parallel_script.py")
OUT = os.path.join(ROOT, "tests", "distributed", "model_parallel_expected.py")
ENV = {**os.environ, "MODEL_PARALLEL_FRAMEWORK": "lightning", "PYTHONWARNINGS": "ignore"}

RUNS = {
    "reference_dp1": ["--tp", "0", "--dp", "1"],
    "dp1_tp1": ["--dp", "1", "--tp", "1"],
    "tp2": ["--tp", "2"],
    "tp2_sp": ["--tp", "2", "--variant", "sp"],
    "reference_dp2": ["--tp", "0", "--dp", "2"],
    "dp2_tp2": ["--dp", "2", "--tp", "2"],
    "dp2_tp2_sp": ["--dp", "2", "--tp", "2", "--variant", "sp"],
}
# name -> (uninterrupted run, extra arguments)
RESUMES = {
    "tp2": ("tp2", ["--tp", "2"]),
    "dp2_tp2": ("dp2_tp2", ["--dp", "2", "--tp", "2"]),
    "tp2_full_checkpoint": ("tp2", ["--tp", "2", "--full-checkpoint"]),
}
# Save with one layout after epoch 1, resume epoch 2 with another: name -> (save args, resume args, run to compare).
RESHARDS = {
    "tp2_to_dp1_tp1": (["--tp", "2"], ["--dp", "1", "--tp", "1"], "tp2"),
    "tp2_to_single_process_no_strategy": (["--tp", "2"], ["--tp", "0"], "reference_dp1"),
    "tp2_full_file_to_single_process_no_strategy": (["--tp", "2", "--full-checkpoint"], ["--tp", "0"],
                                                    "reference_dp1"),
    "dp2_tp2_to_tp2": (["--dp", "2", "--tp", "2"], ["--dp", "1", "--tp", "2"], None),
}
REFERENCE_OF = {"dp1_tp1": "reference_dp1", "tp2": "reference_dp1", "tp2_sp": "reference_dp1",
                "dp2_tp2": "reference_dp2", "dp2_tp2_sp": "reference_dp2"}


def run_script(args: list[str], workdir: str) -> dict[str, Any]:
    out = os.path.join(workdir, "out.json")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, SCRIPT, out, *args], cwd=workdir, env=ENV, check=False, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    with open(out) as f:
        result = json.load(f)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def global_losses(result: dict[str, Any], dp: int) -> list[float]:
    """Mean over data-parallel ranks of each step's loss (ranks are dp-major: rank = dp_rank * tp + tp_rank)."""
    per_rank = result["losses"]
    tp = len(per_rank) // dp
    firsts = [per_rank[d * tp] for d in range(dp)]
    return [sum(step) / dp for step in zip(*firsts)]


def layout(path: str) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    if os.path.isfile(path):
        ckpt = torch.load(path, weights_only=False)
        optim = ckpt["optimizer_states"][0]
        return {"kind": "file", "size": os.path.getsize(path), "top_keys": sorted(ckpt),
                "state_dict_keys": sorted(ckpt["state_dict"]),
                "state_dict_types": sorted({type(v).__name__ for v in ckpt["state_dict"].values()}),
                "optimizer_state_keys": sorted(str(k) for k in optim["state"])[:4],
                "optimizer_param_groups_params": [g["params"] for g in optim["param_groups"]]}
    files = {name: os.path.getsize(os.path.join(path, name)) for name in sorted(os.listdir(path))}
    meta = torch.load(os.path.join(path, "meta.pt"), weights_only=False)
    keys = sorted(FileSystemReader(path).read_metadata().state_dict_metadata)
    return {"kind": "directory", "files": files, "meta_pt_keys": sorted(meta),
            "dcp_keys_state_dict": [k for k in keys if k.startswith("state_dict.")],
            "dcp_keys_optimizer_sample": [k for k in keys if k.startswith("optimizer_0.")][:12],
            "dcp_key_count": len(keys)}


def record_runs() -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for name, args in RUNS.items():
        with tempfile.TemporaryDirectory() as workdir:
            runs[name] = run_script(args, workdir)
        print(name, runs[name]["wall_s"], "s", flush=True)
    return runs


def record_resumes(runs: dict[str, Any]) -> dict[str, Any]:
    resumes: dict[str, Any] = {}
    for name, (base, args) in RESUMES.items():
        with tempfile.TemporaryDirectory() as workdir:
            ckpt = os.path.join(workdir, "last.ckpt")
            first = run_script([*args, "--epochs", "1", "--save", ckpt], workdir)
            disk = layout(ckpt)
            second = run_script([*args, "--epochs", "2", "--resume", ckpt], workdir)
        full = runs[base]
        diffs = [abs(a - b) for n in full["weights"] for a, b in zip(full["weights"][n], second["weights"][n])]
        resumes[name] = {
            "layout": disk, "first_global_step": first["global_step"], "resumed_global_step": second["global_step"],
            "first_losses_equal_uninterrupted": all(f == u[:len(f)] for f, u in zip(first["losses"],
                                                                                       full["losses"])),
            "resumed_losses": second["losses"],
            "resumed_losses_equal_uninterrupted": all(r == u[len(u) - len(r):] for r, u in zip(second["losses"],
                                                                                              full["losses"])),
            "resumed_weights_max_abs_diff": max(diffs), "resumed_hook_log": second["hook_log"],
        }
        print("resume", name, resumes[name]["resumed_losses_equal_uninterrupted"], max(diffs), flush=True)
    return resumes


def record_reshards(runs: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, (save_args, load_args, compare) in RESHARDS.items():
        with tempfile.TemporaryDirectory() as workdir:
            ckpt = os.path.join(workdir, "last.ckpt")
            run_script([*save_args, "--epochs", "1", "--save", ckpt], workdir)
            try:
                second = run_script([*load_args, "--epochs", "2", "--resume", ckpt], workdir)
            except RuntimeError as e:
                tail = [ln for ln in str(e).splitlines() if "Error" in ln]
                found[name] = {"ok": False, "error": tail[-1] if tail else str(e)[-500:]}
                print("reshard", name, found[name], flush=True)
                continue
        entry: dict[str, Any] = {"ok": True, "resumed_losses": second["losses"], "global_step": second["global_step"]}
        if compare is not None:
            base = runs[compare]["losses"][0]
            entry["max_abs_loss_diff_vs_" + compare] = max(abs(a - b) for a, b in zip(second["losses"][0],
                                                                                   base[len(base) - 3:]))
        found[name] = entry
        print("reshard", name, entry, flush=True)
    return found


PROBE_HEADER = """
import os, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {root!r})
os.environ["MODEL_PARALLEL_FRAMEWORK"] = "lightning"
from lightning.pytorch import Trainer, LightningModule
from lightning.pytorch.strategies import ModelParallelStrategy
from tests.distributed.model_parallel_script import LanguageModel, data, BATCH
def kw(**extra):
    return dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, **extra)
try:
"""
PROBES = {
    "precision_16_mixed": "Trainer(**kw(strategy=ModelParallelStrategy(), precision='16-mixed'))",
    "precision_transformer_engine": "Trainer(**kw(strategy=ModelParallelStrategy(), precision='transformer-engine'))",
    "device_mesh_before_setup": "ModelParallelStrategy().device_mesh",
    "sizes_do_not_multiply": ("Trainer(**kw(strategy=ModelParallelStrategy(data_parallel_size=2, "
                              "tensor_parallel_size=1))).fit(LanguageModel(), data(1, BATCH))"),
    "no_configure_model": textwrap.dedent("""\
        class Plain(LanguageModel):
            configure_model = LightningModule.configure_model
        Trainer(**kw(strategy=ModelParallelStrategy(1, 1))).fit(Plain(), data(1, BATCH))"""),
    "auto_sizes_one_process": textwrap.dedent("""\
        s = ModelParallelStrategy()
        m = LanguageModel()
        Trainer(**kw(strategy=s)).fit(m, data(1, BATCH))
        print("OK", s._data_parallel_size, s._tensor_parallel_size, s.device_mesh.mesh_dim_names,
              s.distributed_sampler_kwargs, m.hook_log)"""),
}


def record_probes() -> dict[str, str]:
    found: dict[str, str] = {}
    for name, body in PROBES.items():
        code = PROBE_HEADER.format(root=ROOT) + textwrap.indent(body, "    ") + (
            "\nexcept Exception as e:\n    print('ERROR', type(e).__name__ + ': ' + str(e))\n")
        with tempfile.TemporaryDirectory() as workdir:
            proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=ENV, check=False,
                                  capture_output=True, text=True, timeout=300)
        lines = [line for line in proc.stdout.splitlines() if line.startswith(("ERROR", "OK"))]
        found[name] = lines[-1] if lines else f"rc={proc.returncode} {proc.stderr[-500:]}"
        print(name, found[name], flush=True)
    return found


def literal(obj: Any, indent: int = 0) -> str:
    """A Python literal with one dict key per line and every list of scalars on one line (weights are long)."""
    pad = " " * (indent + 4)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{k!r}: {literal(v, indent + 4)}," for k, v in obj.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        if all(isinstance(v, list) and not any(isinstance(w, (dict, list)) for w in v) for v in obj) and \
                sum(len(v) for v in obj) < 60:
            return repr(obj)
        items = [f"{pad}{literal(v, indent + 4)}," for v in obj]
        return "[\n" + "\n".join(items) + "\n" + " " * indent + "]"
    return repr(obj)


def main() -> None:
    import lightning
    import torch

    runs = record_runs()
    summary: dict[str, Any] = {}
    for name, ref in REFERENCE_OF.items():
        dp = 2 if "dp2" in name else 1
        mine, theirs = global_losses(runs[name], dp), runs[ref]["losses"][0]
        weight_diff = max(abs(a - b) for n in runs[ref]["weights"]
                          for a, b in zip(runs[ref]["weights"][n], runs[name]["weights"][n]))
        summary[name] = {"reference": ref, "max_abs_loss_diff": max(abs(a - b) for a, b in zip(mine, theirs)),
                         "max_abs_weight_diff": weight_diff,
                         "tp_ranks_equal_losses": all(r == runs[name]["losses"][(i // 2) * 2]
                                                      for i, r in enumerate(runs[name]["losses"]))}
    resumes = record_resumes(runs)
    reshards = record_reshards(runs)
    probes = record_probes()
    expected = {"versions": {"lightning": lightning.__version__, "torch": torch.__version__},
                "runs": runs, "vs_reference": summary, "resumes": resumes, "reshards": reshards,
                "probes": probes}
    with open(OUT, "w") as f:
        f.write(f'"""Observed from lightning {lightning.__version__} (torch {torch.__version__}, CPU, gloo) by '
                'tests/parity_scripts/record_model_parallel.py running\ntests/distributed/model_parallel_script.py; '
                'do not edit. Weights are float32 values (shortest round-trip decimals), gathered\nwith '
                'DTensor.full_tensor(); losses are per rank, in rank order (rank = dp_rank * tp + tp_rank)."""\n\n')
        f.write(f"EXPECTED = {literal(expected)}\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
