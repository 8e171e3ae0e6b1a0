"""Each backend through Ember and through the anchor a user would otherwise pick: ms per step, collectives per
step, and the sharded checkpoints' save / load, side by side.

    python benchmarks/backends_vs_anchors.py --anchor-python /tmp/venv-anchor/bin/python [--rounds 3]

``--anchor-python`` is a throwaway interpreter with ``torch==2.13.0``, then ``accelerate==1.15.*``,
``deepspeed==0.19.8`` and ``transformers`` (Accelerate's DeepSpeed path imports it); Ember does not depend on
them. Every run is ``benchmarks/backend_step.py`` on 2 processes (torchrun, gloo, one thread each): the same
model (6 x Linear(1024, 1024), AdamW, fp32, micro batch 32), ``--warmup`` untimed steps, ``--steps`` timed ones.
The pairs, per backend:

- ``ddp``: Ember vs Accelerate, vs raw ``DistributedDataParallel``;
- ``fsdp2``: Ember vs raw ``fully_shard`` (Accelerate 1.15 drops its FSDP plugin on a CPU);
- ``zero1`` / ``zero2`` / ``zero3``: Ember vs Accelerate, vs raw ``deepspeed.initialize``;
- ``tp``: the engine's ``tp_plan`` (``ParallelismConfig(tp_size=2)``) vs raw ``parallelize_module``;
- ``trainer-ddp`` / ``trainer-tp``: Ember's ``Trainer`` vs Lightning's (``strategy="ddp"``;
  ``ModelParallelStrategy(tensor_parallel_size=2)``), the same module by import swap, each batch timed by a
  callback (``benchmarks/trainer_step.py``; the anchor Python needs ``lightning==2.6.6`` too).

Not here, because the anchors refuse a CPU (observed): Accelerate's FSDP2 (``cpu=True`` drops the plugin),
Lightning's ``FSDPStrategy`` ("requires a GPU accelerator") and fp8 (torch's CPU fp8 kernels need AVX512-FP16).

Rounds are interleaved (each round runs every API of every backend, the order alternating), so a slower or
faster stretch of the machine falls on both sides. Printed: per backend and anchor, Ember's and the anchor's
median ms per step (the median over rounds of each run's median) with the range over rounds, the ratio
anchor / Ember (>= 1.0: Ember no slower), the collectives per step each made (counted, not timed: the Python
collectives of ``torch.distributed``; DDP's C++ bucket all-reduces are the same reducer on both sides and not
counted), the torch operators each step dispatched (the profiler's ``aten::`` count) and whether the last losses
are equal. With ``--save-rounds N``, each side's save and load of the same state too: ``save_state`` /
``load_state`` (Ember, Accelerate), DeepSpeed's ``save_checkpoint`` / ``load_checkpoint``, raw DCP for torch
(Ember's saves fsync every file and commit atomically, a promise none of the anchors makes). Run it on a quiet machine: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "backend_step.py"
# Accelerate 1.15 runs no FSDP on a CPU (cpu=True gives MULTI_CPU: the plugin is dropped), so FSDP2's anchor here
# is torch's own fully_shard.
PAIRS = {"ddp": ("accelerate", "torch"), "fsdp2": ("torch",), "zero1": ("accelerate", "deepspeed"),
         "zero2": ("accelerate", "deepspeed"), "zero3": ("accelerate", "deepspeed"),
         # Tensor parallel over both processes: Accelerate's needs a transformers model; raw DTensor is the anchor.
         "tp": ("torch",),
         # The Trainers (benchmarks/trainer_step.py): the same module by import swap.
         "trainer-ddp": ("lightning",), "trainer-tp": ("lightning",)}
TRAINER_WORKER = ROOT / "benchmarks" / "trainer_step.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_once(api: str, backend: str, anchor_python: str, folder: str, args: argparse.Namespace) -> dict[str, Any]:
    """One 2-process run of the worker; its rank 0's JSON."""
    python = sys.executable if api == "engine" else anchor_python
    out = os.path.join(folder, f"{backend}-{api}.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    if api == "engine":
        env["PYTHONPATH"] = str(ROOT)
    command = [python, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port())]
    if backend.startswith("trainer-"):
        command += [str(TRAINER_WORKER), "--framework", "ember" if api == "engine" else api,
                    "--backend", backend.removeprefix("trainer-")]
    else:
        command += [str(WORKER), "--api", api, "--backend", backend]
    command += ["--out", out, "--warmup", str(args.warmup), "--steps", str(args.steps)]
    if api == "engine" and args.engine_no_fsync and not backend.startswith("trainer-"):
        command.append("--no-fsync")
    if backend in ("fsdp2", "zero1", "zero2", "zero3", "tp") and (api, backend) != ("accelerate", "tp"):
        command += ["--save-rounds", str(args.save_rounds)]
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{api} {backend} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


