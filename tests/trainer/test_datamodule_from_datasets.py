"""``DataModule.from_datasets`` and ``str(datamodule)`` as Lightning 2.6.6 shows them (values printed by lightning
2.6.6's ``LightningDataModule`` for the same datasets)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

from callbacks.exceptions import MisconfigurationException
from trainer import DataModule


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(5))


class WithArgs(DataModule):
    def __init__(self, batch_size: int = 1, flag: bool = False) -> None:
        super().__init__()
        self.batch_size, self.flag = batch_size, flag


def test_from_datasets_builds_lightnings_loaders_and_summary() -> None:
    dm = DataModule.from_datasets(TensorDataset(torch.arange(6.0)),
                                  val_dataset=[TensorDataset(torch.arange(3.0)), Stream()], batch_size=4)
    assert str(dm) == ("{Train dataloader: size=6}\n{Validation dataloader: 1. size=3 ; 2. size=NA}\n"
                       "{Test dataloader: None}\n{Predict dataloader: None}")
    train = dm.train_dataloader()
    assert [len(batch[0]) for batch in train] == [4, 2] and train.pin_memory
    assert [type(loader.sampler).__name__ for loader in dm.val_dataloader()] == ["SequentialSampler",
                                                                                "_InfiniteConstantSampler"]
    assert type(train.sampler).__name__ == "RandomSampler"  # training loaders shuffle
    with_args = WithArgs.from_datasets(predict_dataset=Stream(), batch_size=2, flag=True)
    assert (with_args.batch_size, with_args.flag) == (2, True)  # batch_size reaches __init__, which takes it
    assert str(with_args) == ("{Train dataloader: None}\n{Validation dataloader: None}\n{Test dataloader: None}\n"
                              "{Predict dataloader: size=NA}")


@pytest.mark.parametrize("method", ["val_dataloader", "test_dataloader", "predict_dataloader"])
def test_a_loader_not_given_raises_lightnings_exception(method: str) -> None:
    # Lightning raises MisconfigurationException("`val_dataloader` must be implemented ..."); code catches that.
    dm = DataModule.from_datasets(TensorDataset(torch.arange(6.0)))
    with pytest.raises(MisconfigurationException, match=f"`{method}` must be implemented to be used with the "
                                                        f"Trainer: define DataModule.{method}\\(\\), or pass"):
        getattr(dm, method)()
