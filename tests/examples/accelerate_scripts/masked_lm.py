"""A masked-language-model loop like transformers' ``run_mlm_no_trainer.py``, on a tiny model: the collator
draws its mask from the global RNGs, as ``DataCollatorForLanguageModeling`` does.

Which batch gets which mask then depends on when the loader collates: Accelerate's prepared loader collates batch
k+1 before it yields batch k, so the draws go mask(b0), mask(b1), dropout(b0), mask(b2), dropout(b1), ... Saves a
checkpoint after step N (``--checkpointing_steps N``) and resumes from one (``--resume_from_checkpoint step_N``)
as Accelerate's examples do, or by iterating the restored loader (``--resume_pattern engine``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from engine import Accelerator
from engine.utils import set_seed
from tests.examples.accelerate_scripts.tiny import fingerprint

VOCAB, LENGTH, MASK_TOKEN = 20, 10, 1


class MaskingCollator:
    """Stack token ids, mask 15% of them (80% become the mask token, 10% a random token), then a random crop.

    The mask and the replacement tokens come from torch's global RNG, the crop offset from ``random`` and a
    per-batch noise token from numpy's, so every global generator a checkpoint restores is drawn from.
    """

    def __call__(self, samples: list[tuple[torch.Tensor]]) -> dict[str, torch.Tensor]:
        ids = torch.stack([s[0] for s in samples]).clone()
        labels = ids.clone()
        masked = torch.bernoulli(torch.full(ids.shape, 0.15)).bool()
        labels[~masked] = -100
        replaced = torch.bernoulli(torch.full(ids.shape, 0.8)).bool() & masked
        ids[replaced] = MASK_TOKEN
        randomized = torch.bernoulli(torch.full(ids.shape, 0.5)).bool() & masked & ~replaced
        ids[randomized] = torch.randint(VOCAB, ids.shape, dtype=ids.dtype)[randomized]
        start = random.randint(0, 2)
        ids[:, 0] = int(np.random.randint(2, VOCAB))
        return {"input_ids": ids[:, start:start + LENGTH - 2], "labels": labels[:, start:start + LENGTH - 2]}


class TinyMaskedLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.dropout = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.embed(input_ids)))


def batch_key(batch: dict[str, torch.Tensor]) -> int:
    """One integer that changes with any token or mask position of the batch."""
    weights = torch.arange(1, batch["input_ids"].numel() + 1).view_as(batch["input_ids"])
    return int((batch["input_ids"] * weights).sum() + ((batch["labels"] >= 0) * weights).sum() * 7)


def training_function(args: argparse.Namespace) -> dict[str, Any]:
    accelerator = Accelerator(cpu=args.cpu, gradient_accumulation_steps=2)
    set_seed(42)
    tokens = torch.randint(2, VOCAB, (20 * accelerator.num_processes * 2, LENGTH),
                           generator=torch.Generator().manual_seed(0))
    train_dataloader = DataLoader(TensorDataset(tokens), batch_size=4, shuffle=True, collate_fn=MaskingCollator(),
                                  num_workers=args.num_workers)
    model = TinyMaskedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    checkpointing_steps = args.checkpointing_steps
    starting_epoch, resume_step, overall_step = 0, None, 0
    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        resume_step = int(os.path.basename(args.resume_from_checkpoint).replace("step_", ""))
        starting_epoch = resume_step // len(train_dataloader)
        resume_step -= starting_epoch * len(train_dataloader)
    keys: list[list[int]] = []
    losses: list[float] = []
    for epoch in range(starting_epoch, 2):
        model.train()
        active = train_dataloader
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            overall_step += resume_step + starting_epoch * len(train_dataloader)
            if args.resume_pattern == "accelerate":
                active = accelerator.skip_first_batches(train_dataloader, resume_step)
        keys.append([])
        for batch in active:
            keys[-1].append(batch_key(batch))
            with accelerator.accumulate(model):
                logits = model(batch["input_ids"])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1),
                                                       reduction="sum") / batch["labels"].numel()
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(round(float(loss.detach()), 6))
            overall_step += 1
            if checkpointing_steps is not None and overall_step == checkpointing_steps:
                accelerator.save_state(f"step_{overall_step}")
    return {"keys": keys, "losses": losses, **fingerprint(accelerator.unwrap_model(model))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Masked LM with a random collator.")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--checkpointing_steps", type=int, default=None)
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    parser.add_argument("--resume_pattern", choices=["accelerate", "engine"], default="accelerate")
    parser.add_argument("--num_workers", type=int, default=0)
    args = parser.parse_args(argv)
    result = training_function(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
