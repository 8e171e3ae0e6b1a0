"""fast_dev_run, limit_*, val_check_interval, stop conditions, overfit_batches, accumulation edge cases."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from callbacks import Callback
from tests.trainer.helpers import QUIET, MemoryTracker, Recorder, Regressor, data, fit, indexed
from trainer import Trainer


class ValidationSteps(Callback):
    """The global step at each (non-sanity) validation run, and the batches each run saw."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.batches: list[int] = []

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        if not trainer.sanity_checking:
            self.steps.append(trainer.global_step)
            self.batches.append(0)

    def on_validation_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        if not trainer.sanity_checking:
            self.batches[-1] += 1


def _count(recorder: Any, hook: str) -> int:
    return recorder.events.count(hook)


@pytest.mark.parametrize("fast_dev_run, batches", [(True, 1), (2, 2)])
def test_fast_dev_run_runs_n_batches_of_each_stage_without_trackers(fast_dev_run: bool | int, batches: int) -> None:
    recorder, tracker = Recorder(), MemoryTracker()
    trainer = Trainer(**{**QUIET, "num_sanity_val_steps": 2, "log_with": [tracker]}, fast_dev_run=fast_dev_run,
                      callbacks=[recorder], log_every_n_steps=1)
    module = Regressor()
    trainer.fit(module, data(n=40), data(n=40))
    assert trainer.global_step == batches and trainer.current_epoch == 1
    assert _count(recorder, "on_validation_batch_end") == batches  # and no sanity check
    assert "on_sanity_check_start" not in recorder.events
    trainer.test(module, data(n=40), verbose=False)
    assert len(trainer.predict(module, data(n=40))) == batches
    assert _count(recorder, "on_test_batch_end") == batches
    assert tracker.rows == []


def test_limit_batches_int_float_and_zero() -> None:
    validation = ValidationSteps()
    trainer = fit(Regressor(), data(n=32), data(n=32), max_epochs=2, limit_train_batches=0.5, limit_val_batches=3,
                  callbacks=[validation])
    assert trainer.global_step == 8 and validation.batches == [3, 3]
    validation = ValidationSteps()
    fit(Regressor(), data(n=32), data(n=32), max_epochs=1, limit_val_batches=0, callbacks=[validation])
    assert validation.steps == []
    recorder = Recorder()
    trainer = fit(Regressor(), data(n=32), data(n=32), max_epochs=2, limit_train_batches=0, callbacks=[recorder],
                  num_sanity_val_steps=1)
    assert trainer.global_step == 0 and "on_train_epoch_start" not in recorder.events
    assert "on_sanity_check_start" in recorder.events
    trainer = Trainer(**QUIET, limit_test_batches=1, limit_predict_batches=0.5)
    recorder = Recorder()
    trainer.callbacks.append(recorder)
    trainer.test(Regressor(), data(n=32), verbose=False)
    assert _count(recorder, "on_test_batch_end") == 1
    assert len(trainer.predict(Regressor(), data(n=32))) == 4


@pytest.mark.parametrize("kwargs, steps, every", [
    ({"val_check_interval": 2}, [2, 4, 6, 8, 10, 12], 2),
    ({"val_check_interval": 0.5}, [3, 6, 9, 12], 3),
    ({"val_check_interval": 1.0}, [6, 12], 6),
    ({"check_val_every_n_epoch": 2}, [12], 6),
    ({"check_val_every_n_epoch": None, "val_check_interval": 4}, [4, 8, 12], 4),
])
def test_validation_timing(kwargs: dict[str, Any], steps: list[int], every: int) -> None:
    validation = ValidationSteps()
    trainer = fit(Regressor(), data(n=24), data(n=8), max_epochs=2, callbacks=[validation], **kwargs)  # 6 / epoch
    assert validation.steps == steps
    assert trainer.val_check_batch == every  # Lightning's name for the interval in batches


