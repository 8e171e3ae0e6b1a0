"""Accelerate's ``examples/by_feature/multi_process_metrics.py``, on a tiny model: evaluation over processes
counts every sample once (the padding of the last, uneven batch is dropped by ``gather_for_metrics``)."""

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
    set_seed(config["seed"])
    train_dataloader, eval_dataloader = get_dataloaders(config["batch_size"], config["eval_batch_size"])
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    metrics = []
    for epoch in range(config["num_epochs"]):
        model.train()
        for step, (x, y) in enumerate(train_dataloader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        samples_seen = 0
        all_predictions, all_references = [], []
        for step, (x, y) in enumerate(eval_dataloader):
            with torch.no_grad():
                predictions = model(x).argmax(dim=-1)
            # The manual way, as the example shows it: drop the padding of the last batch by hand...
            manual_predictions, manual_references = accelerator.gather((predictions, y))
            if accelerator.use_distributed and step == len(eval_dataloader) - 1:
                manual_predictions = manual_predictions[: len(eval_dataloader.dataset) - samples_seen]
                manual_references = manual_references[: len(eval_dataloader.dataset) - samples_seen]
            else:
                samples_seen += manual_references.shape[0]
            # ...and the automatic way.
            predictions, references = accelerator.gather_for_metrics((predictions, y))
            assert torch.equal(predictions, manual_predictions) and torch.equal(references, manual_references)
            all_predictions.append(predictions)
            all_references.append(references)
        predictions, references = torch.cat(all_predictions), torch.cat(all_references)
        metrics.append({"n": len(references), "correct": int((predictions == references).sum()),
                        "references": references.tolist()})
    return {"metrics": metrics, **fingerprint(accelerator.unwrap_model(model))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args(argv)
    config = {"lr": 2e-2, "num_epochs": 2, "seed": 42, "batch_size": 8, "eval_batch_size": 4}
    result = training_function(config, args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
