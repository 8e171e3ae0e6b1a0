"""Accelerate's ``examples/by_feature/memory.py``, on a tiny model: ``find_executable_batch_size`` retries the
whole training function with smaller batches after an out-of-memory error (simulated above a size)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch

from engine import Accelerator
from engine.utils import find_executable_batch_size, set_seed
from tests.examples.accelerate_scripts.tiny import TinyClassifier, fingerprint, get_dataloaders


def training_function(config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=config["batch_size"])
    def inner_training_loop(batch_size: int) -> dict[str, Any]:
        # And now just move everything below under this function
        # We need to bring in the Accelerator object from earlier
        nonlocal accelerator
        # And reset all of its attributes that could hold onto any memory:
        accelerator.free_memory()
        tried.append(batch_size)
        set_seed(config["seed"])
        train_dataloader, eval_dataloader = get_dataloaders(batch_size)
        model = TinyClassifier()
        optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
        model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
            model, optimizer, train_dataloader, eval_dataloader)
        for epoch in range(config["num_epochs"]):
            model.train()
            for step, (x, y) in enumerate(train_dataloader):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                if len(x) > args.fits:  # what a too-large batch does on a GPU
                    raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {len(x)} GiB")
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        return fingerprint(accelerator.unwrap_model(model))

    result = inner_training_loop()
    return {"tried": tried, **result}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--fits", type=int, default=9, help="the largest batch that fits (simulated)")
    args = parser.parse_args(argv)
    config = {"lr": 2e-2, "num_epochs": 2, "seed": 42, "batch_size": 16}
    result = training_function(config, args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
