"""Accelerate's ``examples/by_feature/profiler.py``, on a tiny model: ``ProfileKwargs`` + ``accelerator.profile()``,
one Chrome trace per process."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch

from engine import Accelerator
from engine.utils import ProfileKwargs, set_seed
from tests.examples.accelerate_scripts.tiny import TinyClassifier, fingerprint, get_dataloaders


def training_function(config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    profile_kwargs = ProfileKwargs(record_shapes=args.record_shapes, profile_memory=args.profile_memory,
                                   with_flops=args.with_flops, with_stack=args.with_stack,
                                   output_trace_dir=args.output_trace_dir)
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision, kwargs_handlers=[profile_kwargs])
    set_seed(config["seed"])
    train_dataloader, eval_dataloader = get_dataloaders(config["batch_size"])
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    ops: list[str] = []
    for epoch in range(config["num_epochs"]):
        model.train()
        with accelerator.profile() as prof:
            for step, (x, y) in enumerate(train_dataloader):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        events = {e.key: e for e in prof.key_averages()}
        ops = sorted(k for k in ("aten::addmm", "aten::mm", "aten::relu") if k in events)
        flops = int(events["aten::addmm"].flops) if "aten::addmm" in events else -1
        shapes = any(e.input_shapes for e in prof.key_averages(group_by_input_shape=True))
    traces = sorted(os.listdir(args.output_trace_dir)) if args.output_trace_dir else []
    return {"ops": ops, "flops_counted": flops > 0, "shapes_recorded": shapes, "traces": traces,
            **fingerprint(accelerator.unwrap_model(model))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--record_shapes", action="store_true")
    parser.add_argument("--profile_memory", action="store_true")
    parser.add_argument("--with_stack", action="store_true")
    parser.add_argument("--with_flops", action="store_true")
    parser.add_argument("--output_trace_dir", type=str, default=None)
    args = parser.parse_args(argv)
    config = {"lr": 2e-2, "num_epochs": 1, "seed": 42, "batch_size": 8}
    result = training_function(config, args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
