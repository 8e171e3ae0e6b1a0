"""Train a small CNN on scikit-learn's handwritten digits with Ember's Trainer (what ``make demo`` runs).

    python examples/digits.py                      # ~20 s on 2 CPU cores, ~99% test accuracy
    python examples/digits.py --max-epochs 3       # shorter
    python examples/digits.py --fast-dev-run       # one batch of each stage, nothing written: a smoke test

The data (1,797 8x8 images) ships with scikit-learn: nothing is downloaded. The run validates every epoch, keeps
the two best checkpoints by validation accuracy plus the last one, stops early when the validation loss stops
improving, logs to csv and TensorBoard, tests the best checkpoint, and draws the loss and accuracy curves.

Each run gets its own flat folder, marked ``COMPLETED`` when it finishes::

    runs/digits/version_N/
        metrics.csv  config.json  curves.png  COMPLETED
        tensorboard/      (event files)
        checkpoints/      (the two best by val/acc and the last)

Running the same command again resumes the newest run from its last checkpoint if it was interrupted (Ctrl-C, a
kill, a crash), exactly where it stopped, or starts ``version_N+1`` if it completed. A run folder can be copied
or moved: resumed from its new place (``--project-dir``), it writes only into itself.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import DigitsCNN, digits_splits

from callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from trackers import CSVTracker, TensorBoardTracker
from trainer import Trainer, TrainModule

DONE = "COMPLETED"  # written into a run folder when the run has finished: the next run starts a new folder

Batch = tuple[torch.Tensor, torch.Tensor]


class DigitsClassifier(TrainModule):
    """The CNN from ``data.py`` with its training, validation and test steps."""

    def __init__(self, lr: float = 3e-3, weight_decay: float = 1e-4, width: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()  # goes to the trackers as the run's configuration
        self.net = DigitsCNN(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _loss_and_accuracy(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits, y), (logits.argmax(dim=1) == y).float().mean()

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss, acc = self._loss_and_accuracy(batch)
        self.log("train/loss", loss, prog_bar=True)  # per step (the default in training)
        self.log("train/acc", acc, on_step=False, on_epoch=True)  # the epoch's mean, weighted by batch size
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        loss, acc = self._loss_and_accuracy(batch)
        self.log("val/loss", loss)  # per epoch (the default outside training)
        self.log("val/acc", acc, prog_bar=True)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        loss, acc = self._loss_and_accuracy(batch)
        self.log("test/loss", loss)
        self.log("test/acc", acc)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        # Cosine decay over the whole run, stepped after every optimizer step.
        steps = int(self.trainer.estimated_stepping_batches)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def pick_run_dir(root: Path) -> tuple[Path, bool]:
    """The newest ``version_N`` under ``root`` if it did not complete and has a checkpoint (resume it), else a new
    one (a run stopped before its first checkpoint is left as it is: its logs belong to it)."""
    versions = sorted((int(p.name[8:]), p) for p in root.glob("version_*") if p.name[8:].isdigit())
    if versions:
        newest = versions[-1][1]
        checkpoints = newest / "checkpoints"  # .ckpt files (one process), or folders with a manifest
        if not (newest / DONE).exists() and (any(checkpoints.glob("[!.]*.ckpt")) or
                                             any(checkpoints.glob("*/manifest.json"))):
            return newest, True
    return root / f"version_{versions[-1][0] + 1 if versions else 0}", False


def plot_curves(metrics_csv: Path, out: Path) -> None:
    """Loss and accuracy against the optimizer step, read from the csv tracker's ``metrics.csv``."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    series: dict[str, tuple[list[int], list[float]]] = {}
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            for name, value in row.items():
                if value and name not in ("step", "epoch") and row["step"]:
                    steps, values = series.setdefault(name, ([], []))
                    steps.append(int(row["step"]))
                    values.append(float(value))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, kind in zip(axes, ("loss", "acc")):
        for name in ("train/" + kind, "train/" + kind + "_epoch", "val/" + kind):
            if name in series:
                ax.plot(*series[name], marker="o" if name.startswith("val") else None, label=name)
        ax.set_xlabel("optimizer step")
        ax.set_title("loss" if kind == "loss" else "accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project-dir", type=Path, default=Path("runs/digits"), help="holds the version_N runs")
    parser.add_argument("--max-epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--patience", type=int, default=4, help="epochs without a better val/loss before stopping")
    parser.add_argument("--fast-dev-run", action="store_true", help="one batch per stage, no logs or checkpoints")
    args = parser.parse_args(argv)
    started = time.monotonic()

    run_dir, resuming = pick_run_dir(args.project_dir)
    if args.fast_dev_run:
        print("Fast dev run: one batch of each stage; no logs or checkpoints are written")
    else:
        print(f"{'Resuming the interrupted run' if resuming else 'Starting a new run'} in {run_dir}")

    checkpoint = ModelCheckpoint(monitor="val/acc", mode="max", save_top_k=2, save_last=True,
                                 filename="epoch={epoch}-step={step}-{val/acc:.4f}")
    # A flat run folder: metrics.csv right in it, TensorBoard's events in tensorboard/, checkpoints in checkpoints/.
    trackers = [CSVTracker("", run_dir, version=""), TensorBoardTracker("tensorboard", run_dir)]
    trainer = Trainer(
        accelerator="cpu", max_epochs=args.max_epochs, seed=0, fast_dev_run=args.fast_dev_run,
        log_with=trackers, project_dir=str(run_dir), project_name="digits", log_every_n_steps=10,
        callbacks=[checkpoint, EarlyStopping(monitor="val/loss", mode="min", patience=args.patience),
                   LearningRateMonitor(logging_interval="step")])
    model = DigitsClassifier(lr=args.lr)  # after the Trainer: its seed=0 makes the initial weights reproducible

    train_set, val_set, test_set = digits_splits()
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    val_loader, test_loader = DataLoader(val_set, batch_size=256), DataLoader(test_set, batch_size=256)

    # "last": continue from the newest complete checkpoint in run_dir, or start fresh (it says which).
    trainer.fit(model, train_loader, val_loader, ckpt_path=None if args.fast_dev_run else "last")
    best = None if args.fast_dev_run else "best"  # test the weights with the best val/acc, not the last ones
    results = trainer.test(model, test_loader, ckpt_path=best)[0]
    trainer.accelerator.end_training()  # close the trackers (flushes TensorBoard's event file)
    seconds = time.monotonic() - started
    acc = trainer.accelerator
    # Under `ember launch --nproc-per-node N` every rank prints it: evaluation is exact across processes (each
    # test sample counted once), so the N lines agree.
    rank = f"[rank {acc.process_index}] " if acc.num_processes > 1 else ""
    print(f"\n{rank}Test accuracy {results['test/acc']:.2%} after {trainer.current_epoch} epochs, "
          f"{trainer.global_step} steps; wall time {seconds:.1f} s")
    if args.fast_dev_run or not acc.is_main_process:
        return results  # the files below belong to the main process, which runs the trackers

    metrics_csv = Path(trainer.accelerator.get_tracker("csv").metrics_path)
    curves = metrics_csv.parent / "curves.png"
    plot_curves(metrics_csv, curves)
    (run_dir / DONE).write_text(json.dumps({**results, "epochs": trainer.current_epoch, "seconds": seconds}) + "\n")
    print(f"""
Run folder:   {run_dir}  (finished: running this command again starts a new version)
Checkpoints:  {checkpoint.best_model_path}  (best val/acc {float(checkpoint.best_model_score):.4f})
              {checkpoint.last_model_path}  (last)
Metrics csv:  {metrics_csv}
Curves:       {curves}
TensorBoard:  tensorboard --logdir {args.project_dir}   (then open http://localhost:6006)""")
    return results


if __name__ == "__main__":
    main()
