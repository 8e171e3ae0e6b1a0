"""Helpers of record_deepspeed.py: running the shared scripts on 2 processes, reading DeepSpeed's checkpoint files
(which pickled globals they hold and which of them ``torch.load(weights_only=True)`` needs allow-listed), and
``accelerate launch``'s environment. Runs in the throwaway venv (accelerate 1.15, deepspeed 0.19.8), never in tests.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import importlib
import json
import os
import pprint
import re
import socket
import subprocess
import sys
import time
from typing import Any, ClassVar

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "distributed")
ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_SCRIPT_API": "accelerate", "PYTHONPATH": ROOT}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, args: list[str], env: dict[str, str] | None = None, timeout: int = 600) -> tuple[int, str, float]:
    """``python -m torch.distributed.run --nproc-per-node 2`` on 127.0.0.1 and a free port: (rc, output, seconds)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), os.path.join(SCRIPTS, script), *args]
    started = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env or ENV, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - started


def run_training(run: dict[str, Any], workdir: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One run of deepspeed_script.py; its OUT_JSON plus the wall time (or the failure's last lines)."""
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "run.json"), "w") as f:
        json.dump(run, f)
    out = os.path.join(workdir, "out.json")
    first_error = None
    for attempt in range(2):  # once more after a failure: a free port can be taken by another process meanwhile
        rc, log, seconds = torchrun("deepspeed_script.py", [os.path.join(workdir, "run.json"), out], env)
        with open(os.path.join(workdir, f"log_{attempt}.txt"), "w") as f:
            f.write(log)
        if rc == 0:
            break
        first_error = first_error or error_lines(log)
    if rc != 0:
        return {"failed": rc, "log_tail": error_lines(log), "seconds": round(seconds, 1)}
    with open(out) as f:
        record = json.load(f)
    record["seconds"] = round(seconds, 1)
    if first_error:
        record["retried_after"] = first_error
    return record


def error_lines(log: str) -> list[str]:
    """The exception lines of a failed run (the launcher's own traceback left out)."""
    lines = [line for line in log.splitlines() if re.search(r"(Error|Exception|error)\b.*:", line)
             and "ChildFailedError" not in line and "FutureWarning" not in line]
    return lines[-6:]


class _Printer(pprint.PrettyPrinter):
    """pprint that never splits a string into implicit concatenations (messages stay whole and greppable)."""

    _dispatch: ClassVar[dict[Any, Any]] = {
        k: v for k, v in pprint.PrettyPrinter._dispatch.items()  # type: ignore[attr-defined]
        if k is not str.__repr__}


def write_expected(path: str, docstring: str, results: dict[str, Any], workdir: str) -> None:
    """The recorded values as a Python data module; this recording's temporary paths read as <workdir>."""
    body = _Printer(width=118, sort_dicts=False).pformat(results).replace(workdir, "<workdir>")
    with open(path, "w") as f:
        f.write(f'"""{docstring}"""\n\n')
        f.write('inf = float("inf")  # DeepSpeed configs hold steps_per_print=inf\n\n')
        f.write(f"EXPECTED = {body}\n")


# ---- checkpoint files --------------------------------------------------------------------------------------------

