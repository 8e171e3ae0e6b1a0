"""What fit says when it ends on a limit, and when the logging interval is longer than an epoch (Lightning's
messages, so a ported user sees the same lines)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule


class Regressor(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(n: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 3), torch.randn(n, 1)), batch_size=4)


@pytest.mark.parametrize(("limits", "line"), [({"max_epochs": 2}, "`Trainer.fit` stopped: `max_epochs=2` reached."),
                                              ({"max_steps": 3}, "`Trainer.fit` stopped: `max_steps=3` reached.")])
def test_fit_says_which_limit_ended_it(capsys: Any, limits: dict[str, int], line: str) -> None:
    Trainer(log_with=None, enable_progress_bar=False, enable_model_summary=False, **limits).fit(Regressor(), _data())
    assert line in capsys.readouterr().err  # on stderr, where Lightning's log shows it


def test_a_requested_stop_is_not_reported_as_a_limit(capsys: Any) -> None:
    class StopAtOnce(Regressor):
        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.trainer.should_stop = True

    Trainer(max_epochs=5, log_with=None, enable_progress_bar=False, enable_model_summary=False).fit(StopAtOnce(),
                                                                                                     _data())
    assert "`Trainer.fit` stopped" not in capsys.readouterr().err


def test_a_logging_interval_longer_than_the_epoch_warns(tmp_path: Any) -> None:
    with pytest.warns(UserWarning, match=r"The number of training batches \(4\) is smaller than the logging "
                                         r"interval Trainer\(log_every_n_steps=50\)"):
        Trainer(max_epochs=1, project_dir=str(tmp_path), enable_progress_bar=False,
                enable_model_summary=False).fit(Regressor(), _data())
