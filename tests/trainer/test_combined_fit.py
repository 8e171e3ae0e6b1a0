"""``fit`` over several training loaders, and evaluation loaders given as a collection.

Expected values were observed from Lightning 2.6.6 (tests/parity_scripts/record_combined_loader.py): the batch
``training_step`` receives for each way of returning the training data, ``trainer.num_training_batches`` (with
``limit_train_batches`` applied to each loader, then combined), the accumulation and validation cadence, and
the shapes of ``trainer.train_dataloader`` / ``val_dataloaders``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.trainer.helpers import QUIET
from tests.trainer.test_combined_loader import plain
from trainer import Trainer, TrainModule
from trainer.utilities import CombinedLoader


class Recorder(TrainModule):
    def __init__(self, data: Any, val: Any = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.data, self.val = data, val
        if val is None:  # no validation data: the hook is switched off (one returning None is refused, as in Lightning)
            self.val_dataloader = None  # type: ignore[method-assign]
        self.seen: list[Any] = []
        self.val_seen: list[int] = []

    def train_dataloader(self) -> Any:
        return self.data

    def val_dataloader(self) -> Any:
        return self.val

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(plain(batch))
        return self.layer(torch.ones(1, 1)).sum()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.val_seen.append(dataloader_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return batch  # no forward: without this, predict is refused before its data is looked at (Lightning's order)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def shapes() -> dict[str, Any]:
    a, b = DataLoader(torch.arange(6.0), batch_size=2), DataLoader(torch.arange(10.0, 14.0), batch_size=2)
    return {"dict": {"a": a, "b": b}, "list": [a, b], "tuple": (a, b), "one-list": [a],
            "combined-min": CombinedLoader({"a": a, "b": b}, "min_size"),
            "combined-max": CombinedLoader([a, b], "max_size")}


A, B = [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], [[10.0, 11.0], [12.0, 13.0]]
# Lightning 2.6.6: per shape and limit_train_batches, (num_training_batches, the batches training_step received).
RECORDED = {
    ("dict", 1.0): (3, [{"a": A[0], "b": B[0]}, {"a": A[1], "b": B[1]}, {"a": A[2], "b": B[0]}]),
    ("dict", 2): (2, [{"a": A[0], "b": B[0]}, {"a": A[1], "b": B[1]}]),
    ("dict", 0.5): (1, [{"a": A[0], "b": B[0]}]),
    ("list", 1.0): (3, [[A[0], B[0]], [A[1], B[1]], [A[2], B[0]]]),
    ("list", 2): (2, [[A[0], B[0]], [A[1], B[1]]]),
    ("list", 0.5): (1, [[A[0], B[0]]]),
    ("tuple", 1.0): (3, [(A[0], B[0]), (A[1], B[1]), (A[2], B[0])]),
    ("tuple", 2): (2, [(A[0], B[0]), (A[1], B[1])]),
    ("tuple", 0.5): (1, [(A[0], B[0])]),
    ("one-list", 1.0): (3, [[A[0]], [A[1]], [A[2]]]),  # a list of one loader: list-shaped batches
    ("one-list", 2): (2, [[A[0]], [A[1]]]),
    ("one-list", 0.5): (1, [[A[0]]]),
    ("combined-min", 1.0): (2, [{"a": A[0], "b": B[0]}, {"a": A[1], "b": B[1]}]),
    ("combined-min", 2): (2, [{"a": A[0], "b": B[0]}, {"a": A[1], "b": B[1]}]),
    ("combined-min", 0.5): (1, [{"a": A[0], "b": B[0]}]),
    ("combined-max", 1.0): (3, [[A[0], B[0]], [A[1], B[1]], [A[2], None]]),
    ("combined-max", 2): (2, [[A[0], B[0]], [A[1], B[1]]]),
    ("combined-max", 0.5): (1, [[A[0], B[0]]]),
}


@pytest.mark.parametrize(("shape", "limit"), list(RECORDED))
def test_training_batches_have_lightnings_shape_and_count(shape: str, limit: float) -> None:
    model = Recorder(shapes()[shape])
    trainer = Trainer(**QUIET, max_epochs=1, limit_train_batches=limit)
    trainer.fit(model)
    count, batches = RECORDED[(shape, limit)]
    assert trainer.num_training_batches == count
    assert model.seen == batches


def test_sequential_mode_is_refused_for_training_after_counting() -> None:
    loaders = {"a": [DataLoader(torch.arange(4.0)), DataLoader(torch.arange(2.0))]}
    trainer = Trainer(**QUIET, max_epochs=1)
    with pytest.raises(ValueError, match='`_FitLoop` does not support the `CombinedLoader\\(mode="sequential"\\)` '
                                         "mode. The available modes are: \\['min_size', 'max_size_cycle', "
                                         "'max_size'\\]"):
        trainer.fit(Recorder(CombinedLoader(loaders, "sequential")))
    assert trainer.num_training_batches == 6  # as Lightning: counted (4 + 2) before refusing


def test_accumulation_validation_cadence_and_loader_views() -> None:
    """A loader of one batch ends at every step: the accumulation window still closes every 3 batches and at
    the epoch's end (not at that loader's end), validation runs every 2 batches over a dict of loaders."""
    a, b = DataLoader(torch.arange(8.0), batch_size=2), DataLoader(torch.arange(2.0), batch_size=2)
    val = {"x": DataLoader(torch.arange(4.0), batch_size=2), "y": DataLoader(torch.arange(2.0), batch_size=2)}
    model = Recorder({"a": a, "b": b}, val)
    trainer = Trainer(**QUIET, max_epochs=2, accumulate_grad_batches=3, val_check_interval=2)
    trainer.fit(model)
    assert trainer.global_step == 4 and trainer.num_training_batches == 4
    assert model.val_seen == [0, 0, 1] * 4
    assert isinstance(trainer.val_dataloaders, dict) and sorted(trainer.val_dataloaders) == ["x", "y"]
    assert isinstance(trainer.train_dataloader, dict) and sorted(trainer.train_dataloader) == ["a", "b"]
    trainer.validate(model, DataLoader(torch.arange(4.0), batch_size=2), verbose=False)
    assert isinstance(trainer.val_dataloaders, DataLoader)  # one loader given: one loader shown, not a list


def test_evaluation_takes_a_sequential_combined_loader_and_refuses_other_modes() -> None:
    model = Recorder(DataLoader(torch.arange(2.0)))
    trainer = Trainer(**QUIET, max_epochs=1)
    sequential = CombinedLoader([DataLoader(torch.arange(4.0), batch_size=2), DataLoader(torch.arange(2.0))],
                                "sequential")
    trainer.validate(model, sequential, verbose=False)
    assert model.val_seen == [0, 0, 1, 1]
    assert isinstance(trainer.val_dataloaders, list) and len(trainer.val_dataloaders) == 2
    with pytest.raises(ValueError, match=r'`trainer.predict\(\)` only supports the `CombinedLoader\(mode='
                                         r'"sequential"\)` mode'):
        trainer.predict(model, CombinedLoader([DataLoader(torch.arange(2.0))], "max_size"))


def test_a_collection_must_hold_data_loaders() -> None:
    with pytest.raises(TypeError, match=r"returned from `Recorder.train_dataloader\(\)`\. Found range: the train data "
                                        r"must be a torch.utils.data.DataLoader"):
        Trainer(**QUIET, max_epochs=1).fit(Recorder({"a": DataLoader(torch.arange(2.0)), "b": range(3)}))


def test_one_loader_keeps_the_one_loader_path() -> None:
    loader = DataLoader(torch.arange(4.0), batch_size=2)
    model = Recorder(loader)
    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(model)
    assert trainer.plan.combined is None
    assert isinstance(trainer.plan.train_loader, DataLoader)  # iterated directly, no combining wrapper
    assert model.seen == [[0.0, 1.0], [2.0, 3.0]]


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(torch.arange(float(self.n)))


@pytest.mark.parametrize("mode", ["max_size_cycle", "max_size", "min_size"])
def test_a_loader_without_length_ends_the_epoch_as_in_lightning(mode: str) -> None:
    """An iterable dataset (3 batches, length unknown) with a 2-batch loader: Lightning 2.6.6's batches over 2
    epochs (its num_training_batches is inf where Ember's is None, Ember's "unknown" as for one loader)."""
    data = CombinedLoader({"a": DataLoader(Stream(5), batch_size=2),
                           "b": DataLoader(torch.arange(4.0), batch_size=2)}, mode)  # type: ignore[arg-type]
    model = Recorder(data)
    trainer = Trainer(**QUIET, max_epochs=2)
    trainer.fit(model)
    first, second, last_a = {"a": [0.0, 1.0], "b": [0.0, 1.0]}, {"a": [2.0, 3.0], "b": [2.0, 3.0]}, [4.0]
    epoch = {"max_size_cycle": [first, second, {"a": last_a, "b": [0.0, 1.0]}],
             "max_size": [first, second, {"a": last_a, "b": None}], "min_size": [first, second]}[mode]
    assert model.seen == epoch * 2
    assert trainer.num_training_batches == (2 if mode == "min_size" else None)
