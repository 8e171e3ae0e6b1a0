"""The Accelerate quicktour loop on Ember's engine alone: a custom training loop on the scikit-learn digits.

    python examples/engine_loop.py                              # one process
    ember launch --nproc-per-node 2 --cpu examples/engine_loop.py  # two processes (gloo)

It prepares the model, optimizer, loaders and scheduler, accumulates gradients, evaluates with
``gather_for_metrics`` (exact counts, no duplicated samples), logs to csv, and saves a checkpoint each epoch.
Run it again with the same ``--project-dir`` and it resumes from the newest checkpoint, mid-epoch if it was
killed mid-epoch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import DigitsCNN, digits_splits

from engine import Accelerator, ProjectConfiguration, set_seed


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project-dir", default="runs/engine_loop")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many batches (for tests)")
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "fp16"])
    args = parser.parse_args(argv)

    set_seed(0)
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision, gradient_accumulation_steps=2, log_with="csv",
        project_config=ProjectConfiguration(project_dir=args.project_dir, automatic_checkpoint_naming=True,
                                            total_limit=2))
    train_set, val_set, _ = digits_splits()
    model = DigitsCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=64)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train_loader))
    model, optimizer, train_loader, val_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, val_loader, scheduler)

    checkpoints = Path(args.project_dir) / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        accelerator.load_state()  # newest committed checkpoint: weights, optimizer, RNG, loader position
        accelerator.print(f"resumed from {checkpoints} at epoch {train_loader.iteration}")
    accelerator.init_trackers("engine_loop", config={"lr": 2e-3, "batch_size": 32, "epochs": args.epochs})

    accuracy, step = 0.0, 0
    for epoch in range(train_loader.iteration, args.epochs):
        model.train()
        for x, y in train_loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            step += 1
            if args.max_steps is not None and step >= args.max_steps:
                break
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in val_loader:
                predictions, targets = accelerator.gather_for_metrics((model(x).argmax(dim=1), y))
                correct += int((predictions == targets).sum())
                total += len(targets)
        accuracy = correct / total
        accelerator.log({"val/accuracy": accuracy, "train/loss": loss.item()}, step=epoch)
        accelerator.print(f"epoch {epoch}: val accuracy {accuracy:.4f} on {total} samples")
        accelerator.save_state()
        if args.max_steps is not None and step >= args.max_steps:
            break
    accelerator.end_training()
    return accuracy


if __name__ == "__main__":
    main()
