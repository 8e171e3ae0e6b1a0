"""Record where Lightning's ``SpikeDetection`` raises on given loss sequences, and the batches it excludes.

    /tmp/venv-pl44/bin/python tests/parity_scripts/record_spike.py        # Lightning 2.6.6
    PYTHONPATH=. python tests/parity_scripts/record_spike.py --ember      # Ember, the same scenarios

Prints one line per scenario: the scenario, the batch the exception names (None: none raised) and the JSON file.
``tests/trainer/test_spike.py`` holds the scenarios and the Lightning lines.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

if "--ember" in sys.argv:
    from callbacks import SpikeDetection, TrainingSpikeException
    from trainer import Trainer
    from trainer import TrainModule as LightningModule
else:
    from lightning.fabric.utilities.spike import TrainingSpikeException
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks.spike import SpikeDetection

# Ember stops at a non-finite loss by default (Lightning trains on): the NaN / inf scenarios need it off.
EXTRA: dict[str, Any] = {"on_nonfinite_loss": "ignore"} if "--ember" in sys.argv else {}
INF = float("inf")
SCENARIOS: dict[str, tuple[list[float], dict[str, Any]]] = {
    "steady": ([1.0, 0.9, 0.8, 0.7, 0.6, 0.5], {}),
    "jump": ([1.0, 0.9, 0.8, 0.7, 5.0, 0.5], {}),
    "small_jump": ([1.0, 0.9, 0.8, 0.7, 1.5, 0.5], {}),
    "inf": ([1.0, 0.9, 0.8, INF, 0.6, 0.5], {}),
    "inf_not_finite_only": ([1.0, 0.9, 0.8, INF, 0.6, 0.5], {"finite_only": False}),
    "nan_not_finite_only": ([1.0, 0.9, 0.8, float("nan"), 0.6, 0.5], {"finite_only": False}),
    "atol": ([1.0, 0.9, 0.8, 0.7, 2.0, 0.5], {"atol": 2.0}),
    "max_mode": ([1.0, 2.0, 3.0, 4.0, 0.1, 5.0], {"mode": "max", "rtol": 0.5}),
    "warmup": ([1.0, 9.0, 0.8, 0.7, 0.6, 0.5], {"warmup": 2}),
    "window": ([1.0, 1.0, 1.0, 3.5, 3.6, 3.7], {"window": 2}),
}


class Losses(LightningModule):
    def __init__(self, losses: list[float]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1, bias=False)
        self.losses = losses

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum() * 0 + self.losses[batch_idx]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main() -> None:
    for name, (losses, options) in SCENARIOS.items():
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "skip.json")
            trainer = Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False, **EXTRA, callbacks=[SpikeDetection(exclude_batches_path=path,
                                                                                    **options)])
            raised = None
            try:
                trainer.fit(Losses(losses), DataLoader(torch.ones(len(losses), 1), batch_size=1))
            except TrainingSpikeException as error:
                raised = str(error)
            excluded = json.loads(Path(path).read_text()) if os.path.exists(path) else None
            print(f"{name}: {raised} {excluded}")


if __name__ == "__main__":
    main()
