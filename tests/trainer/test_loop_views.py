"""``trainer.fit_loop`` / ``validate_loop`` / ``test_loop`` / ``predict_loop``: read-only views of Ember's state
that read as Lightning 2.6.6's loop objects do (values recorded with ``tests/parity_scripts/record_loop_views.py``
on Lightning: 3 training batches per epoch, 2 epochs, validation of 2 batches after every 2nd training batch)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from callbacks import Callback
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer


def _counts(progress: Any) -> tuple[int, int, int, int]:
    return progress.ready, progress.started, progress.processed, progress.completed


class LoopReader(Callback):
    """What the loop views read at a few hooks (the parts Lightning's tests and user code read)."""

    def __init__(self) -> None:
        self.seen: dict[str, list[Any]] = {}

    def _read(self, trainer: Any, hook: str) -> None:
        loop = trainer.fit_loop
        self.seen.setdefault(hook, []).append({
            "total_batch_idx": loop.total_batch_idx,
            "batch_idx": loop.batch_idx,
            "epoch": _counts(loop.epoch_progress.total),
            "val_total": _counts(loop.epoch_loop.val_loop.batch_progress.total),
            "val_current": _counts(loop.epoch_loop.val_loop.batch_progress.current),
            "global_step": loop.epoch_loop.global_step,
        })

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self._read(trainer, "on_validation_start")

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        self._read(trainer, "on_validation_end")

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self._read(trainer, "on_train_epoch_end")

    def on_train_end(self, trainer: Any, module: Any) -> None:
        self._read(trainer, "on_train_end")


@pytest.fixture
def run() -> tuple[Trainer, LoopReader]:
    reader = LoopReader()
    trainer = Trainer(**{**QUIET, "max_epochs": 2, "limit_val_batches": 2, "val_check_interval": 2,
                         "callbacks": [reader]})
    loader = data(n=12, batch_size=4)  # 3 batches
    trainer.fit(Regressor(), loader, loader)
    return trainer, reader


def test_fit_loop_counters_during_fit_read_as_lightning(run: tuple[Trainer, LoopReader]) -> None:
    _, reader = run
    # Lightning 2.6.6 (record_loop_views.py): validation starts after batch index 1, then 4 (total over epochs).
    assert [s["total_batch_idx"] for s in reader.seen["on_validation_start"]] == [1, 4]
    assert [s["batch_idx"] for s in reader.seen["on_validation_start"]] == [1, 1]
    assert [s["epoch"] for s in reader.seen["on_validation_start"]] == [(1, 1, 0, 0), (2, 2, 1, 1)]
    assert [s["val_total"] for s in reader.seen["on_validation_end"]] == [(2, 2, 2, 2)] * 2
    # At an epoch's end: that epoch processed, not completed; its validation batches counted in the total.
    assert [s["epoch"] for s in reader.seen["on_train_epoch_end"]] == [(1, 1, 1, 0), (2, 2, 2, 1)]
    assert [s["val_total"] for s in reader.seen["on_train_epoch_end"]] == [(2, 2, 2, 2)] * 2
    assert [s["global_step"] for s in reader.seen["on_train_epoch_end"]] == [3, 6]
    assert reader.seen["on_train_end"][0]["epoch"] == (2, 2, 2, 2)


def test_fit_loop_after_fit_reads_as_lightning(run: tuple[Trainer, LoopReader]) -> None:
    trainer, _ = run
    loop = trainer.fit_loop
    assert (loop.max_epochs, loop.min_epochs, loop.max_steps, loop.min_steps) == (2, 0, -1, None)
    assert (loop.total_batch_idx, loop.batch_idx, loop.done, loop.restarting) == (5, 2, True, False)
    assert _counts(loop.epoch_progress.current) == (2, 2, 2, 2)
    assert loop.epoch_progress.current.processed == trainer.current_epoch == 2
    batches = loop.epoch_loop.batch_progress
    assert (_counts(batches.total), _counts(batches.current), batches.is_last_batch) == (
        (6, 6, 6, 6), (3, 3, 3, 3), True)
    assert _counts(loop.epoch_loop.val_loop.batch_progress.total) == (2, 2, 2, 2)


def test_evaluation_loops_count_their_batches(run: tuple[Trainer, LoopReader]) -> None:
    trainer, _ = run
    loader = data(n=12, batch_size=4)
    trainer.test(trainer.module, dataloaders=loader, verbose=False)
    assert _counts(trainer.test_loop.batch_progress.total) == (3, 3, 3, 3)
    assert trainer.test_loop.batch_progress.is_last_batch
    predictions = trainer.predict(trainer.module, dataloaders=loader)
    assert _counts(trainer.predict_loop.batch_progress.current) == (3, 3, 3, 3)
    assert trainer.predict_loop.predictions is not None and len(trainer.predict_loop.predictions) == len(predictions)
    assert _counts(trainer.validate_loop.batch_progress.total) == (0, 0, 0, 0)  # validate() never ran


def test_loop_views_are_read_only_but_the_limits_can_be_raised(run: tuple[Trainer, LoopReader]) -> None:
    trainer, _ = run
    with pytest.raises(AttributeError, match="read-only view"):
        trainer.fit_loop.epoch_progress = None
    with pytest.raises(AttributeError, match="read-only view"):
        trainer.fit_loop.epoch_loop.val_loop.batch_progress = None
    trainer.fit_loop.max_epochs = 3  # as Lightning scripts do before another fit
    assert trainer.max_epochs == 3 and trainer.fit_loop.max_epochs == 3
    trainer.fit_loop.epoch_loop.max_steps = 20
    assert trainer.max_steps == 20


def test_fit_validation_total_counts_the_current_epoch_only() -> None:
    """Lightning resets fit's validation total when an epoch starts: an epoch without validation reads 0."""
    totals: list[int] = []

    class Reader(Callback):
        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            totals.append(trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed)

    trainer = Trainer(**{**QUIET, "max_epochs": 4, "limit_val_batches": 1, "check_val_every_n_epoch": 2,
                         "callbacks": [Reader()]})
    trainer.fit(Regressor(), data(), data())
    assert totals == [0, 1, 0, 1]


class RestartReader(Callback):
    """``(hook, epoch, batch_idx, fit_loop.restarting, fit_loop.epoch_loop.restarting)`` at a few hooks."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int, bool, bool]] = []

    def _read(self, trainer: Any, hook: str, batch_idx: int = -1) -> None:
        loop = trainer.fit_loop
        self.seen.append((hook, trainer.current_epoch, batch_idx, loop.restarting, loop.epoch_loop.restarting))

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self._read(trainer, "batch_start", batch_idx)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self._read(trainer, "epoch_end")


class SaveAt(Callback):
    def __init__(self, path: str, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def test_restarting_is_true_only_after_a_resume_from_inside_an_epoch(tmp_path: Any) -> None:
    # Lightning 2.6.6 (observed, 4 batches per epoch): a resume from an epoch's end is no restart; one from step 6
    # (epoch 1, batch 2) restarts: fit_loop.restarting until that epoch ends, epoch_loop.restarting for its
    # first batch only.
    kwargs = {**QUIET, "enable_checkpointing": True, "project_dir": str(tmp_path), "log_with": None}
    Trainer(**{**kwargs, "max_epochs": 1}).fit(Regressor(), data())
    reader = RestartReader()
    Trainer(**{**kwargs, "max_epochs": 2, "callbacks": [reader]}).fit(Regressor(), data(), ckpt_path="last")
    assert not any(restart for *_, fit, epoch in reader.seen for restart in (fit, epoch))
    middle = str(tmp_path / "middle.ckpt")
    Trainer(**{**QUIET, "max_epochs": 2, "callbacks": [SaveAt(middle, 6)]}).fit(Regressor(), data())
    reader = RestartReader()
    Trainer(**{**QUIET, "max_epochs": 3, "callbacks": [reader]}).fit(Regressor(), data(), ckpt_path=middle)
    assert reader.seen[:4] == [("batch_start", 1, 2, True, True), ("batch_start", 1, 3, True, False),
                               ("epoch_end", 1, -1, True, False), ("batch_start", 2, 0, False, False)]
    assert not any(fit or epoch for *_, fit, epoch in reader.seen[3:])


def test_fit_loop_state_dict_is_the_checkpoints_loops_entry(run: tuple[Trainer, LoopReader], tmp_path: Any) -> None:
    trainer, _ = run
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(str(path))
    assert trainer.fit_loop.state_dict() == torch.load(path, weights_only=True)["loops"]["fit_loop"]


@pytest.mark.parametrize(("max_epochs", "max_steps", "done"), [
    (None, -1, False), (-1, -1, False), (5, -1, False), (-1, 10, False), (None, 0, True), (0, -1, True),
    (-1, 0, True)])
def test_fit_loop_done_before_fit_as_lightning(max_epochs: int | None, max_steps: int, done: bool) -> None:
    assert Trainer(**QUIET, max_epochs=max_epochs, max_steps=max_steps).fit_loop.done is done


def test_all_sanity_steps_read_as_inf() -> None:
    assert Trainer(**{**QUIET, "num_sanity_val_steps": -1}).num_sanity_val_steps == float("inf")
    assert Trainer(**{**QUIET, "num_sanity_val_steps": 2}).num_sanity_val_steps == 2


def test_the_epoch_and_step_counters_lightning_code_sets_write_the_train_state(tmp_path: Any) -> None:
    """Lightning code moves current_epoch / global_step through the loops' progress counters; Ember's views pass
    those two assignments on to TrainState (the counters' one owner), so a ModelCheckpoint driven by hand saves
    under the names the counters give."""
    from callbacks import ModelCheckpoint
    from trainer.states import TrainerFn

    trainer = Trainer(**QUIET)
    loop = trainer.fit_loop
    loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total.completed = 7
    loop.epoch_progress.current.completed = 2
    assert (trainer.global_step, trainer.current_epoch, trainer.state.global_step, trainer.state.epoch) == (7, 2, 7, 2)
    assert loop.epoch_loop.automatic_optimization.optim_progress.optimizer_steps == 7
    assert loop.epoch_loop.manual_optimization.optim_step_progress.total.completed == 0  # automatic without a module
    with pytest.raises(AttributeError, match="does not use manual optimisation"):
        loop.epoch_loop.manual_optimization.optim_step_progress.total.completed = 3
    with pytest.raises(AttributeError, match="per-epoch"):
        _ = loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.current
    with pytest.raises(AttributeError, match="read-only view"):
        loop.epoch_loop.automatic_optimization = None

    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", monitor="m", save_top_k=2,
                                 save_on_train_epoch_end=False)
    # No module is attached: the trainer's save would refuse, so this one only leaves the file.
    trainer.save_checkpoint = lambda path, *args: open(path, "a").close()  # type: ignore[method-assign]
    trainer.state.fn = TrainerFn.FITTING  # what fit sets: saving is allowed while fitting only
    for step, value in enumerate([3.0, 1.0, 2.0], 1):
        loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total.completed = step
        trainer.callback_metrics.update({"m": torch.tensor(value)})
        checkpoint.on_validation_end(trainer, None)  # type: ignore[arg-type]
        loop.epoch_progress.current.completed = step
    assert sorted(os.listdir(tmp_path)) == ["epoch=1.ckpt", "epoch=2.ckpt"]  # the top 2 of 3
    assert checkpoint.best_model_path.endswith("epoch=1.ckpt")
    trainer.state.fn = TrainerFn.VALIDATING  # not fitting: nothing is saved
    loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total.completed = 9
    checkpoint.on_validation_end(trainer, None)  # type: ignore[arg-type]
    assert sorted(os.listdir(tmp_path)) == ["epoch=1.ckpt", "epoch=2.ckpt"]
