"""The scikit-learn handwritten digits (1,797 8x8 images, bundled with the package: no download), split once."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset


def digits_splits(seed: int = 0) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Train / validation / test datasets (70 / 15 / 15 %), images scaled to [0, 1] with shape (1, 8, 8)."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(labels))
    x = torch.tensor(images[order], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(labels[order], dtype=torch.long)
    n_train, n_val = int(0.7 * len(y)), int(0.15 * len(y))
    return (TensorDataset(x[:n_train], y[:n_train]),
            TensorDataset(x[n_train:n_train + n_val], y[n_train:n_train + n_val]),
            TensorDataset(x[n_train + n_val:], y[n_train + n_val:]))


class DigitsCNN(torch.nn.Module):
    """A small CNN for 8x8 digits: two 3x3 convolutions, max-pool, two linear layers with dropout."""

    def __init__(self, width: int = 32, dropout: float = 0.2) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, width, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(width, 2 * width, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.head = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(2 * width * 16, 128), torch.nn.ReLU(), torch.nn.Dropout(dropout),
            torch.nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
