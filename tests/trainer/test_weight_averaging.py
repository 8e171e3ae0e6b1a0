"""StochasticWeightAveraging's Lightning attributes."""

from __future__ import annotations

from callbacks import StochasticWeightAveraging
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


def test_n_averaged_counts_the_epochs_averaged() -> None:
    swa = StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=2)  # epochs 1, 2 and 3 (0-based) are averaged
    assert swa.n_averaged is None  # Lightning's value before fit sets up
    trainer = Trainer(**QUIET, max_epochs=4, limit_val_batches=0, callbacks=[swa])
    trainer.fit(Regressor(), data(n=8))
    assert swa.n_averaged is not None and int(swa.n_averaged) == 3
