"""Every benchmark in one run, printed as one markdown table (what ``make bench`` runs; ~2-3 min on 2 CPU cores).

    python benchmarks/run_all.py             # the figures for the README
    python benchmarks/run_all.py --quick     # fewer rounds and a small checkpoint: a smoke test (~40 s)

Columns: a raw PyTorch loop, Ember's engine, Ember's trainer, and Hugging Face Accelerate / Lightning when they
are installed (they are not dependencies). Rows, each from the script named (run one alone for more detail):

* per-step time and its excess over raw (``step_overhead.py``, ``trainer_overhead.py``): a tiny MLP, batch 64,
  one thread, median of interleaved rounds; the trainers read batches through a ``DataLoader``, so their excess
  is over ``raw + DataLoader``;
* ``python -c "import X"`` wall time and peak resident memory (max RSS) of a process that runs 300 such steps;
* checkpoint save / load throughput (``checkpoint.py``): ``save_state`` / ``load_state`` against
  ``torch.save`` / ``torch.load`` of the same model and AdamW state (the trainer saves through the engine);
* resuming mid-epoch (``data_loader.py``): restoring a loader at batch 100,000 of a 1,000,000-sample shuffled
  epoch against iterating there, and a prepared loader's per-batch time against a raw ``DataLoader``.

Progress goes to stderr; the table alone goes to stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Only the loop factories at import: the memory rows run this file in fresh processes that must not carry the
# engine's modules in the raw loop's figure (the checkpoint and data-loader benchmarks import them).
from benchmarks import step_overhead, trainer_overhead

COLUMNS = ["raw", "engine", "trainer", "accelerate", "lightning"]
HEADERS = {"raw": "raw PyTorch", "engine": "Ember engine", "trainer": "Ember trainer", "accelerate": "Accelerate",
           "lightning": "Lightning"}
Row = tuple[str, dict[str, str]]


def installed(column: str) -> bool:
    return column not in ("accelerate", "lightning") or importlib.util.find_spec(column) is not None


def loop_factories() -> dict[str, Callable[[], Any]]:
    """One training loop per column (the same tiny MLP, SGD, batch 64), each built fresh."""
    factories: dict[str, Callable[[], Any]] = {"raw": step_overhead.make_raw, "engine": step_overhead.make_engine,
                                               "trainer": trainer_overhead.TrainerLoop}
    if installed("accelerate"):
        factories["accelerate"] = step_overhead.make_accelerate
    if installed("lightning"):
        factories["lightning"] = trainer_overhead.LightningLoop
    return factories


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the sections -----------------------------------------------------------------------------------------------
def step_rows(rounds: int, steps: int) -> list[Row]:
    variants = {**loop_factories(), "raw + DataLoader": trainer_overhead.RawLoaderLoop,
                "trainer, tracker every step": trainer_overhead.TRAINER_VARIANTS["trainer, tracker every step"]}
    threads = torch.get_num_threads()
    us, _cpu = step_overhead.measure(variants, rounds, steps)  # on one thread; wall medians
    torch.set_num_threads(threads)
    through_loader = ("trainer", "lightning")  # these loops read a DataLoader: compare with raw + DataLoader
    excess = {name: us[name] - us["raw + DataLoader" if name in through_loader else "raw"]
              for name in COLUMNS if name in us}
    per_step = {name: f"{us[name]:.1f}" for name in COLUMNS if name in us}
    per_step["raw"] += f" ({us['raw + DataLoader']:.1f} with a DataLoader)"
    return [
        ("per step, tiny MLP (µs)", per_step),
        ("per step over raw (µs) ¹", {name: f"{value:+.1f}" for name, value in excess.items()}),
        ("per step, csv tracker written every step (µs)", {"trainer": f"{us['trainer, tracker every step']:.1f}"}),
    ]


def import_rows(rounds: int) -> list[Row]:
    modules = {"raw": "torch", "engine": "engine", "trainer": "trainer", "accelerate": "accelerate",
               "lightning": "lightning"}
    modules = {column: module for column, module in modules.items() if installed(column)}
    seconds = trainer_overhead.import_times(list(modules.values()), rounds)
    by_column = {column: seconds[module] for column, module in modules.items()}
    return [
        ("`import` wall time (s)", {c: f"{s:.2f}" for c, s in by_column.items()}),
        ("`import` over `import torch` (s)", {c: f"{s - by_column['raw']:+.2f}" for c, s in by_column.items()}),
    ]


def peak_rss_mb(column: str, steps: int) -> float:
    """Max RSS of a fresh process that builds ``column``'s loop and runs ``steps`` steps."""
    done = subprocess.run([sys.executable, __file__, "--rss-child", column, "--steps", str(steps)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def memory_rows(steps: int) -> list[Row]:
    return [("peak RSS, process running 300 steps (MB)",
             {column: f"{peak_rss_mb(column, steps):.0f}" for column in loop_factories()})]


def checkpoint_rows(size_mb: int, rounds: int) -> list[Row]:
    from benchmarks import checkpoint

    times, mb = checkpoint.measure(size_mb, rounds)
    median = {name: statistics.median(samples) for name, samples in times.items()}

    def rate(name: str) -> str:
        return f"{mb['ember' if name.startswith('ember') else 'plain'] / median[name]:.0f}"

    size = f"{mb['ember']:.0f} MB"
    return [
        (f"checkpoint save, {size} (MB/s) ²", {"raw": f"{rate('torch.save (same file)')} overwrite · "
                                                      f"{rate('torch.save (new file)')} new file · "
                                                      f"{rate('torch.save + fsync')} + fsync",
                                               "engine": rate("ember save_state"), "trainer": "= engine"}),
        (f"checkpoint load, {size} (MB/s) ²", {"raw": rate("torch.load"), "engine": rate("ember load_state"),
                                               "trainer": "= engine"}),
    ]


def data_rows(rounds: int, batches: int) -> list[Row]:
    from benchmarks import data_loader

    one_process = data_loader.resume_cost(rounds)[0]
    overhead = data_loader.per_batch_overhead(rounds, batches)["TensorDataset (32 floats + label), batch 64"]
    skip_ms = (one_process["resumed"] - one_process["fresh"]) * 1e3
    return [
        ("resume at batch 100,000 of an epoch (ms) ³", {"raw": f"{one_process['walk'] * 1e3:.0f}",
                                                         "engine": f"{skip_ms:.1f}", "trainer": "= engine"}),
        ("data loader, per batch (µs)", {"raw": f"{overhead['raw DataLoader']:.1f}",
                                         "engine": f"{overhead['prepared']:.1f}"}),
    ]


# -- the table --------------------------------------------------------------------------------------------------
def table(rows: list[Row]) -> str:
    columns = [c for c in COLUMNS if installed(c)]
    lines = ["| | " + " | ".join(HEADERS[c] for c in columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(cells.get(c, "—") for c in columns) + " |" for label, cells in rows]
    return "\n".join(lines)


def notes(size_mb: int) -> str:
    return "\n".join([
        ("¹ The trainers read their batches through a `DataLoader`, so their excess is over the raw loop with a "
         "`DataLoader`; the engine's and Accelerate's are over the raw loop indexing a list of batches."),
        (f"² A {size_mb} MB model plus its AdamW state. Raw: `torch.save` / `torch.load(weights_only=True)`. "
         "Ember: temporary folder, fsync, checksummed manifest, atomic rename; loading verifies and applies."),
        ("³ Raw: iterating a loader to the position. Ember: `load_state_dict` of the saved position, then the "
         "first batch, minus a fresh loader's first batch."),
    ])


def rss_child(column: str, steps: int) -> None:
    """Run ``steps`` steps of one loop and print this process's peak RSS in MB."""
    torch.set_num_threads(1)
    step_overhead._run(loop_factories()[column](), steps)
    # Linux: VmHWM, this process image's own peak. ru_maxrss would do elsewhere, but on Linux it survives
    # fork + exec, so a child would report at least the parent's size at the fork.
    status = Path("/proc/self/status")
    if status.exists():
        kib = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
        print(kib / 2**10)
    else:
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)  # bytes on macOS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, a 20 MB checkpoint: a smoke test")
    parser.add_argument("--checkpoint-mb", type=int, default=None, help="model size (default 100, --quick 20)")
    parser.add_argument("--out", default=None,
                        help="also write the header and tables to this markdown file (the docs' benchmarks page "
                             "includes docs/snippets/benchmarks_overhead.md)")
    parser.add_argument("--rss-child", choices=COLUMNS, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=300, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child, args.steps)
        return

    quick = args.quick
    size_mb = args.checkpoint_mb or (20 if quick else 100)
    started = time.monotonic()
    rows: list[Row] = []
    sections: list[tuple[str, Callable[[], list[Row]]]] = [
        ("per-step overhead", lambda: step_rows(2 if quick else 15, 300)),
        ("import time", lambda: import_rows(3 if quick else 7)),
        ("peak memory", lambda: memory_rows(300)),
        ("checkpoint throughput", lambda: checkpoint_rows(size_mb, 2 if quick else 5)),
        ("data-loader resume", lambda: data_rows(2 if quick else 5, 300 if quick else 2000)),
    ]
    for name, section in sections:
        _log(f"[{time.monotonic() - started:5.0f} s] {name} ...")
        rows += section()
    _log(f"[{time.monotonic() - started:5.0f} s] done")
    report = (f"{measured_at()}: torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} "
              f"CPUs ({cpu_name()}){', --quick' if quick else ''}; medians of interleaved rounds.\n\n"
              f"{table(rows)}\n\n{notes(size_mb)}\n")
    print(report)
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")


def measured_at() -> str:
    """"Measured at commit abc1234 (+ local changes) on 2026-11-29": what the figures belong to."""
    def git(*words: str) -> str:
        return subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "(not a git checkout)"
    dirty = " (+ local changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"Measured at commit {commit}{dirty} on {time.strftime('%Y-%m-%d', time.gmtime())} by `make bench`"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