def test_validation_once_per_epoch_for_a_loader_without_length() -> None:
    class Stream(IterableDataset):
        def __iter__(self) -> Any:
            generator = torch.Generator().manual_seed(0)
            for _ in range(10):
                x = torch.randn(3, generator=generator)
                yield x, x.sum(0, keepdim=True)

    validation = ValidationSteps()
    trainer = fit(Regressor(), DataLoader(Stream(), batch_size=4), data(n=8), max_epochs=2, callbacks=[validation])
    assert trainer.num_training_batches is None and trainer.val_check_batch == float("inf")
    assert validation.steps == [3, 6]


def test_max_steps_stops_mid_epoch_and_ends_the_epoch() -> None:
    recorder = Recorder()
    trainer = fit(Regressor(), data(n=16), max_steps=5, max_epochs=10, callbacks=[recorder])
    assert trainer.global_step == 5
    assert _count(recorder, "on_train_epoch_end") == 2 and trainer.current_epoch == 2


class StopAfter(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def test_should_stop_and_min_epochs() -> None:
    trainer = fit(Regressor(), data(n=12), max_epochs=5, callbacks=[StopAfter(2)])  # 3 batches / epoch
    assert trainer.global_step == 2 and trainer.should_stop
    with pytest.warns(UserWarning, match="before min_epochs=2"):
        trainer = fit(Regressor(), data(n=12), max_epochs=5, min_epochs=2, callbacks=[StopAfter(2)])
    # The stop waits for min_epochs: it happens when epoch 1 ends (2 epochs done), as in Lightning.
    assert trainer.global_step == 6 and trainer.current_epoch == 2


def test_max_time_stops_at_the_next_step() -> None:
    class Slow(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(0.25)

    trainer = fit(Regressor(), data(n=16), max_epochs=5, max_time=0.2, callbacks=[Slow()])
    assert trainer.global_step == 1 and trainer.state.time_elapsed >= 0.2


def test_max_time_shows_a_timer_that_leaves_the_stop_to_the_trainer() -> None:
    # Lightning adds a Timer for max_time; the trainer's clock still enforces the limit (its stop saves the
    # resumable checkpoint), so the visible Timer must not stop the run itself.
    from callbacks import Timer

    trainer = Trainer(**QUIET, max_time={"seconds": 1337}, max_epochs=2)
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
    assert len(timers) == 1 and timers[0]._duration == 1337
    timers[0]._duration = 0.0  # spent at once: were it enforcing, the run would stop after its first step
    trainer.fit(Regressor(), data(n=16))
    assert trainer.global_step == 8 and timers[0].time_remaining() < 0
    given = Timer(duration="00:00:00:05")
    trainer = Trainer(**QUIET, max_time={"seconds": 1337}, callbacks=[given])
    assert [c for c in trainer.callbacks if isinstance(c, Timer)] == [given]  # a given Timer: none added
    assert not any(isinstance(c, Timer) for c in Trainer(**QUIET).callbacks)


class SeenIndices(Regressor):
    def __init__(self) -> None:
        super().__init__(features=1)
        self.train_seen: list[list[int]] = []
        self.val_seen: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        index, x = batch
        self.train_seen.append(index.tolist())
        return torch.nn.functional.mse_loss(self(x), x)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_seen += batch[0].tolist()


def test_overfit_batches_repeats_the_same_unshuffled_batches() -> None:
    module = SeenIndices()
    shuffled = DataLoader(indexed(20, 4).dataset, batch_size=4, shuffle=True)
    lightning_warning = "You requested to overfit but enabled train dataloader shuffling"  # Lightning 2.6's text
    with pytest.warns(UserWarning, match=lightning_warning):
        fit(module, shuffled, indexed(20, 4), max_epochs=2, overfit_batches=2)
    assert module.train_seen == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    assert module.val_seen == list(range(8)) * 2
    # As Lightning (test_overfit_batches_raises_warning_in_case_of_sequential_sampler): any sampler but a
    # sequential one is replaced, a custom one too.
    module, dataset = SeenIndices(), indexed(20, 4).dataset
    backwards = DataLoader(dataset, batch_size=4, sampler=list(reversed(range(20))))
    with pytest.warns(UserWarning, match=lightning_warning):
        fit(module, backwards, indexed(20, 4), max_epochs=1, overfit_batches=1)
    assert module.train_seen == [[0, 1, 2, 3]]


class IndexStream(IterableDataset):
    """(index, feature) pairs 0..7 in order: an iterable training set has no sampler to replace."""

    def __iter__(self) -> Any:
        for index in range(8):
            yield torch.tensor(index), torch.tensor([float(index)])


def test_overfit_batches_keeps_an_iterable_datasets_order_with_lightnings_warning() -> None:
    # Lightning 2.6.6 (observed): the same warning, then the first batches of the stream every epoch; torch
    # refuses a sampler for an IterableDataset, so replacing it failed before.
    module = SeenIndices()
    with pytest.warns(UserWarning, match="You requested to overfit but enabled train dataloader shuffling"):
        fit(module, DataLoader(IndexStream(), batch_size=2), indexed(20, 4), max_epochs=2, overfit_batches=2)
    assert module.train_seen == [[0, 1], [2, 3]] * 2


def test_the_last_batch_of_a_limited_epoch_steps_with_accumulation() -> None:
    trainer = fit(Regressor(), data(n=32), max_epochs=2, accumulate_grad_batches=3, limit_train_batches=4)
    assert trainer.global_step == 4  # per epoch: after batch 3, then the short window of batch 4


def test_none_skips_the_batch_and_minus_one_ends_the_epoch() -> None:
    class Skipping(Regressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return None if batch_idx == 1 else super().training_step(batch, batch_idx)

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
            return -1 if batch_idx == 3 else None

    # 6 batches: 0, 1 and 2 step (1 skips its backward, its step counts as in Lightning); 3 ends the epoch
    trainer = fit(Skipping(), data(n=24), max_epochs=2)
    assert trainer.global_step == 6 and trainer.current_epoch == 2


def test_weights_match_a_plain_pytorch_loop() -> None:
    """Accumulation 2 over 5 batches (the last window is short), norm clipping: the same math as by hand."""
    module = Regressor(lr=0.1)
    reference = copy.deepcopy(module)
    loader = data(n=20, batch_size=4, seed=3)
    fit(module, loader, max_epochs=2, accumulate_grad_batches=2, gradient_clip_val=0.5)

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        for i, (x, y) in enumerate(loader):
            (torch.nn.functional.mse_loss(reference(x), y) / 2).backward()
            if (i + 1) % 2 == 0 or i == len(loader) - 1:
                torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
                optimizer.step()
                optimizer.zero_grad()
    for got, expected in zip(module.parameters(), reference.parameters()):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("precision, engine_value, dtype", [
    ("bf16-mixed", "bf16", torch.bfloat16), ("16-mixed", "fp16", torch.float16), ("32", "no", torch.float32)])
def test_precision_strings_reach_the_engine_and_steps_run_under_autocast(precision: str, engine_value: str,
                                                                        dtype: torch.dtype) -> None:
    class Dtypes(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[torch.dtype] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.seen.append(self(batch[0]).dtype)
            return super().training_step(batch, batch_idx)

    module = Dtypes()
    trainer = fit(module, data(n=8), max_epochs=1, precision=precision, gradient_clip_val=1.0)
    assert trainer.accelerator.mixed_precision == engine_value and trainer.global_step == 2
    assert module.seen == [dtype, dtype]


@pytest.mark.parametrize("interval", ["00:00:00:02", {"seconds": 2}, __import__("datetime").timedelta(seconds=2)])
def test_val_check_interval_as_a_time(monkeypatch: pytest.MonkeyPatch, interval: Any) -> None:
    # Lightning 2.6's time-based validation: every 2 s of training. A fake clock gains 1 s per reading; it is read
    # when training starts and after every batch, so validation runs after every second batch, and not again at
    # the epoch's end.
    from trainer.loop import plan

    ticks = iter(range(10_000))
    monkeypatch.setattr(plan.time, "monotonic", lambda: float(next(ticks)))
    recorder = Recorder()
    trainer = fit(Regressor(), data(n=24), data(n=4), max_epochs=1, val_check_interval=interval, callbacks=[recorder])
    assert trainer.global_step == 6 and _count(recorder, "on_validation_start") == 3
    assert trainer.val_check_batch is None  # no batch count: a time decides
    with pytest.raises(ValueError, match="must be a positive time"):
        Trainer(**QUIET, val_check_interval="00:00:00:00")
