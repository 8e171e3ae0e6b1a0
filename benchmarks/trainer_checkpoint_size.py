"""Size and save time of a trainer checkpoint at a window's end (one process): before and after dropping spent
gradients, and the ``.ckpt`` file against the folder layout.

A Trainer fits a module of ``--size-mb`` MB of weights (Linear layers, AdamW) for one epoch, then each round
saves, in turn (interleaved, ``os.sync()`` untimed before each):

* ``folder + gradients``: the layout before: ``accelerator.save_state(path, include_gradients=True)``, the
  trainer's entry included (what ``trainer.save_checkpoint`` wrote, with a gradients file per rank);
* ``folder``: the same folder without the spent gradients (what an asynchronous save writes now);
* ``.ckpt file``: ``trainer.save_checkpoint(path)`` now: one file, Lightning's keys, no spent gradients.

Prints each one's size and median save time (figures, not a test).
Run: ``python benchmarks/trainer_checkpoint_size.py [--size-mb 64 --rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer import Trainer, TrainModule  # after the path above


class Wide(TrainModule):
    def __init__(self, layers: int, width: int = 1024) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.body(batch[0]).square().mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def _bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, n)) for root, _, names in os.walk(path) for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    layers = max(1, args.size_mb // 4)  # a 1024 x 1024 Linear is 4 MB of float32 weights
    with tempfile.TemporaryDirectory(dir=os.getcwd(), prefix=".bench_ckpt_") as work:
        trainer = Trainer(max_epochs=1, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                          enable_checkpointing=False, project_dir=work)
        x = torch.randn(8, 1024)
        trainer.fit(Wide(layers), DataLoader(TensorDataset(x), batch_size=4))
        kinds: dict[str, Callable[[str], object]] = {
            "folder + gradients (before)": lambda p: trainer.accelerator.save_state(p, include_gradients=True),
            "folder, no spent gradients": lambda p: trainer.accelerator.save_state(p, include_gradients=False),
            ".ckpt file (after)": lambda p: trainer.save_checkpoint(p),
        }
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        sizes: dict[str, int] = {}
        for round_ in range(args.rounds):
            for i, (kind, save) in enumerate(kinds.items()):
                path = os.path.join(work, f"r{round_}-{i}.ckpt")
                os.sync()
                start = time.perf_counter()
                save(path)
                times[kind].append(time.perf_counter() - start)
                sizes[kind] = _bytes(path)
        print(f"trainer checkpoint of {layers} x Linear(1024, 1024) + AdamW, one process, at a window's end, "
              f"{args.rounds} rounds (torch {torch.__version__}):")
        for kind in kinds:
            print(f"  {kind:30s} {sizes[kind] / 2**20:8.1f} MiB   save {statistics.median(times[kind]) * 1e3:8.1f} ms "
                  f"(median; best {min(times[kind]) * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
