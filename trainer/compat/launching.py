"""``Trainer(accelerator=..., devices=..., num_nodes=...)``: check them against the machine and the launch, and
start the processes when a plain ``python train.py`` asks for several.

Started by ``ember launch`` / torchrun / SLURM, the Trainer only checks that the launch matches the keywords.
Started as one plain process with ``devices > 1``, it runs the same script again in ``devices`` worker processes
through torch's own launcher (``torch.distributed.run`` and its elastic agent, as ``ember launch`` does), waits
for them and exits with their status: the workers run the whole script, this process runs it up to the
``Trainer(...)`` line.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import torch

_GPU_NAMES = ("gpu", "cuda")
_UNSUPPORTED_ACCELERATORS = ("mps", "tpu", "hpu", "xla", "ipu")


def check_accelerator(accelerator: Any) -> None:
    """``accelerator="gpu"`` on a machine without a usable GPU fails now, naming what was found."""
    if not isinstance(accelerator, str):
        return
    name = accelerator.lower()
    if name in _UNSUPPORTED_ACCELERATORS:
        raise ValueError(f"Trainer(accelerator={accelerator!r}) is not supported: Ember trains on CUDA GPUs or the "
                         "CPU. Use accelerator='gpu', 'cpu' or 'auto'.")
    if name in _GPU_NAMES and not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise RuntimeError(f"Trainer(accelerator={accelerator!r}) asks for a GPU, but torch.cuda.is_available() is "
                           f"False here (torch {torch.__version__}, {built}; CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Use accelerator='cpu' (or 'auto'), or run "
                           "on a machine with a GPU.")


def parse_devices(devices: Any, accelerator: Any) -> int | None:
    """Processes per node asked for by ``devices`` (``None`` for ``"auto"``).

    Takes Lightning's forms: an int, ``-1`` (every GPU), ``"2"``, ``"0,1"`` or ``[0, 1]`` (GPU ids).
    """
    gpu = isinstance(accelerator, str) and accelerator.lower() in _GPU_NAMES or (
        accelerator in (None, "auto") and torch.cuda.is_available())
    available = torch.cuda.device_count() if gpu else None
    if devices is None or devices == "auto":
        return None
    if isinstance(devices, str):
        text = devices.strip()
        if text.lstrip("-").isdigit():
            devices = int(text)
        elif all(part.strip().isdigit() for part in text.split(",") if part.strip()) and "," in text:
            devices = [int(part) for part in text.split(",") if part.strip()]
    if isinstance(devices, (list, tuple)) and devices and all(isinstance(d, int) for d in devices):
        if not gpu:
            raise ValueError(f"Trainer(devices={devices!r}) names GPU ids, but training runs on the CPU: pass "
                             f"devices={len(devices)} (a number of processes).")
        missing = [d for d in devices if not 0 <= d < (available or 0)]
        if missing:
            raise ValueError(f"Trainer(devices={devices!r}): GPU ids {missing} do not exist; this machine has "
                             f"{available} GPU(s) (ids 0..{(available or 1) - 1}).")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)  # the workers see only these
        return len(devices)
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices == -1:
            if not gpu:
                raise ValueError("Trainer(devices=-1) means every GPU, but training runs on the CPU: pass a number "
                                 "of processes, e.g. devices=2.")
            return max(1, available or 1)
        if devices < 1:
            raise ValueError(f"Trainer(devices={devices}) must be >= 1 (or -1 / 'auto').")
        if gpu and available is not None and devices > available:
            raise ValueError(f"Trainer(devices={devices}) asks for more GPUs than this machine has ({available}): "
                             f"pass devices={available} (or 'auto'), or run on more nodes with num_nodes=.")
        return devices
    raise ValueError(f"Trainer(devices=...) takes an int, -1, 'auto', a str like '2' or '0,1', or a list of GPU ids. "
                     f"Received: {devices!r}.")


def processes_to_start(devices: int | None, num_nodes: Any) -> int:
    """How many processes this plain process must start (1: none), after checking a launcher's environment
    against ``devices`` / ``num_nodes``."""
    from engine.environment import read_launch

    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ValueError(f"Trainer(num_nodes=...) must be an int >= 1. Received: {num_nodes!r}.")
    launch = read_launch(os.environ)
    if launch.launched:
        if devices is not None and devices != launch.local_world_size:
            raise ValueError(f"This process was launched with {launch.local_world_size} process(es) on this node "
                             f"(WORLD_SIZE={launch.world_size}), but Trainer(devices={devices}) asks for {devices}: "
                             f"pass devices={launch.local_world_size} (or 'auto'), or launch with --nproc-per-node "
                             f"{devices}.")
        if num_nodes * launch.local_world_size != launch.world_size:
            raise ValueError(f"Trainer(num_nodes={num_nodes}) with {launch.local_world_size} process(es) per node "
                             f"makes {num_nodes * launch.local_world_size}, but the launch started "
                             f"WORLD_SIZE={launch.world_size}: pass num_nodes="
                             f"{launch.world_size // max(1, launch.local_world_size)} or launch with --nnodes "
                             "matching num_nodes.")
        return 1
    if num_nodes > 1:
        raise ValueError(f"Trainer(num_nodes={num_nodes}) needs one launch per machine: run `ember launch --nnodes "
                         f"{num_nodes} --node-rank <i> --nproc-per-node {devices or 1} --rdzv-endpoint HOST:PORT "
                         "train.py` on each machine (or srun under SLURM).")
    return devices or 1


def launch_and_exit(processes: int, cpu: bool, precision: str | None, fsdp: bool) -> NoReturn:
    """Run this script again in ``processes`` workers through torchrun's machinery; exit with their status."""
    from engine.launch.config import LaunchConfig
    from engine.launch.torchrun import launch

    if "PYTEST_CURRENT_TEST" in os.environ:
        raise RuntimeError(f"Trainer(devices={processes}) from a single process would run the test runner again in "
                           f"{processes} processes: run the training script in a subprocess, or use the "
                           "run_distributed test helper.")
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    script_file = getattr(main, "__file__", None)
    if spec is not None and spec.name not in ("__main__", None):
        target, module = spec.name, True
    elif script_file and os.path.isfile(script_file) and not script_file.endswith("pytest"):
        target, module = script_file, False
    else:
        raise RuntimeError(f"Trainer(devices={processes}) from a single process runs the script again in each of "
                           f"{processes} processes, but this process has no script to run (an interactive "
                           "session, `python -c` or a notebook). Put the training in a script, or start it with "
                           f"`ember launch --nproc-per-node {processes} train.py`.")
    config = LaunchConfig(nproc_per_node=processes, cpu=cpu, mixed_precision=precision or "no", use_fsdp=fsdp)
    print(f"[ember] Trainer(devices={processes}): starting {processes} processes with torch.distributed.run "
          f"({'python -m ' + target if module else target}).", file=sys.stderr, flush=True)
    raise SystemExit(launch(config, target, sys.argv[1:], module=module))
