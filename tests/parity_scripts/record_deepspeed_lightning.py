"""Record Lightning 2.6's DeepSpeedStrategy on 2 CPU processes; write tests/lightning_corpus/deepspeed_expected.py.

    DS_ACCELERATOR=cpu /work/venvs/ds/bin/python tests/parity_scripts/record_deepspeed_lightning.py [WORKDIR]

(the venv of record_deepspeed.py, with lightning==2.6.6.)

Lightning 2.6 refuses DeepSpeed on anything but CUDA: ``DeepSpeedStrategy.setup_environment`` raises
"The DeepSpeed strategy is only supported on CUDA GPUs but `CPUAccelerator` is used." before anything else runs
(recorded below as ``cpu_refusal``), and ``setup_distributed`` then requires CUDA device indices ("The selected
device indices [None, None] don't match the local rank values of processes..."), and it hands
``deepspeed.initialize`` ``args.device_rank = root_device.index``, None on CPU, which DeepSpeed compares with 0
("TypeError: '>=' not supported between instances of 'NoneType' and 'int'"). To observe the rest of the strategy on
CPU, the runs go through PATCH: the first check is replaced by DDPStrategy's setup_environment (what
DeepSpeedStrategy calls after it), the device-index check by a no-op, and a None device_rank by the local rank;
everything else (config, deepspeed.initialize, stepping, checkpoints) is Lightning's own. The corpus script
(tests/lightning_corpus/deepspeed_script.py) is run with its Ember imports turned into Lightning's, nothing else.

Also recorded: ``DeepSpeedStrategy.__init__``'s defaults, the config each registered strategy string builds
(before fit; the runs record it after fit), and what loading a DeepSpeed checkpoint folder outside the strategy does.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import inspect
import json
import os
import runpy
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_deepspeed_tools as tools
from record_corpus import SWAPS, to_lightning  # the corpus' Ember -> Lightning import table

STRATEGY_SWAP = ("from trainer.strategies import ", "from lightning.pytorch.strategies import ")
CORPUS = os.path.join(tools.ROOT, "tests", "lightning_corpus")
OUT_MODULE = os.path.join(CORPUS, "deepspeed_expected.py")
STRINGS = ("deepspeed", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
           "deepspeed_stage_3_offload")
PATCH = '''import runpy, sys
import lightning.pytorch.strategies.deepspeed as lightning_deepspeed
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
# The recorder's only changes to Lightning: skip its two CUDA-only checks (see record_deepspeed_lightning.py).
DeepSpeedStrategy.setup_environment = DDPStrategy.setup_environment
lightning_deepspeed._validate_device_index_selection = lambda devices: None
import os, deepspeed
_initialize = deepspeed.initialize
def initialize(*args, **kwargs):  # Lightning passes root_device.index, None on CPU; DeepSpeed wants the local rank
    if getattr(kwargs.get("args"), "device_rank", 0) is None:
        kwargs["args"].device_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return _initialize(*args, **kwargs)
deepspeed.initialize = initialize
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''
RUNS: dict[str, dict[str, Any]] = {
    "deepspeed_32": {"strategy": "deepspeed"},
    "deepspeed_stage_1_32": {"strategy": "deepspeed_stage_1"},
    "deepspeed_stage_2_32": {"strategy": "deepspeed_stage_2"},
    "deepspeed_stage_2_bf16": {"strategy": "deepspeed_stage_2", "precision": "bf16-mixed"},
    "deepspeed_stage_2_offload_32": {"strategy": "deepspeed_stage_2_offload"},
    "deepspeed_stage_2_offload_bf16": {"strategy": "deepspeed_stage_2_offload", "precision": "bf16-mixed"},
    "deepspeed_stage_3_32": {"strategy": "deepspeed_stage_3"},
    "deepspeed_stage_3_bf16": {"strategy": "deepspeed_stage_3", "precision": "bf16-mixed"},
    "deepspeed_stage_3_offload_32": {"strategy": "deepspeed_stage_3_offload"},
    "strategy_object_stage_3_32": {"strategy_kwargs": {"stage": 3, "offload_optimizer": False}},
    # As a user would run the offload strings: DeepSpeed refuses torch's optimizer on offloaded states.
    "deepspeed_stage_2_offload_as_is": {"strategy": "deepspeed_stage_2_offload", "force_ds_cpu_optimizer": None},
}
RESUME = ("deepspeed_stage_1_32", "deepspeed_stage_2_32", "deepspeed_stage_2_bf16", "deepspeed_stage_2_offload_32",
          "deepspeed_stage_3_32", "deepspeed_stage_3_bf16", "deepspeed_stage_3_offload_32")
KEEP = ("strategy_type", "config_before_fit", "config", "precision", "world_size", "global_step", "losses",
        "param_dtypes", "weights", "sha256", "checkpoints", "seconds", "retried_after")


def lightning_source() -> str:
    with open(os.path.join(CORPUS, "deepspeed_script.py")) as f:
        source = f.read()
    lines = [STRATEGY_SWAP[1] + line[len(STRATEGY_SWAP[0]):] if line.startswith(STRATEGY_SWAP[0]) else line
             for line in source.splitlines()]
    return to_lightning("\n".join(lines))


def run_lightning(run: dict[str, Any], workdir: str, patched: bool = True) -> dict[str, Any]:
    os.makedirs(workdir, exist_ok=True)
    script, patch = os.path.join(workdir, "train.py"), os.path.join(workdir, "patch.py")
    with open(script, "w") as f:
        f.write(lightning_source())
    with open(patch, "w") as f:
        f.write(PATCH)
    with open(os.path.join(workdir, "run.json"), "w") as f:
        json.dump(run, f)
    out = os.path.join(workdir, "out.json")
    args = [script, os.path.join(workdir, "run.json"), out]
    first_error = None
    for attempt in range(2 if patched else 1):  # once more after a failure, as record_deepspeed_tools does
        rc, log, seconds = tools.torchrun(patch if patched else script, args if patched else args[1:])
        with open(os.path.join(workdir, f"log_{attempt}.txt"), "w") as f:
            f.write(log)
        if rc == 0:
            break
        first_error = first_error or tools.error_lines(log)
    if rc != 0:
        return {"failed": rc, "error": _last_error(log), "log_tail": tools.error_lines(log), "seconds": round(seconds, 1)}
    with open(out) as f:
        record = json.load(f)
    record["seconds"] = round(seconds, 1)
    if first_error:
        record["retried_after"] = first_error
    return record


def _last_error(log: str) -> str:
    errors = [line.split("]: ", 1)[-1] for line in log.splitlines()
              if ("Error: " in line or "Exception: " in line) and "ChildFailedError" not in line]
    return errors[-1] if errors else ""


def record_run(name: str, run: dict[str, Any], workdir: str) -> dict[str, Any]:
    folder = os.path.join(workdir, name)
    full = run_lightning(run, folder)
    out: dict[str, Any] = {"run": run, **{k: full[k] for k in (*KEEP, "failed", "error", "log_tail") if k in full}}
    if name in RESUME and "failed" not in full:
        first = min(full["checkpoints"])  # the end of epoch 0
        resumed = run_lightning({**run, "ckpt_path": os.path.join(folder, "checkpoints", first)},
                                os.path.join(folder, "resumed"))
        if "failed" in resumed:
            out["resume"] = {k: resumed[k] for k in ("failed", "error", "log_tail")}
        else:
            half = len(full["losses"]) // 2
            out["resume"] = {"from": first, "losses_equal": resumed["losses"] == full["losses"][half:],
                             "sha256_equal": resumed["sha256"] == full["sha256"],
                             "global_step": resumed["global_step"], "seconds": resumed["seconds"]}
            if "retried_after" in resumed:
                out["resume"]["retried_after"] = resumed["retried_after"]
            if not (out["resume"]["losses_equal"] and out["resume"]["sha256_equal"]):
                out["resume"].update(losses=resumed["losses"], sha256=resumed["sha256"])
    print(name, "failed: " + full.get("error", "") if "failed" in full else "ok", out.get("resume"), flush=True)
    return out


def strategy_configs() -> dict[str, Any]:
    """The config each registered string builds in the constructor, and DeepSpeedStrategy.__init__'s defaults."""
    from lightning.pytorch.strategies import DeepSpeedStrategy, StrategyRegistry

    out: dict[str, Any] = {"defaults": {k: repr(p.default) for k, p in
                                        inspect.signature(DeepSpeedStrategy.__init__).parameters.items()
                                        if k != "self"}}
    out["registered"] = {k: {"description": v["description"], "init_params": v["init_params"]}
                         for k, v in StrategyRegistry.items() if k.startswith("deepspeed")}
    out["configs"] = {s: StrategyRegistry.get(s).config for s in STRINGS}
    out["config_of_object_default"] = DeepSpeedStrategy().config
    return out


