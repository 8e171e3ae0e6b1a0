"""torchmetrics ``Metric`` / ``MetricCollection`` objects logged in validation and test on an evaluation set that
does not split evenly (promise 8 for Metric objects): every real sample reaches ``update`` once, on 1 and 2
processes, under DDP and FSDP2, with and without ``drop_last``; the values are Lightning 2.6's, recorded by
tests/parity_scripts/record_torchmetrics_uneven.py into torchmetrics_uneven_expected.py.

With 18 samples in batches of 4 on 2 processes, process 1's third batch holds only repeats of samples 2-5 (three
of them mispredicted): counted, they turn 14/18 into 15/22.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import run_distributed
from tests.distributed.torchmetrics_uneven_expected import EXPECTED
from tests.trainer.helpers import QUIET
from trainer import Trainer, TrainModule

WRONG = (2, 3, 5, 10)  # the samples predicted wrongly (the same as the recording script's)


def _loader(n: int, drop_last: bool) -> DataLoader:
    labels = torch.arange(n) % 3
    predicted = labels.clone()
    for i in WRONG:
        if i < n:
            predicted[i] = (labels[i] + 1) % 3
    x = torch.nn.functional.one_hot(predicted, 3).float()
    return DataLoader(TensorDataset(x, labels), batch_size=4, drop_last=drop_last)


def _metrics() -> tuple[Any, Any]:
    collection = torchmetrics.MetricCollection({
        "acc_macro": torchmetrics.classification.MulticlassAccuracy(3, average="macro"),
        "prec_macro": torchmetrics.classification.MulticlassPrecision(3, average="macro")})  # one compute group
    return torchmetrics.classification.MulticlassAccuracy(3, average="micro"), collection


class Classifier(TrainModule):
    """Logs a Metric, a MetricCollection (through log_dict) and the plain batch accuracy, as the recorded module."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 3)
        self.val_acc, self.val_set = _metrics()
        self.test_acc, self.test_set = _metrics()
        self.seen: list[int] = []  # samples each step received (this process)

    def _step(self, stage: str, batch: Any) -> None:
        x, y = batch
        self.seen.append(len(y))
        logits = x + 0 * self.net(x)  # the model runs (FSDP2 gathers its parameters); the data decides
        acc, collection = (self.val_acc, self.val_set) if stage == "val" else (self.test_acc, self.test_set)
        acc(logits, y)
        self.log(f"{stage}/acc", acc)
        collection(logits, y)
        self.log_dict({f"{stage}/{k}": v for k, v in collection.items(keep_base=False, copy_state=False)})
        self.log(f"{stage}/acc_tensor", (logits.argmax(1) == y).float().mean())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step("val", batch)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step("test", batch)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _evaluate(n: int, drop_last: bool, fsdp: bool = False) -> dict[str, Any]:
    from engine import Accelerator, FullyShardedDataParallelPlugin

    if fsdp:  # an Accelerator brings its own settings (no trackers: the default Accelerator has none)
        quiet = {k: v for k, v in QUIET.items() if k != "log_with"}
        trainer = Trainer(**quiet, accelerator=Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()))
    else:
        trainer = Trainer(**QUIET, accelerator="cpu")
    module = Classifier()
    val = trainer.validate(module, _loader(n, drop_last), verbose=False)[0]
    test = trainer.test(module, _loader(n, drop_last), verbose=False)[0]
    return {"val": val, "test": test, "seen": module.seen}


def _assert_recorded(result: dict[str, Any], key: str) -> None:
    for stage in ("val", "test"):
        expected = EXPECTED[key][stage]
        assert result[stage] == pytest.approx(expected, abs=1e-6), (key, stage)


@pytest.mark.parametrize("drop_last", [False, True])
def test_metric_objects_count_each_real_sample_once_on_one_and_two_processes(drop_last: bool) -> None:
    key = f"n=18 devices=1 drop_last={drop_last}"
    _assert_recorded(_evaluate(18, drop_last), key)
    ranks = run_distributed(_evaluate, 2, 18, drop_last)
    for rank in ranks:
        _assert_recorded(rank, key)  # the one-process value, and Lightning's on 2 processes (18 splits evenly there)
        _assert_recorded(rank, f"n=18 devices=2 drop_last={drop_last}")
    if not drop_last:  # process 1's last batch is all repeats: its step still ran (the processes stay in step)
        assert ranks[0]["seen"] == [4, 4, 2] * 2 and ranks[1]["seen"] == [4, 4, 4] * 2


def test_an_odd_set_is_exact_where_lightnings_sampler_counts_a_repeat() -> None:
    ranks = run_distributed(_evaluate, 2, 19, False)
    for rank in ranks:
        _assert_recorded(rank, "n=19 devices=1 drop_last=False")  # 15/19, as on one process
    # Lightning's DistributedSampler repeats sample 0 on 2 processes: 16/20 (the README says so).
    assert EXPECTED["n=19 devices=2 drop_last=False"]["val"]["val/acc"] == pytest.approx(0.8)


def test_metric_objects_count_each_real_sample_once_under_fsdp2() -> None:
    for rank in run_distributed(_evaluate, 2, 18, False, True):
        _assert_recorded(rank, "n=18 devices=1 drop_last=False")