def _resolve(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def allow_list_for(path: str) -> dict[str, Any]:
    """Load ``path`` with weights_only=True, adding each global torch refuses until it loads: the exact list needed."""
    static = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    needed: list[str] = []
    for _ in range(50):
        try:
            with torch.serialization.safe_globals([_resolve(n) for n in needed]):
                obj = torch.load(path, map_location="cpu", weights_only=True)
            return {"static_scan": static, "allow_list": needed, "structure": structure(obj)}
        except Exception as exc:  # noqa: BLE001 - the message names the global to add
            found = (re.search(r"GLOBAL ([\w.]+)", str(exc)) or re.search(r"but got <class '([\w.]+)'>", str(exc))
                     or re.search(r"Unsupported global: ([\w.]+)", str(exc)))
            if not found or found.group(1) in needed:
                return {"static_scan": static, "allow_list": needed, "error": f"{type(exc).__name__}: {exc}"[:600]}
            needed.append(found.group(1))
    return {"static_scan": static, "allow_list": needed, "error": "gave up"}


def structure(obj: Any, depth: int = 0) -> Any:
    """Keys and types to depth 3: what a checkpoint file holds, without its numbers."""
    if isinstance(obj, torch.Tensor):
        return f"Tensor[{str(obj.dtype).replace('torch.', '')}, {list(obj.shape)}]"
    if isinstance(obj, dict):
        if depth >= 3:
            return f"{type(obj).__name__}[{len(obj)} keys]"
        return {str(k): structure(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if depth >= 3 or len(obj) > 6:
            kinds = sorted({type(v).__name__ for v in obj})
            return f"{type(obj).__name__}[{len(obj)} x {'|'.join(kinds)}]"
        return [structure(v, depth + 1) for v in obj]
    if type(obj) in (int, float, bool) or obj is None:
        return obj
    if type(obj) is str:
        return obj if len(obj) < 80 else f"str[{len(obj)}]"
    if isinstance(obj, int):  # an int subclass such as DeepSpeed's ZeroStageEnum: a pickled global of its own
        return f"<{type(obj).__module__}.{type(obj).__name__} {int(obj)}>"
    return f"<{type(obj).__module__}.{type(obj).__name__}>"


def checkpoint_files(state_dir: str) -> dict[str, Any]:
    out = {}
    for folder, _, names in os.walk(state_dir):
        for name in sorted(names):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, state_dir)
            if name.endswith(".py"):
                out[rel] = "python script"
            elif name == "latest":
                with open(path) as f:
                    out[rel] = f"text: {f.read()!r}"
            else:
                out[rel] = allow_list_for(path)
    return dict(sorted(out.items()))


def zero_to_fp32_weights(state_dir: str) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(state_dir)


def zero_to_fp32_script_outputs(state_dir: str, workdir: str) -> dict[str, Any]:
    """The zero_to_fp32.py DeepSpeed copies into the checkpoint, run as its users run it: the files it writes."""
    out = {}
    for label, extra in (("default", []), ("safe_serialization", ["--safe_serialization"])):
        target = os.path.join(workdir, f"fp32_{label}")
        proc = subprocess.run([sys.executable, os.path.join(state_dir, "zero_to_fp32.py"), state_dir, target, *extra],
                              check=False, capture_output=True, text=True, env=ENV, timeout=300)
        out[label] = sorted(os.listdir(target)) if proc.returncode == 0 else proc.stderr.splitlines()[-3:]
    return out


# ---- accelerate launch -------------------------------------------------------------------------------------------

DUMP = '''import dataclasses, json, os, sys
record = {"environ": dict(os.environ), "argv": sys.argv[1:]}
try:
    from accelerate.utils import DeepSpeedPlugin
    plugin = DeepSpeedPlugin()
    fields = {f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin)}
    fields["hf_ds_config"] = type(fields["hf_ds_config"]).__name__
    record["plugin"] = {"fields": fields, "deepspeed_config": plugin.deepspeed_config}
except Exception as exc:
    record["plugin"] = {"error": [type(exc).__name__, str(exc)]}
with open(os.path.join(sys.argv[1], "env_" + os.environ.get("RANK", "x") + ".json"), "w") as f:
    json.dump(record, f, default=repr)
'''
# Values that differ from run to run (temporary paths, ports of this machine): recorded as their kind only.
VARYING = {"TORCHELASTIC_ERROR_FILE", "_", "PYTHONPATH"}


def launch_env(flags: list[str], workdir: str) -> dict[str, Any]:
    """What ``accelerate launch FLAGS dump.py`` puts in the launched processes' environment and what it prints."""
    os.makedirs(workdir, exist_ok=True)
    script = os.path.join(workdir, "dump.py")
    with open(script, "w") as f:
        f.write(DUMP)
    config = os.path.join(workdir, "ds_config.json")
    with open(config, "w") as f:
        json.dump({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",
                   "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}, f)
    accelerate_config = os.path.join(workdir, "accelerate_config.yaml")
    with open(accelerate_config, "w") as f:  # a config file naming both a DeepSpeed config file and a ZeRO stage
        f.write(f"compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 2\n"
                f"deepspeed_config:\n  deepspeed_config_file: {config}\n  zero_stage: 2\n")
    flags = [{"CONFIG": config, "ACCELERATE_CONFIG": accelerate_config}.get(flag, flag) for flag in flags]
    env = {k: v for k, v in ENV.items() if not k.startswith("ACCELERATE_")}
    env["HF_HOME"] = os.path.join(workdir, "hf_home")  # no default accelerate config file
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    proc = subprocess.run([accelerate, "launch", *flags, script, workdir], check=False, capture_output=True,
                          text=True, env=env, cwd=workdir, timeout=300)
    out: dict[str, Any] = {"rc": proc.returncode}
    if proc.returncode != 0:
        out["error_tail"] = [line for line in proc.stderr.splitlines() if line.strip()][-4:]
    notes = [line.strip() for line in proc.stdout.splitlines() + proc.stderr.splitlines() if line.startswith("\t`--")]
    out["defaults_note"] = notes
    for rank in ("0", "1"):
        path = os.path.join(workdir, f"env_{rank}.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            child = json.load(f)
        added = {}
        for key, value in sorted(child["environ"].items()):
            if env.get(key) != value:
                value = value.replace(workdir, "<workdir>")
                added[key] = f"<{key.lower()}>" if key in VARYING else value
        out[f"rank{rank}"] = {"env": added, "plugin": child["plugin"]}
    return out
