"""WeightAveraging's schedule as Lightning 2.6.6 runs it (observed there with the same settings): when
``should_update`` is asked, with which indices, the average's count, and the swaps Lightning's protected methods
(``_swap_models``, ``_copy_average_to_current``) make; SWA's message when it takes over a module's scheduler."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
import torch
from torch.optim.swa_utils import get_swa_avg_fn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import StochasticWeightAveraging, WeightAveraging
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


class Recording(WeightAveraging):
    """Records every ``should_update`` question and counts the weight moves, as Lightning's tests do."""

    def __init__(self, epochs: tuple[int, ...] | None) -> None:
        super().__init__(avg_fn=get_swa_avg_fn())
        self.epochs = epochs  # update at these epochs' ends; None: after every third optimizer step
        self.asked: list[tuple[int | None, int | None]] = []
        self.at_epoch_end: list[tuple[int, int, int]] = []  # (global_step, n_averaged, swaps)
        self.swaps = self.copies = 0

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        self.asked.append((step_idx, epoch_idx))
        if self.epochs is None:
            return step_idx is not None and step_idx % 3 == 0
        return epoch_idx in self.epochs

    def _swap_models(self, module: torch.nn.Module) -> None:
        self.swaps += 1
        super()._swap_models(module)

    def _copy_average_to_current(self, module: torch.nn.Module) -> None:
        self.copies += 1
        super()._copy_average_to_current(module)

    def on_train_epoch_end(self, trainer: Any, pl_module: torch.nn.Module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        assert self.average_model is not None
        self.at_epoch_end.append((trainer.global_step, int(self.average_model.n_averaged), self.swaps))


# Lightning 2.6.6, 3 epochs of 5 batches (limit_train_batches=5 of 10), accumulate_grad_batches=2 (steps after
# batches 1, 3 and the epoch's last), one validation batch per epoch, no sanity check. A question whose answer
# was no is asked again at the next batch while the step count stays (the batch after a step's window opens).
LIGHTNING_ASKED_BY_EPOCH = [(0, None), (0, None), (1, None), (2, None), (None, 0), (2, None), (3, None), (3, None),
                            (4, None), (5, None), (None, 1), (5, None), (6, None), (6, None), (7, None), (8, None),
                            (None, 2)]
LIGHTNING_ASKED_BY_STEP = [(0, None), (1, None), (2, None), (None, 0), (2, None), (3, None), (4, None), (5, None),
                           (None, 1), (5, None), (6, None), (7, None), (8, None), (None, 2)]


@pytest.mark.parametrize(("epochs", "asked", "at_epoch_end"), [
    ((1, 2), LIGHTNING_ASKED_BY_EPOCH, [(3, 0, 2), (6, 1, 4), (9, 2, 6)]),
    (None, LIGHTNING_ASKED_BY_STEP, [(3, 1, 2), (6, 2, 4), (9, 3, 6)]),
], ids=["epoch-ends", "every-third-step"])
def test_should_update_is_asked_and_counts_as_in_lightning(epochs: tuple[int, ...] | None,
                                                           asked: list[tuple[int | None, int | None]],
                                                           at_epoch_end: list[tuple[int, int, int]]) -> None:
    torch.manual_seed(0)
    callback = Recording(epochs)
    trainer = Trainer(**QUIET, max_epochs=3, accumulate_grad_batches=2, limit_train_batches=5, limit_val_batches=1,
                      callbacks=[callback])
    trainer.fit(Regressor(), data(n=40, batch_size=4), data(n=8, batch_size=4))
    assert callback.asked == asked
    assert callback.at_epoch_end == at_epoch_end
    assert (callback.swaps, callback.copies) == (6, 1)  # around each validation epoch; once when fit ends


class ScheduledRegressor(Regressor):
    def __init__(self, interval: str, frequency: int) -> None:
        super().__init__()
        self.interval, self.frequency = interval, frequency

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": self.interval, "frequency": self.frequency}}


@pytest.mark.parametrize(("interval", "frequency", "warns"), [("step", 1, True), ("epoch", 2, True),
                                                             ("epoch", 1, False)])
def test_swa_says_it_takes_over_the_scheduler_when_it_starts(caplog: pytest.LogCaptureFixture, interval: str,
                                                             frequency: int, warns: bool) -> None:
    # Lightning 2.6.6: at the first SWA epoch's start (epoch 1 with swa_epoch_start=2), the warning for a scheduler
    # not stepped once per epoch, and in every case the info line; nothing at epoch 0.
    said: list[tuple[int, str]] = []
    loader = DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=4)

    class Epochs(StochasticWeightAveraging):
        def on_train_epoch_start(self, trainer: Any, pl_module: torch.nn.Module) -> None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                super().on_train_epoch_start(trainer, pl_module)
            said.extend((trainer.current_epoch, str(w.message)) for w in caught)

    trainer = Trainer(**QUIET, max_epochs=3, callbacks=[Epochs(swa_lrs=1e-2, swa_epoch_start=2)])
    with caplog.at_level(logging.INFO):
        trainer.fit(ScheduledRegressor(interval, frequency), loader)
    assert [epoch for epoch, _ in said] == ([1] if warns else [])
    if warns:
        assert said[0][1].startswith("SWA is currently only supported every epoch. Found ")
        assert f"interval='{interval}', frequency={frequency}" in said[0][1]
    assert caplog.text.count("Swapping scheduler `StepLR` for `SWALR`") == 1
