"""Checkpoint wall time, Ember's ``save_state`` / ``load_state`` against Accelerate's, on the same state.

The state: a ~200 MB model (``--size-mb``; Linear(2048, 2048) layers, seed 0) and its AdamW state after one step
on a fixed batch, so ~600 MB in all; both columns build it with the same code and seed, so they save the very
same tensors. Ember runs in this process; Accelerate runs in a worker subprocess (``--python``, default: this
interpreter if it can import accelerate, else ``/work/venvs/acc/bin/python``) that waits for commands on stdin, so
the two are timed interleaved, round by round, on the same machine state (the order alternates each round, and
``os.sync()`` runs untimed before every timed operation so none pays for another's write-back).

Each save writes a new folder (the previous one is deleted untimed); each load reads the folder just saved and
applies it to the model and optimizer. Each "resume" does the same in a new process that has just built the model
and optimizer (what resuming a killed run does: its memory allocator has no freed memory to reuse yet); only the
``load_state`` call is timed. Ember does more: it fsyncs every file, writes a checksummed manifest and
commits by an atomic rename, and verifies the checksums when loading; Accelerate does none of that. So each save
is also timed until its files are on disk ("save, durable": the save plus an ``os.sync()`` right after it),
which is what Accelerate's save would need for the same promise; Ember's fsyncs leave that sync little to do.
Printed:
medians (and ranges) of ``--rounds`` rounds and the ratio Accelerate time / Ember time (>= 1.0: Ember is not
slower), from the medians and from the best rounds.

Run: ``python benchmarks/checkpoint_vs_accelerate.py [--size-mb 200 --rounds 3 --dir PATH]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_PYTHON = "/work/venvs/acc/bin/python"  # a throwaway venv: torch==2.13.0 first, then accelerate
WIDTH = 2048


def build_state(size_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The benchmark's model and AdamW optimizer after one step (identical in both interpreters)."""
    torch.manual_seed(0)
    layers = max(1, round(size_mb * 2**20 / (4 * WIDTH * WIDTH)))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, WIDTH)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def _prepared(accelerator_cls: Any, size_mb: int) -> Any:
    model, optimizer = build_state(size_mb)
    accelerator = accelerator_cls(cpu=True)
    accelerator.prepare(model, optimizer)
    return accelerator


def resume_worker(size_mb: int, folder: str, accelerate: bool) -> None:
    """A fresh process: build the state, then time one ``load_state(folder)``; prints the seconds as JSON."""
    if accelerate:
        from accelerate import Accelerator  # type: ignore[import-not-found]
    else:
        sys.path.insert(0, str(ROOT))
        from engine import Accelerator
    accelerator = _prepared(Accelerator, size_mb)
    os.sync()
    start = time.perf_counter()
    accelerator.load_state(folder)
    print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


def _resume(python: str, size_mb: int, folder: str, accelerate: bool) -> float:
    command = [python, __file__, "--resume-from", folder, "--size-mb", str(size_mb)]
    done = subprocess.run(command + (["--accelerate"] if accelerate else []), capture_output=True, text=True,
                          cwd=str(ROOT), check=True, timeout=300)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def worker(size_mb: int) -> None:
    """Accelerate's side: answer ``save DIR`` / ``load DIR`` lines on stdin with the seconds taken."""
    from accelerate import Accelerator  # type: ignore[import-not-found]

    accelerator = _prepared(Accelerator, size_mb)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        verb, folder = line.split(maxsplit=1)
        folder = folder.strip()
        os.sync()
        start = time.perf_counter()
        if verb == "save":
            accelerator.save_state(folder)
        else:
            accelerator.load_state(folder)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "durable": seconds + _sync_seconds()}), flush=True)


