"""torchmetrics Metric objects in self.log / self.log_dict, with Lightning's semantics: the forward value per
step, compute() at the epoch end, reset() after it (and after the sanity check), the Metric's own sync only."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torchmetrics

from tests.trainer.helpers import QUIET, MemoryTracker, Regressor, data
from trainer import Trainer


class WithMetrics(Regressor):
    """Feeds batch_idx-derived values to Metric objects and logs the objects."""

    def __init__(self, sync_dist: bool = False) -> None:
        super().__init__()
        self.train_mean = torchmetrics.MeanMetric()
        self.val_sum = torchmetrics.SumMetric()
        self.updated_only = torchmetrics.SumMetric()
        self.collection = torchmetrics.MetricCollection({"mx": torchmetrics.MaxMetric(),
                                                         "mn": torchmetrics.MinMetric()})
        self.sync = sync_dist

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        value = torch.tensor(float(batch_idx + 10 * self.current_epoch))
        self.train_mean(value)
        self.log("mean", self.train_mean, on_step=True, on_epoch=True, prog_bar=True)
        self.updated_only.update(value)
        self.log("upd", self.updated_only, on_step=True, on_epoch=True)
        self.collection(value)
        self.log_dict(self.collection, on_step=False, on_epoch=True)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        rank = self.trainer.global_rank
        self.val_sum(torch.tensor(float(100 * rank + batch_idx + 1)))
        self.log("val_sum", self.val_sum, sync_dist=self.sync)


def test_step_epoch_reset_and_sanity_check_semantics() -> None:
    tracker = MemoryTracker()
    module = WithMetrics()
    trainer = Trainer(**{**QUIET, "log_with": [tracker], "num_sanity_val_steps": 2}, max_epochs=2,
                      log_every_n_steps=1)
    trainer.fit(module, data(n=16, batch_size=4), data(n=12, batch_size=4))  # 4 train, 3 val batches
    # Per step: the batch's own value (forward); per epoch: compute() over that epoch only (reset between).
    assert tracker.logged("mean_step") == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0),
                                           (5, 10.0), (6, 11.0), (7, 12.0), (8, 13.0)]
    assert tracker.logged("mean_epoch") == [(4, 1.5), (8, 11.5)]
    # update() only: no step value (nothing to show), but the epoch value is computed.
    assert tracker.logged("upd_step") == [] and tracker.logged("upd_epoch") == [(4, 6.0), (8, 46.0)]
    assert tracker.logged("mx") == [(4, 3.0), (8, 13.0)] and tracker.logged("mn") == [(4, 0.0), (8, 10.0)]
    # Validation: 1+2+3 each run; the two sanity-check batches (1+2) were reset away, not added.
    assert tracker.logged("val_sum") == [(4, 6.0), (8, 6.0)]
    assert float(trainer.callback_metrics["val_sum"]) == 6.0 and float(trainer.callback_metrics["mean"]) == 11.5
    assert isinstance(trainer.progress_bar_metrics["mean_epoch"], float)


def test_sync_dist_on_a_metric_warns_with_the_fix() -> None:
    trainer = Trainer(**QUIET, max_epochs=1, limit_train_batches=1, limit_val_batches=2)
    with pytest.warns(UserWarning, match=r"self.log\('val_sum', <SumMetric>, sync_dist=True\).*Drop sync_dist"):
        trainer.fit(WithMetrics(sync_dist=True), data(), data())


def test_no_sync_dist_warning_when_the_user_did_not_pass_it() -> None:
    class Unsynced(WithMetrics):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.val_sum(torch.tensor(1.0))
            self.log("val_sum", self.val_sum)  # no sync_dist: evaluation's exact default is Ember's, not the user's

    trainer = Trainer(**QUIET, max_epochs=1, limit_train_batches=1, limit_val_batches=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r".*sync_dist")
        trainer.fit(Unsynced(), data(), data())
        trainer.validate(Unsynced(), data(), verbose=False)
    assert float(trainer.callback_metrics["val_sum"]) == 2.0


def test_metric_states_kept_undoes_an_update_and_keeps_a_compute_group_shared() -> None:
    from trainer.evaluation.exact import metric_states_kept

    holder = torch.nn.Module()
    holder.set = torchmetrics.MetricCollection({
        "acc": torchmetrics.classification.MulticlassAccuracy(3, average="macro"),
        "prec": torchmetrics.classification.MulticlassPrecision(3, average="macro")})
    holder.cat = torchmetrics.CatMetric()
    loose = torchmetrics.SumMetric()  # logged, not an attribute of the module
    preds, target = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 2, 1])
    holder.set.update(preds, target)
    holder.cat.update(torch.tensor([1.0, 2.0]))
    loose.update(torch.tensor(3.0))
    before = {k: float(v) for k, v in holder.set.compute().items()}
    with metric_states_kept(holder, [loose]):
        holder.set.update(target, preds)  # other values: every statistic would change
        holder.cat.update(torch.tensor([9.0]))
        loose.update(torch.tensor(100.0))
    assert {k: float(v) for k, v in holder.set.compute().items()} == before
    assert holder.cat.compute().tolist() == [1.0, 2.0] and float(loose.compute()) == 3.0
    # The group still shares its state: one more update reaches both members.
    holder.set.update(preds, target)
    members = dict(holder.set.items(keep_base=True, copy_state=False))
    assert members["acc"].tp is members["prec"].tp and int(members["acc"].tp.sum()) == 6


def test_a_metric_returning_several_values_is_refused() -> None:
    class Vector(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.cat = torchmetrics.CatMetric()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.cat(torch.tensor([1.0, 2.0]))
            self.log("cat", self.cat, on_step=False, on_epoch=True)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match="'cat' returned Tensor.*needs a scalar tensor"):
        Trainer(**QUIET, max_epochs=1).fit(Vector(), data())


def _two_ranks() -> dict[str, float]:
    torch.manual_seed(0)
    trainer = Trainer(**QUIET, max_epochs=1, limit_train_batches=1)
    trainer.fit(WithMetrics(sync_dist=False), data(n=8, batch_size=4), data(n=8, batch_size=4))
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k == "val_sum"}


def test_metrics_sync_themselves_across_two_processes_once(run_distributed: Any) -> None:
    # Each rank sees 1 val batch (8 samples / 2 ranks / 4): rank 0 adds 1, rank 1 adds 101. torchmetrics syncs
    # its state in compute(): 102 on both ranks; a second (trainer) sync would give 204.
    assert run_distributed(_two_ranks, 2) == [{"val_sum": 102.0}, {"val_sum": 102.0}]


def test_torchmetrics_is_not_imported_unless_a_metric_is_logged() -> None:
    code = ("import sys, trainer, trainer.metrics.logger, callbacks; from trainer.loggers import CSVLogger; "
            "assert 'torchmetrics' not in sys.modules; print('ok')")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False)
    assert result.stdout.strip() == "ok", result.stderr