def collectives(result: dict[str, Any]) -> str:
    counts = result["collectives_per_step"]
    return " + ".join(f"{value:g} {name}" for name, value in counts.items()) or "0"


def summary(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    """(median over rounds of each run's median, lowest, highest) of ``key`` (ms)."""
    values = [statistics.median(run[key]) if isinstance(run[key], list) else run[key] for run in runs]
    return statistics.median(values), min(values), max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor-python", default=os.environ.get("EMBER_ANCHOR_PYTHON", "/tmp/venv-anchor/bin/python"))
    parser.add_argument("--backends", default=",".join(PAIRS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-rounds", type=int, default=0)
    parser.add_argument("--engine-no-fsync", action="store_true",
                        help="Ember's runs skip fsync (what durability costs; the anchors fsync as they do)")
    args = parser.parse_args()
    if not os.path.exists(args.anchor_python):
        raise SystemExit(f"--anchor-python {args.anchor_python!r} does not exist: make a throwaway venv with "
                         "torch==2.13.0, then accelerate==1.15.*, deepspeed==0.19.8 and transformers.")
    backends = [b for b in args.backends.split(",") if b]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="ember-backends-") as folder:
        for round_ in range(args.rounds):
            for backend in backends:
                apis = ["engine", *PAIRS[backend]]
                for api in apis if round_ % 2 == 0 else reversed(apis):
                    runs.setdefault((backend, api), []).append(run_once(api, backend, args.anchor_python, folder,
                                                                        args))
                print(f"round {round_ + 1}/{args.rounds}: {backend} done", file=sys.stderr, flush=True)
    print(f"2 processes (gloo), {args.steps} timed steps after {args.warmup}, {args.rounds} interleaved rounds; "
          "ms per step: median over rounds [range]; ratio = anchor / Ember (>= 1.0: Ember no slower)\n")
    print("| backend | anchor | Ember ms | anchor ms | ratio | Ember collectives/step | anchor collectives/step "
          "| aten ops/step Ember / anchor | same loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for backend in backends:
        ours = runs[(backend, "engine")]
        mine, low, high = summary(ours, "ms")
        for anchor in PAIRS[backend]:
            theirs = runs[(backend, anchor)]
            median, a_low, a_high = summary(theirs, "ms")
            print(f"| {backend} | {anchor} | {mine:.1f} [{low:.1f}-{high:.1f}] | {median:.1f} [{a_low:.1f}-"
                  f"{a_high:.1f}] | {median / mine:.2f} | {collectives(ours[0])} | {collectives(theirs[0])} | "
                  f"{ours[0]['ops_per_step'] or '-'} / {theirs[0]['ops_per_step'] or '-'} | "
                  f"{ours[0]['last_loss'] == theirs[0]['last_loss']} |")
    if args.save_rounds:
        print("\n| backend | anchor | save Ember ms | anchor ms | ratio | load Ember ms | anchor ms | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for backend in backends:
            ours = runs[(backend, "engine")]
            for anchor in PAIRS[backend]:
                theirs = runs[(backend, anchor)]
                if not ours[0]["save_ms"] or not theirs[0]["save_ms"]:
                    continue
                cells = []
                for key in ("save_ms", "load_ms"):
                    mine, _, _ = summary(ours, key)
                    median, _, _ = summary(theirs, key)
                    cells.append(f"{mine:.0f} | {median:.0f} | {median / mine:.2f}")
                print(f"| {backend} | {anchor} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
