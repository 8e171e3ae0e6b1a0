"""``Trainer(reload_dataloaders_every_n_epochs=N)``: the loader hooks are asked again on Lightning's schedule, and a
run resumed mid-epoch rebuilds the loader it was reading (as of the epoch that built it) and ends bitwise equal."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tests.trainer.helpers import QUIET, Regressor
from trainer import Trainer


class Recording(Regressor):
    """Records (hook, trainer.current_epoch[, sanity_checking]) for each loader request; a curriculum: the
    training data changes with the epoch the loader is built in."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)
        self.calls: list[tuple[Any, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.drop(x))

    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch
        self.calls.append(("train", epoch))
        generator = torch.Generator().manual_seed(epoch)  # each build's data depends on its epoch
        x = torch.randn(24, 3, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True) * (epoch + 1)), batch_size=4, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        self.calls.append(("val", self.trainer.current_epoch, self.trainer.sanity_checking))
        x = torch.randn(8, 3, generator=torch.Generator().manual_seed(100))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def _fit(every: int, check_val: int, sanity: int, epochs: int = 6) -> list[tuple[Any, ...]]:
    module = Recording()
    trainer = Trainer(**{**QUIET, "num_sanity_val_steps": sanity}, max_epochs=epochs, seed=0,
                      reload_dataloaders_every_n_epochs=every, check_val_every_n_epoch=check_val)
    trainer.fit(module)
    return module.calls


# Observed from lightning 2.6 (lightning.pytorch.Trainer, max_epochs=6, the hooks of Recording): the epochs at
# which train_dataloader() / val_dataloader() were called, with trainer.sanity_checking for the latter.
OBSERVED = [
    ((2, 1, 2), [0, 2, 4], [(0, True), (2, False), (4, False)]),
    ((3, 2, 2), [0, 3], [(0, True), (1, False), (5, False)]),  # the sanity check's loaders do not count: epoch 0
    ((2, 3, 2), [0, 2, 4], [(0, True), (2, False), (5, False)]),  # does not validate, so epoch 1 asks again
    ((1, 1, 0), [0, 1, 2, 3, 4, 5], [(e, False) for e in range(6)]),
]


@pytest.mark.parametrize(("keywords", "train", "val"), OBSERVED)
def test_loaders_are_asked_for_on_lightnings_schedule(keywords: tuple[int, int, int], train: list[int],
                                                      val: list[tuple[int, bool]]) -> None:
    calls = _fit(*keywords)
    assert [c[1] for c in calls if c[0] == "train"] == train
    assert [c[1:] for c in calls if c[0] == "val"] == val


@pytest.mark.parametrize(("keywords", "val"), [((2, 2, 0), [1, 3, 5]), ((4, 3, 0), [2]), ((2, 3, 0), [2, 5])])
def test_without_a_sanity_check_the_set_up_loaders_serve_the_first_validation(keywords: tuple[int, int, int],
                                                                              val: list[int]) -> None:
    # Lightning 2.6 (observed; its test_dataloaders_load_every_n_epochs_infrequent_val) asks at the first
    # validation (epoch 1 for check_val_every_n_epoch=2) and counts the reloads from there. Ember asks at set-up
    # (the loop's cadence is read off the prepared loaders), with current_epoch reading that first validation's
    # epoch, and those loaders serve it: one call fewer would be wrong, one more would differ from Lightning's.
    calls = _fit(*keywords)
    assert [c[1] for c in calls if c[0] == "val"] == val


def test_reload_off_asks_once() -> None:
    calls = _fit(0, 1, 2)
    assert [c[0] for c in calls] == ["val", "train"]


class SaveAt(Callback):
    def __init__(self, path: str, epoch: int, batch: int) -> None:
        self.path, self.epoch, self.batch = path, epoch, batch

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            trainer.save_checkpoint(self.path)


def _run(ckpt_path: str | None = None, callbacks: Any = ()) -> Recording:
    trainer = Trainer(**QUIET, max_epochs=5, seed=0, accumulate_grad_batches=2, reload_dataloaders_every_n_epochs=2,
                      callbacks=list(callbacks))
    module = Recording()  # after the trainer's seed: every run starts from the same weights
    trainer.fit(module, ckpt_path=ckpt_path)
    return module


@pytest.mark.parametrize(("epoch", "batch", "asked"), [
    (3, 2, [("train", 2), ("train", 4)]),  # mid-epoch, the loader built at epoch 2: asked again as of epoch 2
    (2, 2, [("train", 2), ("train", 4)]),  # mid-epoch in a reloading epoch: its loader, position carried over
    (1, 5, [("train", 2), ("train", 4)]),  # the epoch's last batch: the next epoch reloads afresh
])
def test_a_mid_epoch_resume_with_reloading_is_bitwise_exact(tmp_path: Any, epoch: int, batch: int,
                                                            asked: list[tuple[str, int]]) -> None:
    full = _run()
    path = str(tmp_path / "mid.ckpt")
    _run(callbacks=[SaveAt(path, epoch, batch)])
    resumed = _run(ckpt_path=path)
    for name, value in full.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name  # bitwise
    # the set-up's request (epoch 0, before the checkpoint is read), then the rebuilds
    assert [c for c in resumed.calls if c[0] == "train"] == [("train", 0), *asked]
