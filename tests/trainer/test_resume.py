"""Exact resume (promise 1): SIGKILL anywhere, restart with ckpt_path="last", end bitwise equal; and ckpt_path.

The kill tests run ``resume_script.py`` as a real process (2 loader workers, dropout, accumulation 2, clipping,
a step-wise scheduler, validation) and SIGKILL it at chosen points; the in-process tests cover the rest.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from engine.checkpoint.io import CheckpointError
from tests.trainer.helpers import QUIET, MemoryTracker, Recorder, Regressor, data
from tests.trainer.resume_script import launch
from trainer import Trainer


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run of resume_script.py (one process)."""
    directory = str(tmp_path_factory.mktemp("reference"))
    assert launch(directory) == 0
    return directory


def assert_same_run(reference: str, resumed: str) -> None:
    expected = torch.load(os.path.join(reference, "final.pt"))
    got = torch.load(os.path.join(resumed, "final.pt"))
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name  # bitwise, not approximately
    # The csv tracker continued the same run: one run folder whose rows are exactly the uninterrupted ones.
    assert [d for d in os.listdir(os.path.join(resumed, "ember")) if not d.startswith("events.")] == ["version_0"]
    with open(os.path.join(reference, "ember", "version_0", "metrics.csv")) as a, \
            open(os.path.join(resumed, "ember", "version_0", "metrics.csv")) as b:
        assert a.read() == b.read()


def resumed_from(directory: str) -> tuple[int, ...]:
    """Where the latest start of the script began: (epoch, batch in epoch, global step)."""
    with open(os.path.join(directory, "starts.txt")) as handle:
        return tuple(int(v) for v in handle.read().splitlines()[-1].split())


def test_sigkill_at_several_points_then_resume_is_bitwise_exact(reference: str, tmp_path: Any) -> None:
    run = str(tmp_path)
    # 11 batches per epoch, accumulation 2: optimizer steps after batches 2, 4, ... 10 and 11 of each epoch.
    assert launch(run, "--kill-at", "3") == "killed"  # between the two micro-batches of step 2
    assert launch(run, "--ckpt-path", "last", "--kill-at", "16") == "killed"  # mid-epoch 1, mid-window
    assert resumed_from(run) == (0, 2, 1)  # checkpoints come after optimizer steps: batch 3 is redone
    assert launch(run, "--ckpt-path", "last", "--kill-at-epoch-end", "1") == "killed"  # last batch done
    assert resumed_from(run) == (1, 4, 8)
    assert launch(run, "--ckpt-path", "last") == 0
    assert resumed_from(run) == (1, 11, 12)  # the epoch end hooks had not run: they run now, once
    assert_same_run(reference, run)
    # only the newest is kept, and its copy as last.ckpt (save_last=True, as Lightning writes it)
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["epoch=2-step=18.ckpt", "last.ckpt"]