def checkpoint_loading(workdir: str) -> dict[str, Any]:
    """What a DeepSpeed checkpoint folder gives the usual readers (torch.load, load_from_checkpoint, conversion)."""
    import torch
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    out: dict[str, Any] = {}
    for name in ("deepspeed_stage_2_32", "deepspeed_stage_3_32"):
        folder = os.path.join(workdir, name, "checkpoints")
        if not os.path.isdir(folder):
            continue
        ckpt = os.path.join(folder, max(os.listdir(folder)))
        files = {rel: tools.allow_list_for(os.path.join(ckpt, rel)) for rel in
                 sorted(os.path.relpath(os.path.join(d, n), ckpt) for d, _, ns in os.walk(ckpt) for n in ns)
                 if rel.endswith(".pt")}
        entry: dict[str, Any] = {"files": files}
        try:
            torch.load(ckpt, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - observed
            entry["torch_load_folder"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        corpus = runpy.run_path(os.path.join(workdir, name, "train.py"), run_name="corpus")  # Lightning's imports
        regressor = corpus["Regressor"]
        try:
            regressor.load_from_checkpoint(ckpt)
        except Exception as exc:  # noqa: BLE001 - observed
            entry["load_from_checkpoint_folder"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        target = os.path.join(workdir, f"{name}_converted.ckpt")
        convert_zero_checkpoint_to_fp32_state_dict(ckpt, target)
        entry["converted_allow_list"] = tools.allow_list_for(target)["allow_list"]
        converted = torch.load(target, weights_only=False)
        entry["converted_keys"] = sorted(converted)
        entry["converted_state_dict"] = {k: [str(v.dtype), list(v.shape)] for k, v in converted["state_dict"].items()}
        loaded = regressor.load_from_checkpoint(target)
        entry["load_from_converted_sha256_equals_run"] = corpus["full_weights"](loaded)[1] == _run_sha(workdir, name)
        out[name] = entry
    return out


def _run_sha(workdir: str, name: str) -> str:
    with open(os.path.join(workdir, name, "out.json")) as f:
        return json.load(f)["sha256"]


def main(workdir: str) -> None:
    import lightning
    import torch

    started = time.perf_counter()
    results: dict[str, Any] = {"versions": {"lightning": lightning.__version__,
                                            "deepspeed": __import__("deepspeed").__version__,
                                            "torch": torch.__version__}}
    results["strategies"] = strategy_configs()
    refusal = run_lightning({"strategy": "deepspeed_stage_2"}, os.path.join(workdir, "unpatched"), patched=False)
    results["cpu_refusal"] = refusal.get("error") or refusal
    results["runs"] = {name: record_run(name, run, workdir) for name, run in RUNS.items()}
    results["checkpoint_loading"] = checkpoint_loading(workdir)
    results["record_seconds"] = round(time.perf_counter() - started, 1)
    tools.write_expected(OUT_MODULE, f"Observed from lightning {lightning.__version__} + deepspeed "
                         f"{results['versions']['deepspeed']} (torch {torch.__version__}, DS_ACCELERATOR=cpu, "
                         "2 processes, gloo, the CUDA-only checks skipped) by\n"
                         "tests/parity_scripts/record_deepspeed_lightning.py running "
                         "tests/lightning_corpus/deepspeed_script.py under the pinned CPU kernel path of tests/kernel_path.py; do not edit.", results, workdir)
    print("wrote", OUT_MODULE, "in", results["record_seconds"], "s")


if __name__ == "__main__":
    assert SWAPS  # the import table comes from record_corpus.py
    if len(sys.argv) > 1:
        shutil.rmtree(sys.argv[1], ignore_errors=True)
        os.makedirs(sys.argv[1])
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
