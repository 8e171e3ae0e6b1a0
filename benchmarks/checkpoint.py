"""Checkpoint throughput: ``save_state`` / ``load_state`` against plain ``torch.save`` / ``torch.load``.

A ~200 MB model (a few big Linear layers) plus its AdamW state after one step (``exp_avg`` and ``exp_avg_sq``,
so ~600 MB in all). Each round, interleaved so machine noise hits both alike, times:

* plain save: ``torch.save({"model": ..., "optimizer": ...}, path)`` (no fsync: a crash may lose or tear it);
* Ember save: ``accelerator.save_state(folder)`` (temp folder, fsync of every file, CRC-32 manifest, atomic
  rename);
* plain load: ``torch.load(path, weights_only=True)`` (tensors read, not applied to anything);
* Ember load: ``accelerator.load_state(folder)`` (sizes and checksums verified, tensors read and loaded into
  the model and optimizer).

Both write to and read from the same directory (``--dir``, default: a temporary folder under the current
directory, so the same disk as the project), so both reads come from the page cache; ``os.sync()`` runs
(untimed) before every timed operation so none pays for another's write-back. ``save_state`` uses automatic
naming with ``total_limit=1`` (a new folder per save, the previous one pruned), so plain ``torch.save`` is timed
both overwriting one file and writing a new file per save (deleting the previous one). Also printed, for
context: ``torch.save`` followed by an fsync. The figures are medians; "ratio" is Ember's throughput over plain
torch's (goal: at least 0.8), from medians and from the best rounds.
Run: ``python benchmarks/checkpoint.py [--size-mb 200 --rounds 5 --dir PATH]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _folder_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build(size_mb: int, project_dir: str) -> tuple[object, torch.nn.Module, torch.optim.Optimizer]:
    """An Accelerator with a ~``size_mb`` MB model and AdamW state after one step, saving under ``project_dir``."""
    from engine import Accelerator, ProjectConfiguration

    width = 2048
    layers = max(1, round(size_mb * 2**20 / (4 * width * width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=1)
    accelerator = Accelerator(cpu=True, project_config=config)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(4, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    return accelerator, model, optimizer


def measure(size_mb: int, rounds: int, directory: str | None = None
            ) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds per round of each operation (by name, see the module docstring), and checkpoint sizes in MB
    (``"plain"``: the ``torch.save`` file, ``"ember"``: the ``save_state`` folder)."""
    workdir = tempfile.mkdtemp(prefix=".bench-checkpoint-", dir=directory or os.getcwd())
    accelerator, model, optimizer = build(size_mb, workdir)
    plain = os.path.join(workdir, "plain.pt")
    counter = iter(range(10**9))
    saved: list[str] = []

    def state() -> dict[str, object]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def plain_save_new() -> None:
        # A new file per checkpoint, the previous one deleted afterwards: what save_state does, minus safety.
        n = next(counter)
        torch.save(state(), f"{plain}.{n}")
        if os.path.exists(f"{plain}.{n - 1}"):
            os.unlink(f"{plain}.{n - 1}")

    def plain_save_fsync() -> None:
        torch.save(state(), plain)
        _fsync(plain)

    ops: dict[str, Callable[[], object]] = {
        "torch.save (same file)": lambda: torch.save(state(), plain),
        "torch.save (new file)": plain_save_new,
        "torch.save + fsync": plain_save_fsync,
        "ember save_state": lambda: saved.append(accelerator.save_state()),
        "torch.load": lambda: torch.load(plain, weights_only=True),
        "ember load_state": accelerator.load_state,
    }
    times: dict[str, list[float]] = {name: [] for name in ops}
    try:
        for _ in range(rounds):
            for name, op in ops.items():
                # Start every timed operation with no dirty pages pending, so none pays for another's write-back.
                os.sync()
                times[name].append(_timed(op))
        sizes = {"plain": _folder_bytes(plain), "ember": _folder_bytes(saved[-1])}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return times, {kind: size / 2**20 for kind, size in sizes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200, help="model size in MB (AdamW state adds twice that)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder under the cwd)")
    args = parser.parse_args()
    times, mb = measure(args.size_mb, args.rounds, args.dir)
    median = {name: statistics.median(samples) for name, samples in times.items()}
    print(f"checkpoint: {mb['ember']:.0f} MB (model {args.size_mb} MB + AdamW state), {args.rounds} rounds, "
          f"medians, torch {torch.__version__}, {os.cpu_count()} CPUs")
    for name, seconds in median.items():
        size = mb["ember" if name.startswith("ember") else "plain"]
        spread = f"{min(times[name]):.2f}-{max(times[name]):.2f}"
        print(f"  {name:<24} {seconds:7.3f} s ({spread})  {size / seconds:7.0f} MB/s")

    def ratio(ours: str, theirs: str, pick: Callable[[list[float]], float]) -> str:
        return f"{(mb['ember'] / pick(times[ours])) / (mb['plain'] / pick(times[theirs])):.2f}"

    # Medians are the headline; on a shared machine the best rounds (noise only ever adds time) say more.
    for label, pick in (("median", statistics.median), ("best", min)):
        print(f"  {label:>6} ratios (ember / torch throughput, goal >= 0.8): "
              f"save vs same file {ratio('ember save_state', 'torch.save (same file)', pick)}, "
              f"vs new file {ratio('ember save_state', 'torch.save (new file)', pick)}; "
              f"load {ratio('ember load_state', 'torch.load', pick)}")


if __name__ == "__main__":
    main()