def _scalars(directory: str) -> dict[str, list[tuple[int, float]]]:
    """Every TensorBoard scalar of the run, as TensorBoard shows it (restart markers applied), by tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(directory, "ember"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_sigkill_then_resume_continues_csv_and_tensorboard_row_for_row(tmp_path: Any) -> None:
    """The learning rate is logged before each step's batch, at the step of the checkpoint just taken: a resumed
    run logs it again, and neither the csv (the digits demo had step 280 twice) nor TensorBoard shows it twice."""
    options = ("--lr-monitor", "--tensorboard")
    reference, run = str(tmp_path / "reference"), str(tmp_path / "run")
    assert launch(reference, *options) == 0
    # Checkpoints after every step, the learning rate logged every 2 steps (before the next step's first batch).
    assert launch(run, *options, "--kill-at", "5") == "killed"  # step 2 saved, then its lr logged at batch 4
    assert launch(run, *options, "--ckpt-path", "last", "--kill-at-epoch-end", "0") == "killed"
    assert resumed_from(run) == (0, 4, 2)
    assert launch(run, *options, "--ckpt-path", "last", "--kill-at", "15") == "killed"  # step 8 saved, its lr too
    assert launch(run, *options, "--ckpt-path", "last") == 0
    assert resumed_from(run) == (1, 4, 8)
    assert_same_run(reference, run)  # the weights bitwise, the csv byte for byte
    expected, got = _scalars(reference), _scalars(run)
    assert "lr-SGD" in expected and got == expected


def test_sigterm_saves_by_itself_exits_with_its_status_and_resumes_exactly(reference: str, tmp_path: Any) -> None:
    run = str(tmp_path)
    # No checkpoint callback: the preemption save is the only one. SIGTERM arrives mid-window (batch 9).
    assert launch(run, "--no-step-checkpoints", "--sigterm-at", "9", "--exit-code", "42") == 42
    assert os.listdir(os.path.join(run, "checkpoints")) == ["preempted"]
    assert launch(run, "--no-step-checkpoints", "--ckpt-path", "last") == 0
    assert resumed_from(run) == (0, 10, 5)  # the next optimizer-step boundary after the signal
    assert_same_run(reference, run)


# -- in one process ---------------------------------------------------------------------------------------------
class Dropout(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.drop(x))


class SaveAt(Callback):
    """Asks for a checkpoint in a hook, mid-window: it is written once the batch is completely done."""

    def __init__(self, path: str, micro_step: int) -> None:
        self.path, self.micro_step = path, micro_step

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.state.micro_step == self.micro_step:
            trainer.save_checkpoint(self.path)


def _trainer(**kwargs: Any) -> Trainer:
    return Trainer(**{**QUIET, "max_epochs": 2, "accumulate_grad_batches": 2, "seed": 0, **kwargs})


def test_mid_accumulation_checkpoint_resumes_exactly(tmp_path: Any) -> None:
    def run(ckpt_path: str | None = None, callbacks: Any = ()) -> tuple[Trainer, Dropout]:
        trainer = _trainer(callbacks=list(callbacks))  # seeds: the module and the loaders are built alike
        module = Dropout()
        trainer.fit(module, data(n=24, batch_size=4, shuffle=True), data(n=8), ckpt_path=ckpt_path)
        return trainer, module

    _, full = run()
    path = str(tmp_path / "mid")
    run(callbacks=[SaveAt(path, 3)])  # after batch 3 of 6: mid-window
    assert torch.load(path)["ember"]["ranks"][0]["gradients"]  # the pending half-window's gradients
    run(callbacks=[SaveAt(str(tmp_path / "closed"), 4)])  # after batch 4: the window closed, its gradients spent
    assert torch.load(str(tmp_path / "closed"))["ember"]["ranks"][0]["gradients"] == {}
    trainer, resumed = run(ckpt_path=path)
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    assert trainer.global_step == 6 and trainer.state.micro_step == 12


def test_last_without_a_checkpoint_starts_fresh_and_says_so(tmp_path: Any) -> None:
    trainer = _trainer(project_dir=str(tmp_path), max_epochs=1)
    # A UserWarning with Lightning's words (observed from lightning 2.6: "... No checkpoint will be loaded ...").
    with pytest.warns(UserWarning, match="no committed checkpoint in .*No checkpoint will be loaded; starting a new"):
        trainer.fit(Regressor(), data(), ckpt_path="last")
    assert trainer.global_step == 2


def test_a_missing_checkpoint_fails_before_anything_runs(tmp_path: Any) -> None:
    events: list[str] = []
    trainer = _trainer(callbacks=[Recorder(events)])
    with pytest.raises(FileNotFoundError, match=r"fit\(ckpt_path='.*nope'\): Checkpoint file not found: .* 'last'"):
        trainer.fit(Regressor(), data(), ckpt_path=str(tmp_path / "nope"))
    os.makedirs(tmp_path / "half")  # a folder without a manifest: an interrupted save
    with pytest.raises(ValueError, match="is not a committed checkpoint"):
        trainer.fit(Regressor(), data(), ckpt_path=str(tmp_path / "half"))
    assert events == []


def test_resume_needs_the_same_sequence_of_prepared_objects(tmp_path: Any) -> None:
    path = str(tmp_path / "ckpt")
    trainer = _trainer(max_epochs=1)
    module = Regressor()
    trainer.validate(module, data(n=8), verbose=False)  # an evaluation first: its model and loader come first
    trainer.fit(module, data(), data(n=8))
    trainer.save_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"prepared \['model \(evaluation\)', 'val loader', 'train loader'.*"
                                              r"same validate\(\) before fit\(\)"):
        _trainer(max_epochs=2).fit(Regressor(), data(), data(n=8), ckpt_path=path)
    again = _trainer(max_epochs=2)
    again.validate(Regressor(), data(n=8), verbose=False)
    again.fit(again.module, data(), data(n=8), ckpt_path=path)  # the same calls: it resumes
    assert again.global_step == 4


class Extras(Regressor):
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["vocab"] = ["a", "b"]
        checkpoint["table"] = torch.arange(3)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.loaded = checkpoint


def test_checkpoint_contents_load_without_unpickling_and_hooks_round_trip(tmp_path: Any) -> None:
    tracker = MemoryTracker()
    trainer = _trainer(max_epochs=1, log_with=[tracker])
    trainer.fit(Extras(), data())
    path = str(tmp_path / "ckpt")
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path)  # torch's defaults: weights_only=True
    entry = checkpoint["ember"]["custom"][0]
    assert checkpoint["vocab"] == ["a", "b"]  # what on_save_checkpoint added is at the top level, as in Lightning
    assert entry["trainer"]["state"]["global_step"] == 2 and entry["format"] == "ember-trainer"
    assert entry["checkpoint"]["vocab"] == ["a", "b"] and set(entry["trackers"]) == {"memory"}
    resumed = Extras()
    _trainer(max_epochs=1).fit(resumed, data(), ckpt_path=path)
    assert resumed.loaded["vocab"] == ["a", "b"] and torch.equal(resumed.loaded["table"], torch.arange(3))

    class Unsafe(Regressor):
        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["when"] = object()

    bad = _trainer(max_epochs=1)
    bad.fit(Unsafe(), data())
    with pytest.raises(TypeError, match=r"checkpoint\['checkpoint'\]\['when'\] is a object .* load without"):
        bad.save_checkpoint(str(tmp_path / "unsafe"))


def test_evaluation_loads_the_weights_of_a_checkpoint(tmp_path: Any) -> None:
    trainer = _trainer(max_epochs=2)
    module = Regressor()
    trainer.fit(module, data())
    path = str(tmp_path / "trained")
    trainer.save_checkpoint(path)
    fresh = Regressor()
    evaluator = Trainer(**QUIET)
    before = evaluator.validate(fresh, data(n=8), verbose=False)[0]["val/loss"]
    after = evaluator.validate(fresh, data(n=8), ckpt_path=path, verbose=False)[0]["val/loss"]
    assert after != before and torch.equal(fresh.net.weight, module.net.weight)
    with pytest.raises(FileNotFoundError, match=r"test\(ckpt_path='last'\): no committed checkpoint"):
        Trainer(**QUIET, project_dir=str(tmp_path / "empty")).test(fresh, data(n=8), ckpt_path="last")


def test_trackers_continue_the_same_run(tmp_path: Any) -> None:
    project = str(tmp_path)
    first = _trainer(max_epochs=1, log_with="csv", project_dir=project)
    first.fit(Regressor(), data())
    first.save_checkpoint(os.path.join(project, "checkpoints", "one"))
    run_dir = first.accelerator.get_tracker("csv").run_dir
    second = _trainer(max_epochs=2, log_with="csv", project_dir=project)
    second.fit(Regressor(), data(), ckpt_path="last")
    assert second.accelerator.get_tracker("csv").run_dir == run_dir
    assert os.listdir(os.path.dirname(run_dir)) == [os.path.basename(run_dir)]


def test_resume_restores_metrics_for_plateau_schedulers(tmp_path: Any) -> None:
    class Plateau(Regressor):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step",
                                                             "monitor": "val/loss"}}

    path = str(tmp_path / "ckpt")
    loader = DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=4)
    trainer = _trainer(max_epochs=1, accumulate_grad_batches=1, val_check_interval=1)
    trainer.fit(Plateau(), loader, data(n=8))
    trainer.save_checkpoint(path)
    again = _trainer(max_epochs=2, accumulate_grad_batches=1, val_check_interval=4)
    again.fit(Plateau(), loader, data(n=8), ckpt_path=path)  # steps 5-7 come before its first validation
    assert again.global_step == 8


def test_a_checkpoint_past_a_lowered_max_epochs_is_lightnings_error(tmp_path: Any) -> None:
    from callbacks.exceptions import MisconfigurationException

    trainer = Trainer(**{**QUIET, "max_epochs": 3, "project_dir": str(tmp_path)})
    trainer.fit(Regressor(), data(8, 4))
    trainer.save_checkpoint(tmp_path / "done.ckpt")
    again = Trainer(**{**QUIET, "max_epochs": 1, "project_dir": str(tmp_path)})
    with pytest.raises(MisconfigurationException, match=r"You restored a checkpoint with current_epoch=3, but you "
                                                        r"have set Trainer\(max_epochs=1\)\. Set max_epochs above 3"):
        again.fit(Regressor(), data(8, 4), ckpt_path=str(tmp_path / "done.ckpt"))
