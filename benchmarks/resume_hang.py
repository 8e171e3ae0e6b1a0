"""Reproduce the rare hang of a 2-process resume (issue 39, item 2) under CPU load, and count it.

Each run is the resume test's scenario: a 2-rank torchrun job of ``tests/trainer/resume_script.py`` (shuffled data
read by 2 forked loader workers per rank, DDP over gloo, a checkpoint every step) is frozen and SIGKILLed at its
3rd micro-batch, then resumed with ``--ckpt-path last`` and run to the end under a per-run timeout. A resumed run
that does not finish in time counts as a hang: the native and Python stacks of every process in it (ranks and
loader workers) are written to ``{out}/hang_{n}.txt`` (gdb, then faulthandler on SIGUSR1) before it is killed.
``--load K`` keeps K busy-loop processes on the CPUs meanwhile, which is what makes the hang show.

    python benchmarks/resume_hang.py --runs 40 --load 3 [--fsdp] [--epochs 3] [--out /tmp/hangs]

Prints one line per run and a summary: ``runs N, hangs H, finished F, failed X``.

The hang's cause was found with benchmarks/fork_hang.py, which makes its instant common (CPython gh-112275 met by
gloo's threads: engine/data/worker_start.py); this whole-job reproduction rarely hits it (0 in 190 runs here),
and with the fork guard a hit costs a worker restart, not a hang.
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "trainer", "resume_script.py")


def _spin() -> None:
    while True:
        pass


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun's ranks and their loader workers), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stacks(pids: list[int]) -> str:
    """Native stacks of every thread of each process (gdb), the Python ones go to the run's stderr (SIGUSR1)."""
    parts = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            continue
        native = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                                capture_output=True, text=True, timeout=120, check=False).stdout
        parts.append(f"===== pid {pid}: {cmdline}\n{native}")
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(2.0)
    return "\n".join(parts)


def _launch(directory: str, args: list[str], timeout: float, log: str) -> tuple[str, list[int]]:
    """Run the script under torchrun until it ends, rank 0 is ``ready`` (then SIGKILL all: "killed") or the
    timeout passes ("hang": the process ids are returned alive, for their stacks)."""
    for stale in glob.glob(os.path.join(directory, "pid_*")) + glob.glob(os.path.join(directory, "ready")):
        os.remove(stale)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(port), SCRIPT, "--dir", directory, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    with open(log, "a") as output:
        process = subprocess.Popen(command, start_new_session=True, env=env, stdout=output, stderr=output)
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        if os.path.exists(os.path.join(directory, "ready")):
            _kill(process)
            return "killed", []
        if time.monotonic() > deadline:
            return "hang", [process.pid, *_descendants(process.pid)]
        time.sleep(0.05)
    return ("ok" if process.returncode == 0 else f"exit {process.returncode}"), []


def _kill(process: subprocess.Popen) -> None:
    for pid in [process.pid, *_descendants(process.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", type=int, default=3, help="busy-loop processes kept running meanwhile")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a resumed run may take")
    parser.add_argument("--fsdp", action="store_true", help="the FSDP2 variant")
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs the resumed run trains (each starts fresh loader workers on every rank)")
    parser.add_argument("--out", default=None, help="where hang stacks and logs go (default: a temp folder)")
    parser.add_argument("--sequence", choices=("once", "test"), default="once",
                        help="once: kill at micro-batch 3, resume to the end; test: the suite's sequence "
                             "(tests/distributed/test_trainer_resume.py): kill at 3, resume and kill at 9 "
                             "(mid-epoch 1), resume and kill at the end of epoch 1, resume to the end")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="resume_hang_")
    os.makedirs(out, exist_ok=True)
    spinners = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(args.load)]
    for spinner in spinners:
        spinner.start()
    extra = ["--fsdp"] if args.fsdp else []
    hangs = finished = failed = 0
    start = time.monotonic()
    try:
        for run in range(args.runs):
            directory = tempfile.mkdtemp(prefix="run_", dir=out)
            log = os.path.join(directory, "log.txt")
            t0 = time.monotonic()
            epochs = ["--max-epochs", str(args.epochs)]
            first, _ = _launch(directory, ["--kill-at", "3", *epochs, *extra], args.timeout, log)
            second, pids = "ok", []
            middle = ([["--kill-at", "9"], ["--kill-at-epoch-end", "1"]] if args.sequence == "test" else [])
            for kill in middle:  # each must be killed at its point; a hang or failure ends the run
                second, pids = _launch(directory, ["--ckpt-path", "last", *kill, *epochs, *extra], args.timeout, log)
                if second != "killed":
                    break
            if second == "killed" or not middle:
                second, pids = _launch(directory, ["--ckpt-path", "last", *epochs, *extra], args.timeout, log)
            if second == "hang":
                hangs += 1
                stacks = _stacks(pids)
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(1.0)
                with open(os.path.join(out, f"hang_{run}.txt"), "w") as handle:
                    handle.write(stacks)
                    with open(log) as logged:
                        handle.write("\n===== log (Python stacks at the end)\n" + logged.read())
            elif second == "ok" and first == "killed":
                finished += 1
                shutil.rmtree(directory, ignore_errors=True)
            else:
                failed += 1
            print(f"run {run}: first {first}, resumed {second}, {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
    print(f"runs {args.runs}, hangs {hangs}, finished {finished}, failed {failed} "
          f"({time.monotonic() - start:.0f} s, load {args.load}, {'fsdp' if args.fsdp else 'ddp'}; out {out})")


if __name__ == "__main__":
    main()
