"""Accelerate's ``examples/by_feature/early_stopping.py``, on a tiny model: one process decides to stop,
``set_trigger`` / ``check_trigger`` stop every process at the same step."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np
import torch

from engine import Accelerator
from engine.utils import set_seed
from tests.examples.accelerate_scripts.tiny import TinyClassifier, fingerprint, get_dataloaders


class EarlyStoppingCallback:
    """A callback class that helps with early stopping"""

    def __init__(self, min_delta: float = 0, patience: int = 5) -> None:
        self.min_delta = min_delta
        self.patience = patience
        self.counter = 0
        self.lowest_loss = float("inf")

    def check_early_stopping(self, loss: float) -> bool:
        delta = self.lowest_loss - loss
        if delta >= self.min_delta:
            self.lowest_loss = loss
            self.counter = 0
        else:
            self.counter += 1
            if self.counter > self.patience:
                return True
        return False


def training_function(config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    set_seed(config["seed"])
    train_dataloader, eval_dataloader = get_dataloaders(config["batch_size"])
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    # Each process sees its own losses: only process 1 (or 0 alone) runs out of patience here.
    callback = EarlyStoppingCallback(patience=config["patience"] if accelerator.process_index == \
                                     accelerator.num_processes - 1 else 10**6)
    stopped_at = None
    steps = 0
    for epoch in range(config["num_epochs"]):
        model.train()
        for step, (x, y) in enumerate(train_dataloader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            # New code
            # Check if we should stop the training on any processes
            if callback.check_early_stopping(loss.item()):
                accelerator.set_trigger()
            # If so, we break the loop
            if accelerator.check_trigger():
                stopped_at = [epoch, step]
                break
        if stopped_at is not None:
            break
    return {"stopped_at": stopped_at, "steps": steps, "np": float(np.random.rand()),
            **fingerprint(accelerator.unwrap_model(model))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args(argv)
    config = {"lr": 5e-2, "num_epochs": 20, "seed": 42, "batch_size": 4, "patience": 3}
    result = training_function(config, args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
