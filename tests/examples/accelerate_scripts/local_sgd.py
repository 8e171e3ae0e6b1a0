"""Accelerate's ``examples/by_feature/local_sgd.py``, on a tiny model: weights averaged every few steps,
gradients not synchronised in between."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch

from engine import Accelerator
from engine.local_sgd import LocalSGD
from engine.utils import set_seed
from tests.examples.accelerate_scripts.tiny import TinyClassifier, fingerprint, get_dataloaders


def training_function(config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision,
                              gradient_accumulation_steps=args.gradient_accumulation_steps)
    local_sgd_steps = args.local_sgd_steps
    set_seed(config["seed"])
    train_dataloader, eval_dataloader = get_dataloaders(config["batch_size"])
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    accuracies, averaged_steps = [], []
    for epoch in range(config["num_epochs"]):
        model.train()
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps,
                      enabled=local_sgd_steps is not None) as local_sgd:
            for step, (x, y) in enumerate(train_dataloader):
                with accelerator.accumulate(model):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    # LocalSGD-specific line
                    local_sgd.step()
            averaged_steps.append(local_sgd.num_steps)
        model.eval()
        correct = seen = 0
        for x, y in eval_dataloader:
            with torch.no_grad():
                predictions = model(x).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, y))
            correct += int((predictions == references).sum())
            seen += len(references)
        accuracies.append([correct, seen])
    # Right after the block's final averaging every process holds the same weights.
    replicas = accelerator.gather(torch.stack([p.detach().sum() for p in model.parameters()])[None])
    return {"accuracy": accuracies, "local_steps": averaged_steps,
            "replicas_equal": bool((replicas == replicas[0]).all()), **fingerprint(accelerator.unwrap_model(model))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--local_sgd_steps", type=int, default=8)
    args = parser.parse_args(argv)
    config = {"lr": 2e-2, "num_epochs": 3, "seed": 42, "batch_size": 4}
    result = training_function(config, args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
