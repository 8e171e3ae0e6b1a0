"""Tuner: lr_find on a small regression suggests a rate in a known range, stops on divergence, plots a PNG and
leaves the module as it was; scale_batch_size doubles / bisects, stops at out-of-memory or a configured limit."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.trainer.helpers import QUIET
from trainer import DataModule, Trainer, TrainModule
from trainer.tools.batch_size import is_oom_error
from trainer.tuner import Tuner
from trainer.utilities.exceptions import MisconfigurationException


def regression(n: int = 512, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=generator)
    return TensorDataset(x, x @ torch.linspace(-1, 1, 8, dtype=torch.float32).unsqueeze(1))


class Model(TrainModule):
    def __init__(self, lr: float = 1e-3, batch_size: int = 16, memory_limit: int | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.batch_size, self.memory_limit = lr, batch_size, memory_limit
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.norm = torch.nn.BatchNorm1d(8)
        self.sizes: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.sizes.append(len(x))
        if self.memory_limit is not None and len(x) > self.memory_limit:
            raise MemoryError(f"a batch of {len(x)} does not fit")  # what an allocation failure raises on a CPU
        return torch.nn.functional.mse_loss(self.net(self.norm(x)), y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression(), batch_size=self.batch_size, shuffle=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def trainer() -> Trainer:
    return Trainer(**QUIET, max_epochs=1)


def test_lr_find_suggests_a_rate_in_range_and_restores_everything(tmp_path: Any) -> None:
    torch.manual_seed(0)
    module = Model()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.get_rng_state()
    finder = Tuner(trainer()).lr_find(module, min_lr=1e-5, max_lr=10.0, num_training=60)
    lrs = finder.results["lr"]
    assert lrs[0] == pytest.approx(1e-5) and all(b > a for a, b in itertools.pairwise(lrs))  # exponential sweep
    assert len(lrs) < 60  # diverged before reaching lr=10 and stopped early
    suggestion = finder.suggestion()
    assert suggestion is not None and 1e-4 <= suggestion <= 1.0  # where the loss of this regression falls
    assert module.lr == module.hparams["lr"] == suggestion  # both holders of the name, as Lightning
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), key  # weights and batch-norm buffers as they were
    assert torch.equal(torch.get_rng_state(), rng)
    path = tmp_path / "lr.png"
    finder.plot(path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Recorded from Lightning 2.6.6 by tests/parity_scripts/lr_find_lightning.py: the same model, initial weights and
# unshuffled batches; the sweep diverged and stopped after 50 of 60 steps.
LIGHTNING_LOSSES = [
    1.847413, 2.694001, 2.517021, 2.737632, 2.867834, 2.955698, 2.952022, 3.235838, 3.276535,
    3.720369, 3.776418, 3.83222, 3.973138, 3.945643, 3.903156, 3.863023, 3.97938, 3.873287,
    3.840138, 3.924084, 3.816859, 3.708852, 3.660753, 3.741322, 3.744356, 3.747174, 3.804719,
    3.762694, 3.762802, 3.762863, 3.713005, 3.702511, 3.676335, 3.652012, 3.564121, 3.531875,
    3.484647, 3.428293, 3.375131, 3.333932, 3.248107, 3.17831, 3.116147, 3.092848, 3.07281,
    3.031487, 3.109661, 3.259922, 5.166302, 21.778792]
LIGHTNING_SUGGESTION = 0.00025118864315095806


def test_lr_find_matches_lightning() -> None:
    torch.manual_seed(0)
    module = Model()
    loader = DataLoader(regression(), batch_size=16)
    finder = Tuner(trainer()).lr_find(module, loader, min_lr=1e-5, max_lr=10.0, num_training=60)
    assert finder.results["loss"] == pytest.approx(LIGHTNING_LOSSES, rel=1e-4)
    assert finder.results["lr"][:3] == pytest.approx([1e-5, 1.5848931924611134e-05, 1.99526231496888e-05])
    assert finder.suggestion() == pytest.approx(LIGHTNING_SUGGESTION)


def test_lr_find_bad_ranges_fail_early() -> None:
    with pytest.raises(ValueError, match=r"min_lr=.*> 0.*Received: 0"):
        Tuner(trainer()).lr_find(Model(), min_lr=0)
    with pytest.raises(ValueError, match="mode=.*'exponential', 'linear'.*'log'"):
        Tuner(trainer()).lr_find(Model(), mode="log")

    class NoLr(Model):
        def __init__(self) -> None:
            super().__init__()
            del self.lr
            self._hparams.pop("lr")  # type: ignore[attr-defined]

    with pytest.raises(AttributeError, match=r"should have one of these fields: \['lr', 'learning_rate'\]\. NoLr"):
        Tuner(trainer()).lr_find(NoLr())


class Plain(TrainModule):
    """Model without BatchNorm, optionally with a plateau scheduler or two optimizers (manual optimisation)."""

    def __init__(self, lr: float = 1e-3, plateau: bool = False, two: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.plateau, self.two = lr, plateau, two
        self.automatic_optimization = not two
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression(), batch_size=16)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        if self.two:
            return [optimizer, torch.optim.Adam(self.parameters())]
        if self.plateau:
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}
        return optimizer


def test_lr_find_as_lightning_sweeps_down_writes_every_holder_and_owns_the_rate() -> None:
    # Values printed by lightning 2.6.6's Tuner.lr_find on the same model and data.
    torch.manual_seed(0)
    finder = Tuner(trainer()).lr_find(Plain(), min_lr=1.0, max_lr=1e-8, num_training=3, update_attr=False)
    assert finder.results["lr"] == pytest.approx([1.0, 4.641588833612782e-06, 1e-08])  # min_lr > max_lr: downwards
    torch.manual_seed(0)
    module = Plain()
    Tuner(trainer()).lr_find(module, min_lr=1e-5, max_lr=10.0, num_training=60)
    # The attribute and the hyper-parameter of the same name both take the suggestion.
    assert module.lr == module.hparams.lr == pytest.approx(0.00031622776601683794)
    module = Plain()
    finder = Tuner(trainer()).lr_find(module, num_training=1)  # one point: no suggestion, nothing written
    assert finder.results == {"lr": [1e-08], "loss": [pytest.approx(1.6711309702709447)]}
    with pytest.warns(UserWarning, match="too few finite losses"):
        assert finder.suggestion() is None and module.lr == 0.001
    # The module's schedulers do not run during the search: a plateau waiting for val_loss does not fail.
    finder = Tuner(trainer()).lr_find(Plain(plateau=True), num_training=12, update_attr=False)
    assert len(finder.results["lr"]) == 12
    with pytest.raises(MisconfigurationException, match=r"returned 2, but learning rate finder only works with "
                                                        r"single optimizer"):
        Tuner(trainer()).lr_find(Plain(two=True))


def test_lr_find_linear_mode_and_no_update() -> None:
    module = Model()
    finder = Tuner(trainer()).lr_find(module, min_lr=1e-4, max_lr=1e-2, num_training=20, mode="linear",
                                      early_stop_threshold=None, update_attr=False)
    assert len(finder.results["lr"]) == 20 and finder.results["lr"][-1] == pytest.approx(1e-2)
    lrs = finder.results["lr"]  # Lightning's _LinearLR: step i > 0 is (i + 1) / 20 of the way
    assert lrs[0] == 1e-4 and lrs[2] - lrs[1] == pytest.approx((1e-2 - 1e-4) / 20)
    assert module.lr == 1e-3


def test_scale_batch_size_power_stops_at_out_of_memory() -> None:
    module = Model(memory_limit=40)
    size = Tuner(trainer()).scale_batch_size(module, mode="power", steps_per_trial=1, init_val=4)
    assert size == 32 and module.batch_size == 32  # 4, 8, 16, 32 fit; 64 raised MemoryError
    assert sorted(set(module.sizes)) == [4, 8, 16, 32, 64]


def test_scale_batch_size_binsearch_refines_between_fit_and_failure() -> None:
    module = Model(memory_limit=40)
    size = Tuner(trainer()).scale_batch_size(module, mode="binsearch", steps_per_trial=1, init_val=4)
    # 32 fit, 64 failed, then 48 (no), 40 (yes), 44 (no), 42 (no), 41 (no): 40, less Lightning's 5% margin.
    assert size == 38 and module.batch_size == 38


def test_scale_batch_size_stops_at_the_configured_limit_and_on_a_data_module() -> None:
    class Data(DataModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 2

        def train_dataloader(self) -> DataLoader:
            return DataLoader(regression(), batch_size=self.batch_size)

    data = Data()
    module = Model()
    assert Tuner(trainer()).scale_batch_size(module, datamodule=data, steps_per_trial=1, max_val=24) == 24
    # As Lightning: the search starts from the data module's value (the last holder) and every holder takes it.
    assert data.batch_size == module.batch_size == module.hparams.batch_size == 24
    assert module.sizes[0] == 2
    with pytest.raises(MisconfigurationException, match="cannot be used with dataloaders passed directly"):
        Tuner(trainer()).scale_batch_size(module, train_dataloaders=module.train_dataloader())
    with pytest.raises(MisconfigurationException, match="Field bs not found.*batch_arg_name"):
        Tuner(trainer()).scale_batch_size(Model(), batch_arg_name="bs")


def test_out_of_memory_is_recognised() -> None:
    # Lightning's messages (tests/lightning_corpus/batch_size.py records which count), and Python's MemoryError.
    assert is_oom_error(MemoryError()) and is_oom_error(RuntimeError("CUDA out of memory. Tried ..."))
    assert not is_oom_error(RuntimeError("shape mismatch")) and not is_oom_error(ValueError("x"))


def test_searches_are_skipped_under_fast_dev_run() -> None:
    # Lightning 2.6 (test_skip_on_fast_dev_run_tuner): both searches warn and return None, the module untouched.
    module = Model(lr=0.1, batch_size=8)
    tuner = Tuner(Trainer(**QUIET, fast_dev_run=True))
    with pytest.warns(UserWarning, match="Skipping learning rate finder since `fast_dev_run` is enabled."):
        assert tuner.lr_find(module) is None
    with pytest.warns(UserWarning, match="Skipping batch size scaler since `fast_dev_run` is enabled."):
        assert tuner.scale_batch_size(module) is None
    assert (module.lr, module.batch_size) == (0.1, 8)


class EveryStage(TrainModule):
    """Every stage's loader reads ``self.batch_size`` (64 samples)."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("v", self.layer(batch[0]).sum())

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("t", self.layer(batch[0]).sum())

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])

    def _loader(self) -> DataLoader:
        return DataLoader(regression(64), batch_size=self.batch_size)

    train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


