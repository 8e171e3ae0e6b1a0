"""Generate the documentation's pictures from real runs: ``python docs/gen/figures.py [OUT]`` (default build/docs).

* ``demo_run_tree.txt`` and ``figures/curves.png``: ``examples/digits.py --max-epochs 3`` (what ``make demo``
  runs, shortened) in ``OUT/demo_runs``; the tree of its run folder and the loss / accuracy curves it drew.
* ``hook_timeline.txt`` and ``figures/hook_timeline.png``: a 2-epoch ``fit`` (4 batches an epoch, accumulation 2,
  2 validation batches) with a callback that records every hook call, in order.

Nothing here is committed: ``make docs`` runs this script before ``mkdocs build``, and ``docs/gen/hooks.py`` runs
it when its output is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "build" / "docs"
EPOCHS = 3


def run_demo(out: Path) -> Path:
    """The digits demo, shortened to ``EPOCHS`` epochs, in a fresh folder; returns its run folder."""
    runs = out / "demo_runs"
    shutil.rmtree(runs, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "digits.py"), "--max-epochs", str(EPOCHS),
                           "--project-dir", str(runs)], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the digits demo failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-4000:]}")
    (out / "demo_output.txt").write_text(done.stdout, encoding="utf-8")
    return runs / "version_0"


def _size(path: Path) -> str:
    size = float(path.stat().st_size)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def tree(folder: Path, prefix: str = "") -> list[str]:
    """``folder`` drawn as ``tree`` does, files with their sizes (directories first, then files, by name)."""
    entries = sorted(folder.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    lines: list[str] = []
    for i, entry in enumerate(entries):
        last = i == len(entries) - 1
        branch, extend = ("└── ", "    ") if last else ("├── ", "│   ")
        if entry.is_dir():
            lines.append(f"{prefix}{branch}{entry.name}/")
            lines += tree(entry, prefix + extend)
        else:
            lines.append(f"{prefix}{branch}{entry.name}  ({_size(entry)})")
    return lines


def record_hooks() -> list[tuple[str, int, int]]:
    """Every hook call of a small ``fit`` as ``(hook, epoch, global_step)``, in order."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks.base import HOOK_NAMES, Callback
    from trainer import Trainer, TrainModule

    calls: list[tuple[str, int, int]] = []

    def recorder(name: str) -> Any:
        def hook(self: Any, trainer: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            calls.append((name, trainer.current_epoch, trainer.global_step))
        return hook

    skipped = {"on_exception", "on_save_checkpoint", "on_load_checkpoint"}  # none fire in this run
    Recorder = type("Recorder", (Callback,), {name: recorder(name) for name in HOOK_NAMES if name not in skipped})

    class Tiny(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=2, num_sanity_val_steps=1, log_with=[],
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[Recorder()])
    trainer.fit(Tiny(), DataLoader(data, batch_size=2), DataLoader(data, batch_size=4))
    return calls


LANES = ("setup", "on_fit_start", "on_sanity_check_start", "on_train_start", "on_train_epoch_start",
         "on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
         "on_before_optimizer_step", "on_train_batch_end", "on_validation_start", "on_validation_epoch_start",
         "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end",
         "on_sanity_check_end", "on_train_epoch_end", "on_train_end", "on_fit_end", "teardown")


def draw_timeline(calls: list[tuple[str, int, int]], path: Path) -> None:
    """One row per hook, one column per call: where each hook fires in the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = [lane for lane in LANES if any(name == lane for name, _, _ in calls)]
    lanes += sorted({name for name, _, _ in calls} - set(lanes))
    row = {name: i for i, name in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(13, 0.32 * len(lanes) + 1.6))
    # Shade each stretch of the run: the sanity check, each training epoch, each validation pass inside it.
    kinds = {"sanity_check": ("sanity check", "#fde0c5"), "train_epoch": ("epoch {epoch}", "#e5f5e0"),
             "validation": ("validation", "#c6dbef")}
    opened: dict[str, int] = {}
    for i, (name, epoch, _) in enumerate(calls):
        for kind, (label, colour) in kinds.items():
            if name == f"on_{kind}_start":
                opened[kind] = i
            elif name == f"on_{kind}_end" and kind in opened:
                start = opened.pop(kind)
                if kind == "validation" and "sanity_check" in opened:
                    continue  # the sanity check's own validation pass: its span is the sanity check's
                inner = kind == "validation"
                ax.axvspan(start - 0.45, i + 0.45, ymin=0.0, ymax=0.93 if inner else 1.0, color=colour,
                           zorder=0.5 if inner else 0)
                ax.text((start + i) / 2, -0.75 if inner else -1.25, label.format(epoch=epoch), ha="center",
                        va="bottom", fontsize=8)
    xs = list(range(len(calls)))
    ys = [row[name] for name, _, _ in calls]
    ax.plot(xs, ys, color="#bbbbbb", linewidth=0.6, zorder=1)
    ax.scatter(xs, ys, s=18, color="#d9480f", zorder=2)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8, family="monospace")
    ax.set_ylim(len(lanes) - 0.5, -1.6)
    ax.set_xlim(-1, len(calls))
    ax.set_xlabel("call number (Trainer(max_epochs=2, accumulate_grad_batches=2): 4 training batches an epoch, "
                  "validation after each epoch, a 1-batch sanity check)", fontsize=8)
    ax.grid(axis="y", alpha=0.25)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timeline_text(calls: list[tuple[str, int, int]]) -> str:
    depth = 0
    lines = []
    for name, epoch, step in calls:
        if name.endswith("_end") and not name.endswith("batch_end") or name == "teardown":
            depth = max(0, depth - 1)
        lines.append(f"{'    ' * depth + name:<52} epoch={epoch}  global_step={step}")
        if (name.endswith("_start") and not name.endswith("batch_start")) or name == "setup":
            depth += 1
    return "\n".join(lines) + "\n"


def main(out: Path = DEFAULT_OUT) -> None:
    started = time.monotonic()
    (out / "figures").mkdir(parents=True, exist_ok=True)
    run = run_demo(out)
    (out / "demo_run_tree.txt").write_text("\n".join([f"{run.parent.name}/{run.name}/", *tree(run)]) + "\n",
                                           encoding="utf-8")
    shutil.copyfile(run / "curves.png", out / "figures" / "curves.png")
    calls = record_hooks()
    (out / "hook_timeline.txt").write_text(timeline_text(calls), encoding="utf-8")
    draw_timeline(calls, out / "figures" / "hook_timeline.png")
    print(f"docs figures written to {out} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
