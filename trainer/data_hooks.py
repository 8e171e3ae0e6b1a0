"""`DataHooks`: the data methods a `TrainModule` and a `DataModule` share (Lightning's ``DataHooks``)."""

from __future__ import annotations

from typing import Any

import torch

from trainer.errors import MisconfigurationError


class DataHooks:
    """``prepare_data`` / ``setup`` / ``teardown``, the four ``*_dataloader`` methods and the batch-transfer hooks.

    The trainer only calls a ``*_dataloader`` method that a subclass defines; calling one that is not defined
    raises with what to do instead.
    """

    def prepare_data(self) -> None:
        """Download or write data to disk; runs on one process per machine (the local main), before ``setup``."""

    def setup(self, stage: str) -> None:
        """Build datasets / state; runs on every process with ``stage`` in ``"fit"``, ``"validate"``, ``"test"``,
        ``"predict"``."""

    def teardown(self, stage: str) -> None:
        """Release what ``setup`` built; called at the end of fit / validate / test / predict."""

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it is moved to the device (called only when overridden)."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to ``device`` (tensors inside lists, tuples, dicts, dataclasses); override for custom
        batch types."""
        from engine.operations import send_to_device

        return send_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch after it was moved to the device (e.g. GPU augmentation)."""
        return batch

    def _missing(self, method: str, argument: str) -> MisconfigurationError:
        # Lightning's words first ("`val_dataloader` must be implemented"), which code written for it matches.
        return MisconfigurationError(f"`{method}` must be implemented to be used with the Trainer: define "
                                     f"{type(self).__name__}.{method}(), or pass {argument}= (or datamodule=) to "
                                     "the trainer.")

    def train_dataloader(self) -> Any:
        raise self._missing("train_dataloader", "train_dataloaders")

    def val_dataloader(self) -> Any:
        raise self._missing("val_dataloader", "val_dataloaders")

    def test_dataloader(self) -> Any:
        raise self._missing("test_dataloader", "dataloaders")

    def predict_dataloader(self) -> Any:
        raise self._missing("predict_dataloader", "dataloaders")