# Lightning 2.6.6 (max_trials=2, steps_per_trial=2): the loaders the trainer shows afterwards, at the size found;
# Lightning's predict loader reports batch_size None (it wraps the batch sampler), Ember's the size.
@pytest.mark.parametrize(("method", "mode", "init", "found", "shown"), [
    ("fit", "power", 8, 16, {"train_dataloader": 16, "val_dataloaders": 16}),
    ("fit", "binsearch", 17, 32, {"train_dataloader": 32, "val_dataloaders": 32}),
    ("validate", "power", 8, 16, {"val_dataloaders": 16}),
    ("test", "binsearch", 17, 32, {"test_dataloaders": 32}),
    ("predict", "power", 8, 16, {"predict_dataloaders": 16}),
])
def test_scale_batch_size_leaves_the_stage_loaders_at_the_size_found(method: str, mode: str, init: int, found: int,
                                                                     shown: dict[str, int]) -> None:
    tuned = trainer()
    size = Tuner(tuned).scale_batch_size(EveryStage(), method=method, mode=mode, init_val=init, max_trials=2,
                                         steps_per_trial=2)
    assert size == found
    for name in ("train_dataloader", "val_dataloaders", "test_dataloaders", "predict_dataloaders"):
        loader = getattr(tuned, name)
        assert (loader.batch_size if loader is not None else None) == shown.get(name), name
