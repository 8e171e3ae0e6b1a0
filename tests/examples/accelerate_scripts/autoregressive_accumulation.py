"""Accelerate's ``examples/by_feature/gradient_accumulation_for_autoregressive_models.py``, on a tiny model:
the loss of an accumulation window is normalised by its non-padded tokens, counted across processes."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
from typing import Any

import torch
from torch.utils.data import DataLoader

from engine import Accelerator
from engine.utils import set_seed
from tests.examples.accelerate_scripts.tiny import TinyLM, fingerprint, token_data


def loss_function(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int) -> torch.Tensor:
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                             reduction="sum")
    return loss / num_items_in_batch


def training_function(config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    gradient_accumulation_steps = args.gradient_accumulation_steps
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision,
                              gradient_accumulation_steps=gradient_accumulation_steps)
    set_seed(config["seed"])
    train_dataloader = DataLoader(token_data(), batch_size=config["batch_size"], shuffle=True)
    model = TinyLM()
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)
    items, losses = [], []
    for epoch in range(config["num_epochs"]):
        model.train()
        training_iterator = iter(train_dataloader)
        num_samples_in_epoch = len(train_dataloader)
        remainder = num_samples_in_epoch % gradient_accumulation_steps
        remainder = remainder if remainder != 0 else gradient_accumulation_steps
        total_updates = math.ceil(num_samples_in_epoch / gradient_accumulation_steps)
        for update_step in range(total_updates):
            # Pre-load the whole window to count its non-padded tokens before the first backward.
            batch_samples = []
            num_batches_in_step = gradient_accumulation_steps if update_step != (total_updates - 1) else remainder
            for _ in range(num_batches_in_step):
                batch_samples += [next(training_iterator)]
            local_num_items_in_batch = sum([labels.ne(-100).sum() for _, labels in batch_samples])
            num_items_in_batch = accelerator.gather(local_num_items_in_batch).sum().item()
            items.append(num_items_in_batch)
            for i, (inputs, labels) in enumerate(batch_samples):
                # No gradient all-reduce until the last micro-batch of the window.
                if i < len(batch_samples) - 1 and accelerator.num_processes > 1:
                    ctx = model.no_sync
                else:
                    ctx = contextlib.nullcontext
                with ctx():
                    loss = loss_function(model(inputs), labels, num_items_in_batch)
                    # DDP averages over processes and backward() over the window: undo both.
                    loss = loss * gradient_accumulation_steps * accelerator.num_processes
                    accelerator.backward(loss)
                losses.append(round(loss.item(), 6))
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
    return {"items": items, "losses": losses[:6], **fingerprint(accelerator.unwrap_model(model))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=3)
    args = parser.parse_args(argv)
    config = {"lr": 2e-2, "num_epochs": 2, "seed": 42, "batch_size": 4}
    result = training_function(config, args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
