"""Accelerate's ``examples/by_feature/checkpointing.py``, on a tiny model: save every N steps or every epoch,
resume with ``load_state`` + ``skip_first_batches`` for the resumed epoch, then the loader itself."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch

from engine import Accelerator
from engine.utils import set_seed
from tests.examples.accelerate_scripts.tiny import TinyClassifier, fingerprint, get_dataloaders


def training_function(config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    checkpointing_steps: int | str | None = args.checkpointing_steps
    if checkpointing_steps is not None and checkpointing_steps.isdigit():
        checkpointing_steps = int(checkpointing_steps)
    set_seed(config["seed"])
    train_dataloader, eval_dataloader = get_dataloaders(config["batch_size"])
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
    total = len(train_dataloader) * config["num_epochs"]
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / (2 * total)))
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    overall_step = 0
    starting_epoch = 0
    resume_step = None
    if args.resume_from_checkpoint:
        accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
        accelerator.load_state(args.resume_from_checkpoint)
        path = os.path.basename(args.resume_from_checkpoint)
        training_difference = os.path.splitext(path)[0]
        if "epoch" in training_difference:
            starting_epoch = int(training_difference.replace("epoch_", "")) + 1
            resume_step = None
        else:
            resume_step = int(training_difference.replace("step_", ""))
            starting_epoch = resume_step // len(train_dataloader)
            resume_step -= starting_epoch * len(train_dataloader)

    accuracies, batches, orders = [], [], []
    for epoch in range(starting_epoch, config["num_epochs"]):
        model.train()
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
            overall_step += resume_step
        else:
            active_dataloader = train_dataloader
        batches.append(len(active_dataloader))
        orders.append([])
        for step, (x, y) in enumerate(active_dataloader):
            orders[-1].append(round(float(x[0, 0]), 4))  # which batch this is
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            overall_step += 1
            if isinstance(checkpointing_steps, int):
                output_dir = f"step_{overall_step}"
                if overall_step % checkpointing_steps == 0:
                    if args.output_dir is not None:
                        output_dir = os.path.join(args.output_dir, output_dir)
                    accelerator.save_state(output_dir)
        model.eval()
        correct = seen = 0
        for x, y in eval_dataloader:
            with torch.no_grad():
                predictions = model(x).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, y))
            correct += int((predictions == references).sum())
            seen += len(references)
        accuracies.append([correct, seen])
        if checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)
    return {"accuracy": accuracies, "batches": batches, "orders": orders, **fingerprint(accelerator.unwrap_model(model))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--checkpointing_steps", type=str, default=None)
    parser.add_argument("--output_dir", type=str, default=".")
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    args = parser.parse_args(argv)
    config = {"lr": 2e-2, "num_epochs": 3, "seed": 42, "batch_size": 8}
    result = training_function(config, args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
