"""The fault fuzzer: kill a random rank at a random instant of a small job on each backend, resume, compare.

For each backend (``tests/faults/job.py``: one process, DDP, FSDP2, DeepSpeed ZeRO-2/3, tensor parallelism,
2-D data x tensor parallelism; each also with async checkpoint saves) the job first runs uninterrupted. Then each
trial picks a kill point (inside a checkpoint save, inside evaluation, between accumulation steps, at a training
batch), a rank, which arrival at that point and a delay of a few milliseconds; runs the job with that kill; checks
the checkpoint folder (every committed checkpoint folder and .ckpt file verifies, nothing half-written is
visible); resumes with
``ckpt_path="last"`` and compares the final weights with the uninterrupted run's, bit for bit. A trial fails when
the resume falls back past a damaged checkpoint, ends with other weights, a launch hangs (stacks are printed), or
a process of the killed run is still alive 10 s after its launcher returned (an orphan). It prints one table:
backend x kill point, trials / exact / failed, plus hangs and orphans.

    python -m tests.faults.fuzz                       # the long run: every backend, 3 trials per cell
    python -m tests.faults.fuzz --backends ddp tp --points save --trials 5 --seed 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

from engine.checkpoint.folders import TEMP_PREFIX, committed_checkpoints, read_manifest, verify_checksums
from tests.faults.job import BACKENDS, POINTS
from trainer.checkpoint import ckpt_file

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("job.py")
TAG = "EMBER_FUZZ_TAG"  # in every process of a launch (inherited), to find them all afterwards
ORPHAN_GRACE_S = 10.0
FALLBACK = "Falling back"  # what a resume says when the newest checkpoint does not verify (must never happen)
MAX_DELAY_MS = {"save": 150, "eval": 40, "accum": 20, "train": 40}


@dataclasses.dataclass
class Launch:
    """How one launch ended."""

    code: int | None  # None: it hung and was killed
    output: str
    orphans: int  # processes of the launch still alive ORPHAN_GRACE_S after its launcher returned


@dataclasses.dataclass
class Cell:
    trials: int = 0
    exact: int = 0
    failed: int = 0
    missed: int = 0  # the run ended before the kill fired (not counted as a trial)
    inside: int = 0  # kills that left a save half-written (a temporary folder): they struck inside a save
    hangs: int = 0
    orphans: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tagged(tag: str) -> list[int]:
    """The pids of live processes whose environment holds ``EMBER_FUZZ_TAG=tag``."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat") as stat:
                        if stat.read().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie is already dead
                            found.append(int(entry))
        except OSError:
            continue
    return found