class AccelerateColumn:
    """The worker subprocess, driven one command at a time."""

    def __init__(self, python: str, size_mb: int) -> None:
        self._proc = subprocess.Popen([python, __file__, "--worker", "--size-mb", str(size_mb)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        assert json.loads(self._ask(None))["ready"]

    def _ask(self, command: str | None) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        if command is not None:
            self._proc.stdin.write(command + "\n")
            self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Accelerate worker exited with code {self._proc.wait()}")
        return line

    def run(self, verb: str, folder: str) -> tuple[float, float]:
        """Seconds of ``verb``, and seconds until its files are on disk (plus an ``os.sync()`` right after)."""
        answer = json.loads(self._ask(f"{verb} {folder}"))
        return float(answer["seconds"]), float(answer["durable"])

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)


def _sync_seconds() -> float:
    start = time.perf_counter()
    os.sync()
    return time.perf_counter() - start


def _timed(fn: Any) -> tuple[float, float]:
    """Seconds of ``fn()``, and the same plus an ``os.sync()`` right after (what it takes to be on disk)."""
    os.sync()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    return seconds, seconds + _sync_seconds()


def reference_python() -> str | None:
    if importlib.util.find_spec("accelerate") is not None:
        return sys.executable
    return REFERENCE_PYTHON if os.path.exists(REFERENCE_PYTHON) else None


def measure(size_mb: int, rounds: int, directory: str | None, python: str | None) -> dict[str, list[float]]:
    sys.path.insert(0, str(ROOT))
    from engine import Accelerator

    workdir = tempfile.mkdtemp(prefix=".bench-vs-accelerate-", dir=directory or os.getcwd())
    ember = _prepared(Accelerator, size_mb)
    other = AccelerateColumn(python, size_mb) if python else None
    times: dict[str, list[float]] = {f"{who} {what}": [] for who in ("ember", "accelerate")
                                     for what in ("save", "save, durable", "load", "resume")}
    try:
        for round_ in range(rounds):
            folders = {name: os.path.join(workdir, f"{name}_{round_}") for name in ("ember", "accelerate")}
            order = ["ember", "accelerate"] if round_ % 2 == 0 else ["accelerate", "ember"]
            for verb in ("save", "load"):
                for who in order:
                    if who == "ember":
                        fn = ember.save_state if verb == "save" else ember.load_state
                        seconds, durable = _timed(partial(fn, folders["ember"]))
                    elif other is not None:
                        seconds, durable = other.run(verb, folders["accelerate"])
                    else:
                        continue
                    times[f"{who} {verb}"].append(seconds)
                    if verb == "save":
                        times[f"{who} save, durable"].append(durable)
            for who in order:
                if who == "ember" or python is not None:
                    interpreter = sys.executable if who == "ember" else str(python)
                    times[f"{who} resume"].append(_resume(interpreter, size_mb, folders[who], who == "accelerate"))
            for folder in folders.values():
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if other is not None:
            other.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200, help="model size in MB (AdamW state adds twice that)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder under the cwd)")
    parser.add_argument("--python", default=None, help="an interpreter with accelerate installed")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resume-from", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--accelerate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.size_mb)
        return
    if args.resume_from:
        resume_worker(args.size_mb, args.resume_from, args.accelerate)
        return
    python = args.python or reference_python()
    times = measure(args.size_mb, args.rounds, args.dir, python)
    print(f"checkpoint vs Accelerate: model {args.size_mb} MB + AdamW state, {args.rounds} rounds interleaved, "
          f"medians, torch {torch.__version__}, {os.cpu_count()} CPUs"
          + ("" if python else " (Accelerate not found: its column is empty)"))
    median = {name: statistics.median(v) for name, v in times.items() if v}
    for name, samples in times.items():
        if samples:
            print(f"  {name:<25} {median[name]:7.3f} s  ({min(samples):.3f}-{max(samples):.3f})")
    best = {name: min(v) for name, v in times.items() if v}
    for verb in ("save", "save, durable", "load", "resume"):
        if f"accelerate {verb}" in median:
            # On a shared machine noise only ever adds time: the best rounds are the second opinion. The two
            # columns of a round run back to back, so their ratio cancels the slow drifts of a shared machine.
            paired = sorted(a / e for a, e in zip(times[f"accelerate {verb}"], times[f"ember {verb}"]))
            print(f"  {verb}: Accelerate / Ember = {median[f'accelerate {verb}'] / median[f'ember {verb}']:.2f}x "
                  f"from medians, {best[f'accelerate {verb}'] / best[f'ember {verb}']:.2f}x from the best rounds, "
                  f"{statistics.median(paired):.2f}x median of the rounds' ratios ({paired[0]:.2f}-{paired[-1]:.2f})"
                  " (>= 1.0: Ember is at least as fast)")


if __name__ == "__main__":
    main()
