"""Data that is not a ``DataLoader``, the loaders ``trainer.*_dataloader(s)`` show, and data that is ``None``.

Lightning 2.6 (observed) takes any iterable of batches (a wrapper around a loader, one whose ``__len__`` raises, an
endless one), refuses a fraction ``limit_*_batches`` of one without a length, hands back the objects it was given in
one process, and refuses a ``*_dataloader()`` hook that returns ``None``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import Callback
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer
from trainer.loop.data import NoDataError
from trainer.utilities.exceptions import MisconfigurationException


class Wrapper:
    """An iterable of a loader's batches that is no DataLoader; ``sized=False``: its ``__len__`` raises, as
    Lightning's ``CustomNotImplementedErrorDataloader``'s does."""

    def __init__(self, loader: DataLoader, sized: bool = True) -> None:
        self.loader, self.sized = loader, sized

    def __len__(self) -> int:
        if not self.sized:
            raise NotImplementedError
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


class Wrapped(Regressor):
    def __init__(self, sized: bool = True) -> None:
        super().__init__()
        self.sized = sized
        self.seen: dict[str, int] = {"train": 0, "val": 0, "test": 0}

    def train_dataloader(self) -> Wrapper:
        return Wrapper(data(n=16), self.sized)

    def val_dataloader(self) -> Wrapper:
        return Wrapper(data(n=8), self.sized)

    def test_dataloader(self) -> Wrapper:
        return Wrapper(data(n=8), self.sized)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        assert isinstance(self.trainer.train_dataloader, Wrapper)  # the object the hook returned
        self.seen["train"] += 1

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        assert isinstance(self.trainer.val_dataloaders, Wrapper)
        self.seen["val"] += 1

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen["test"] += 1


@pytest.mark.parametrize("sized", [True, False])
def test_an_iterable_that_is_no_data_loader_trains_validates_and_tests(sized: bool) -> None:
    module = Wrapped(sized)
    trainer = Trainer(**QUIET, max_epochs=2)
    trainer.fit(module)
    trainer.test(module, verbose=False)
    assert module.seen == {"train": 8, "val": 4, "test": 2}
    assert trainer.global_step == 8


@pytest.mark.parametrize("kind", ["train", "val", "test", "predict"])
def test_a_fraction_of_an_iterable_without_length_is_refused_with_lightnings_words(kind: str) -> None:
    module = Wrapped(sized=False)
    module.predict_dataloader = module.test_dataloader  # type: ignore[method-assign]
    trainer = Trainer(**QUIET, max_epochs=1, **{f"limit_{kind}_batches": 0.5})
    run = {"train": trainer.fit, "val": trainer.validate, "test": trainer.test, "predict": trainer.predict}[kind]
    with pytest.raises(MisconfigurationException, match=rf"When using an `IterableDataset`, `Trainer\(limit_{kind}_"
                                                        r"batches\)` must be `1.0` or an int\..*Received .*=0.5"):
        run(module)
    Trainer(**QUIET, max_epochs=1, **{f"limit_{kind}_batches": 1}).fit(module)  # an int count works


def test_an_endless_iterable_runs_with_an_int_limit() -> None:
    def endless() -> Iterator[Any]:
        while True:
            yield from data(n=8)

    class Endless:
        def __iter__(self) -> Iterator[Any]:
            return endless()

    trainer = Trainer(**QUIET, max_epochs=2, limit_train_batches=3)
    trainer.fit(Regressor(), Endless())
    assert trainer.global_step == 6


def test_the_trainer_shows_the_loaders_it_was_given() -> None:
    train, val, test = data(), data(n=8), data(n=8)
    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(Regressor(), train, val)
    assert trainer.train_dataloader is train and trainer.val_dataloaders is val
    trainer.test(Regressor(), [test, val], verbose=False)
    assert trainer.test_dataloaders[0] is test and trainer.test_dataloaders[1] is val

    class FirstOfTwo(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return super().training_step(batch["a"], batch_idx)

    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(FirstOfTwo(), {"a": train, "b": test})
    assert trainer.train_dataloader == {"a": train, "b": test}
    assert trainer.plan.train_loader is not None and trainer.plan.train_loader is not train  # the loop's: prepared


def test_a_hook_returning_none_is_refused_naming_it() -> None:
    class Nothing(Regressor):
        def val_dataloader(self) -> Any:
            return None

    with pytest.raises(TypeError, match=r"An invalid dataloader was returned from `Nothing.val_dataloader\(\)`. "
                                        r"Found None: the val data must be"):
        Trainer(**QUIET, max_epochs=1).fit(Nothing(), data())


def test_an_empty_list_of_loaders_runs_no_batches() -> None:
    # Lightning: a *_dataloader() hook returning [] is no loaders (not a dataset of no samples): fit trains without
    # validating, and validate() / test() / predict() run no batches.
    class NoLoaders(Regressor):
        def val_dataloader(self) -> Any:
            return []

        def test_dataloader(self) -> Any:
            return []

    class Count(Callback):
        batches = 0

        def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
            self.batches += 1

    count = Count()
    trainer = Trainer(**{**QUIET, "num_sanity_val_steps": 2}, max_epochs=1, callbacks=[count])
    trainer.fit(NoLoaders(), data(n=8))
    assert trainer.global_step == 2 and count.batches == 0 and trainer.val_dataloaders == []
    trainer.validate(NoLoaders(), verbose=False)
    trainer.test(NoLoaders(), verbose=False)
    assert count.batches == 0 and trainer.predict(Regressor(), dataloaders=[]) == []


@pytest.mark.parametrize("entry", ["fit", "validate", "test", "predict"])
def test_no_data_at_all_is_lightnings_type_error_and_a_value_error(entry: str) -> None:
    module = Regressor()
    argument = "train_dataloaders" if entry == "fit" else "dataloaders"
    kind = {"fit": "training", "validate": "val"}.get(entry, entry)
    with pytest.raises(NoDataError, match=rf"An invalid dataloader was passed to `Trainer.{entry}\({argument}=...\)`"
                                          rf"\. Found None\. No {kind} data: pass") as raised:
        getattr(Trainer(**QUIET, max_epochs=1), entry)(module, **{argument: None})
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, ValueError)


def test_a_resume_inside_an_epoch_of_an_iterable_says_it_is_not_exact(tmp_path: Any) -> None:
    class SaveAt(Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 1:
                trainer.save_checkpoint(str(tmp_path / "mid.ckpt"))

    Trainer(**QUIET, max_epochs=1, callbacks=[SaveAt()]).fit(Regressor(), Wrapper(data()))
    with pytest.warns(UserWarning, match=r"Resuming inside epoch at batch 2: the training data \(Wrapper\) is not a "
                                         r"torch.utils.data.DataLoader"):
        Trainer(**QUIET, max_epochs=1).fit(Regressor(), Wrapper(data()), ckpt_path=str(tmp_path / "mid.ckpt"))


def test_batches_of_an_iterable_are_moved_to_the_device() -> None:
    devices: list[torch.device] = []

    class Where(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            devices.append(batch[0].device)
            return super().training_step(batch, batch_idx)

    trainer = Trainer(**QUIET, max_epochs=1)
    trainer.fit(Where(), Wrapper(data()))
    assert devices and all(device == trainer.accelerator.device for device in devices)