def _signal_all(pids: list[int], number: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass


def launch(backend: str, folder: Path, *args: str, timeout: float = 300.0) -> Launch:
    """Run the job once (under torchrun for several processes); a hang prints every process's stacks."""
    tag = uuid.uuid4().hex
    nproc = BACKENDS[backend]
    command = [sys.executable, str(JOB), "--dir", str(folder), "--backend", backend, *args]
    if nproc > 1:
        command[1:1] = ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
                        "127.0.0.1", "--master-port", str(_port())]
    env = {**os.environ, TAG: tag, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    log = folder.parent / f"{folder.name}-{uuid.uuid4().hex[:6]}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code: int | None = process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
            _signal_all(tagged(tag), signal.SIGUSR1)  # faulthandler: every thread's stack into the log
            time.sleep(3)
            _signal_all(tagged(tag), signal.SIGKILL)
            process.wait()
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = tagged(tag)
    _signal_all(left, signal.SIGKILL)  # never let them disturb the next trial
    return Launch(code, log.read_text(errors="replace"), len(left))


def check_folder(folder: Path) -> str | None:
    """Why the checkpoint folder is not sound (a committed checkpoint that fails its checks), or None."""
    base = folder / "checkpoints"
    if not base.is_dir():
        return None
    for _, path in committed_checkpoints(str(base), auto_named=False):
        manifest = read_manifest(path)
        if manifest is None:
            return f"{path}: listed as committed without a manifest"
        try:
            verify_checksums(path, manifest)
        except Exception as error:  # noqa: BLE001 - any failure of the checks is the finding
            return f"{path}: {type(error).__name__}: {error}"
    for name in sorted(os.listdir(base)):  # .ckpt files (one process, DDP): complete, verified, or absent
        path = str(base / name)
        if name.startswith(".") or not os.path.isfile(path):
            continue  # a write in progress (hidden), or a folder checked above
        try:
            ckpt_file.read(path)
        except Exception as error:  # noqa: BLE001 - any failure of the checks is the finding
            return f"{path}: {type(error).__name__}: {error}"
    return None


def same_weights(a: Path, b: Path) -> bool:
    first, second = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    if first["global_step"] != second["global_step"] or first["weights"].keys() != second["weights"].keys():
        return False
    return all(torch.equal(first["weights"][k], second["weights"][k]) for k in first["weights"])


def reference(backend: str, work: Path, timeout: float) -> tuple[Path, dict[int, dict[str, int]]]:
    """The uninterrupted run: its final weights, and how often each rank reached each point."""
    folder = work / f"{backend}-reference"
    ran = launch(backend, folder, timeout=timeout)
    if ran.code != 0:
        raise RuntimeError(f"the uninterrupted {backend} run failed ({ran.code}):\n{ran.output[-4000:]}")
    counts = {rank: json.loads((folder / f"counts_{rank}.json").read_text()) for rank in range(BACKENDS[backend])}
    return folder / "final.pt", counts


def trial(backend: str, async_save: bool, point: str, counts: dict[int, dict[str, int]], expected: Path,
          folder: Path, rng: random.Random, cell: Cell, timeout: float, max_delay_ms: int | None = None) -> None:
    """One kill and its resume, counted in ``cell``; ``max_delay_ms`` bounds the delay after the point."""
    rank = rng.randrange(BACKENDS[backend])
    nth = rng.randint(1, max(1, counts[rank][point]))
    delay = rng.randint(0, MAX_DELAY_MS[point] if max_delay_ms is None else max_delay_ms)
    extra = ("--async-save",) if async_save else ()
    what = f"{point}:{rank}:{nth}:{delay}"
    killed = launch(backend, folder, *extra, "--kill", what, timeout=timeout)
    cell.orphans += killed.orphans
    if killed.code is None:
        cell.trials, cell.hangs, cell.failed = cell.trials + 1, cell.hangs + 1, cell.failed + 1
        cell.notes.append(f"{what}: the killed run hung\n{killed.output[-6000:]}")
        return
    if killed.code == 0:
        cell.missed += 1  # it finished before the kill fired: nothing to resume
        return
    cell.trials += 1
    base = folder / "checkpoints"
    # A temporary folder (.tmp-...), or a .ckpt file's temporary sibling (.{name}.tmp-...).
    cell.inside += base.is_dir() and any(name.startswith(TEMP_PREFIX) or (name.startswith(".") and ".tmp-" in name)
                                         for name in os.listdir(base))
    problem = check_folder(folder)
    resumed = launch(backend, folder, *extra, "--ckpt-path", "last", timeout=timeout) if problem is None else None
    if resumed is not None:
        cell.orphans += resumed.orphans
        if resumed.code is None:
            cell.hangs += 1
            problem = f"the resume hung\n{resumed.output[-6000:]}"
        elif resumed.code != 0:
            problem = f"the resume failed ({resumed.code})\n{resumed.output[-4000:]}"
        elif FALLBACK in resumed.output:
            problem = "the resume fell back past a damaged checkpoint"
        elif not same_weights(expected, folder / "final.pt"):
            problem = "the resumed run ended with other weights"
    if killed.orphans or (resumed is not None and resumed.orphans):
        problem = problem or f"{killed.orphans} orphan processes"
    if problem is None:
        cell.exact += 1
    else:
        cell.failed += 1
        cell.notes.append(f"{what}: {problem}")


def table(cells: dict[tuple[str, str], Cell], rows: list[str], points: list[str]) -> str:
    width = max(len(r) for r in rows) + 2
    head = "backend".ljust(width) + "".join(p.rjust(22) for p in points) + "   hangs  orphans"
    lines = [head, "-" * len(head)]
    for row in rows:
        line = row.ljust(width)
        for point in points:
            c = cells[row, point]
            line += f"{c.trials} tr {c.exact} ok {c.failed} bad{f' ({c.inside} in)' if point == 'save' else ''}" \
                .rjust(22)
        line += f"{sum(cells[row, p].hangs for p in points):8d}{sum(cells[row, p].orphans for p in points):9d}"
        lines.append(line)
    lines.append("(tr: trials where the kill fired; ok: resumed bitwise to the uninterrupted weights; bad: failed; "
                 "in: kills that left a save half-written)")
    return "\n".join(lines)


def fuzz(backends: list[str], points: list[str], trials: int, seed: int, async_modes: list[bool],
         work: Path, timeout: float = 300.0) -> dict[tuple[str, str], Cell]:
    """Run the trials; returns each (row, point) cell (rows: ``backend`` or ``backend+async``)."""
    rng = random.Random(seed)
    cells: dict[tuple[str, str], Cell] = {}
    for backend in backends:
        expected, counts = reference(backend, work, timeout)
        for async_save in async_modes:
            row = backend + ("+async" if async_save else "")
            for point in points:
                cell = cells[row, point] = Cell()
                attempts = 0
                while cell.trials < trials and attempts < 3 * trials:
                    attempts += 1
                    folder = work / f"{row}-{point}-{attempts}"
                    trial(backend, async_save, point, counts, expected, folder, rng, cell, timeout)
                    shutil.rmtree(folder, ignore_errors=True)
                print(f"{row:18s} {point:6s} trials {cell.trials} exact {cell.exact} failed {cell.failed} "
                      f"missed {cell.missed} inside a save {cell.inside} hangs {cell.hangs} orphans {cell.orphans}",
                      flush=True)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--points", nargs="+", default=list(POINTS), choices=list(POINTS))
    parser.add_argument("--trials", type=int, default=3, help="trials per cell (backend x kill point)")
    parser.add_argument("--sync-only", action="store_true", help="no async-save rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="a folder for the runs (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="ember-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = [b + s for b in args.backends for s in ([""] if args.sync_only else ["", "+async"])]
    cells = fuzz(args.backends, args.points, args.trials, args.seed, [False] if args.sync_only else [False, True],
                 work)
    print()
    print(table(cells, rows, args.points))
    print(f"{sum(c.trials for c in cells.values())} trials in {time.monotonic() - started:.0f} s")
    for (row, point), cell in cells.items():
        for note in cell.notes:
            print(f"\n--- {row} / {point}: {note}")
    sys.exit(1 if any(c.failed for c in cells.values()) else 0)


if __name__ == "__main__":
    main()
