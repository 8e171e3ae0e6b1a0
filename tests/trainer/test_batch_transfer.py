"""The batch-transfer hooks (``on_before_batch_transfer`` -> ``transfer_batch_to_device`` ->
``on_after_batch_transfer``): called in Lightning's order, with Lightning's ``dataloader_idx``, in fit, validation
and predict (values recorded from Lightning 2.6.6 by tests/parity_scripts/record_batch_transfer.py), a data
module's override used over the module's, and no change to the loop when none is overridden."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from tests.trainer.helpers import QUIET
from trainer import DataModule, Trainer, TrainModule


class Hooked(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.calls: list[tuple[Any, ...]] = []

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append(("before", dataloader_idx))
        return batch * 10

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append(("after", dataloader_idx))
        return batch + 1

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls.append(("step", batch.tolist()))
        return self.layer(batch[:, None]).sum()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append(("val", batch.tolist(), dataloader_idx))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        self.calls.append(("predict", batch.tolist(), dataloader_idx))
        return batch

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loaders() -> tuple[DataLoader, list[DataLoader]]:
    return (DataLoader(torch.arange(4.0), batch_size=2),
            [DataLoader(torch.arange(2.0), batch_size=2), DataLoader(torch.arange(2.0), batch_size=2)])


def test_hooks_run_in_lightnings_order_with_its_dataloader_idx() -> None:
    model = Hooked()
    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(model, *loaders())
    # Lightning 2.6.6
    assert model.calls == [("before", 0), ("after", 0), ("step", [1.0, 11.0]), ("before", 0), ("after", 0),
                           ("step", [21.0, 31.0]), ("before", 0), ("after", 0), ("val", [1.0, 11.0], 0),
                           ("before", 1), ("after", 1), ("val", [1.0, 11.0], 1)]
    model.calls.clear()
    trainer.predict(model, DataLoader(torch.arange(2.0), batch_size=2))
    assert model.calls == [("before", 0), ("after", 0), ("predict", [1.0, 11.0], 0)]


def test_transfer_batch_to_device_is_called_with_the_device_and_a_data_module_wins() -> None:
    seen: list[Any] = []

    class Moving(Hooked):
        def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
            seen.append(("module", device.type))
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

    class Data(DataModule):
        def train_dataloader(self) -> DataLoader:
            return loaders()[0]

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            seen.append(("datamodule", dataloader_idx))
            return batch - 1

    model = Moving()
    Trainer(**QUIET, max_epochs=1).fit(model, datamodule=Data())
    assert seen == [("datamodule", 0), ("module", "cpu")] * 2
    assert [c for c in model.calls if c[0] == "step"] == [("step", [0.0, 1.0]), ("step", [2.0, 3.0])]  # -1, +1


def test_without_overrides_the_loop_gets_no_transfer_step() -> None:
    class Plain(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[:, None]).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(Plain(), loaders()[0])
    assert trainer.plan.transfer is None
