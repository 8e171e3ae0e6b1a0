"""Tiny stand-ins for the hub model and dataset of Accelerate's examples: plain torch, no download.

Imports nothing of ours, so the scripts next to it run unchanged under the real Accelerate (see record.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 16, 4


def classification_data(n: int, seed: int) -> TensorDataset:
    """A fixed random classification task (the same on every process)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def get_dataloaders(batch_size: int = 8, eval_batch_size: int = 8, n_train: int = 56,
                    n_eval: int = 20) -> tuple[DataLoader, DataLoader]:
    """The examples' ``get_dataloaders``: a shuffled training loader and an evaluation loader.

    20 evaluation samples in batches of 8 do not divide across 2 processes: the last batch is padded, which
    ``gather_for_metrics`` must drop again.
    """
    train = DataLoader(classification_data(n_train, 0), batch_size=batch_size, shuffle=True)
    evaluation = DataLoader(classification_data(n_eval, 1), batch_size=eval_batch_size, shuffle=False)
    return train, evaluation


class TinyClassifier(torch.nn.Module):
    """Linear, ReLU, dropout, linear: dropout makes the result depend on the random stream too."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TinyLM(torch.nn.Module):
    """A next-token model (embedding, GRU, head) for the autoregressive accumulation example."""

    def __init__(self, vocab: int = 12, width: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.rnn = torch.nn.GRU(width, width, batch_first=True)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0])


def token_data(n: int = 40, length: int = 10, vocab: int = 12, seed: int = 2) -> TensorDataset:
    """Sequences of random length, padded; labels are the next token, -100 where padded (ignored)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (n, length + 1), generator=g)
    lengths = torch.randint(3, length + 1, (n,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    labels = torch.where(mask, tokens[:, 1:], torch.full_like(tokens[:, 1:], -100))
    inputs = torch.where(mask, tokens[:, :-1], torch.zeros_like(tokens[:, :-1]))
    return TensorDataset(inputs, labels)


def fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """What the tests compare: a hash of the exact parameter bytes and a readable sum."""
    params = [p.detach().cpu().contiguous() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()[:16]
    return {"sha": digest, "sum": round(float(sum(p.double().sum() for p in params)), 10)}
