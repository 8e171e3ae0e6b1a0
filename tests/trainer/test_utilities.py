"""Lightning's standalone names: seed_everything (and worker seeding), rank_zero_*, types, core aliases.

The constants were observed from lightning 2.6.6 with tests/parity_scripts/record_seed.py (torch 2.13.0).
"""

from __future__ import annotations

import logging
import os
import random
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer
from trainer.utilities import rank_zero_info, rank_zero_only, rank_zero_warn, seed_everything
from trainer.utilities import seed as seed_module
from trainer.utilities.types import STEP_OUTPUT, OptimizerLRScheduler

# Recorded from lightning 2.6.6: seed_everything(42, workers=True) then torch.rand(2), random.random(), np.random.rand().
LIGHTNING_DRAWS_42 = ([0.8822692632675171, 0.9150039553642273], 0.6394267984578837, 0.3745401188473625)
LIGHTNING_SEQUENCE_12345_3_1 = [15372519119788646586, 255230513803888307, 5058498148510857848,
                                11998151460565454617]
# torch.manual_seed(1000 + worker_id); pl_worker_init_function(worker_id, rank) -> the same three draws.
LIGHTNING_WORKER_DRAWS = {
    (0, 0): ([0.23411989212036133, 0.08836919069290161], 0.8729399787436378, 0.6569720538912335),
    (2, 1): ([0.8188226222991943, 0.6215373873710632], 0.5207408085529882, 0.950611657903942),
}


def _draws() -> tuple[list[float], float, float]:
    return torch.rand(2).tolist(), random.random(), float(np.random.rand())


def test_seed_everything_matches_lightning() -> None:
    assert seed_everything(42, workers=True, verbose=False) == 42
    assert (os.environ["PL_GLOBAL_SEED"], os.environ["PL_SEED_WORKERS"]) == ("42", "1")
    assert _draws() == LIGHTNING_DRAWS_42


def test_seed_everything_reads_the_environment_and_defaults_to_zero() -> None:
    os.environ["PL_GLOBAL_SEED"] = "42"
    assert seed_everything(verbose=False) == 42
    assert os.environ["PL_SEED_WORKERS"] == "0"
    del os.environ["PL_GLOBAL_SEED"]
    with pytest.warns(UserWarning, match="No seed found, seed set to 0"):
        assert seed_everything() == 0


def test_seed_everything_rejects_bad_seeds() -> None:
    with pytest.raises(ValueError, match="out of bounds"):
        seed_everything(2**32)
    with pytest.raises(TypeError, match="Received: 'abc'"):
        seed_everything("abc")  # type: ignore[arg-type]
    os.environ["PL_GLOBAL_SEED"] = "x1"
    with pytest.raises(ValueError, match="PL_GLOBAL_SEED: 'x1'"):
        seed_everything()


def test_seed_everything_logs_the_seed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="trainer"):
        seed_everything(3)
    assert "Seed set to 3" in caplog.text


def test_worker_seeding_matches_lightning() -> None:
    assert seed_module._seed_sequence(12345, 3, 1, 4) == LIGHTNING_SEQUENCE_12345_3_1
    for (worker_id, rank), expected in LIGHTNING_WORKER_DRAWS.items():
        torch.manual_seed(1000 + worker_id)
        seed_module.worker_init_function(worker_id, rank=rank)
        assert _draws() == expected


def test_attach_worker_init_only_when_requested() -> None:
    data = TensorDataset(torch.arange(4.0))
    loader = DataLoader(data, num_workers=1)
    seed_everything(1, workers=False, verbose=False)
    assert seed_module.attach_worker_init(loader, rank=0).worker_init_fn is None
    seed_everything(1, workers=True, verbose=False)
    assert seed_module.attach_worker_init(loader, rank=0).worker_init_fn.func is seed_module.worker_init_function
    assert seed_module.pl_worker_init_function is seed_module.worker_init_function  # Lightning's name: imports only
    own = DataLoader(data, num_workers=1, worker_init_fn=print)
    assert seed_module.attach_worker_init(own, rank=0).worker_init_fn is print


def test_rank_zero_helpers_follow_the_rank(caplog: pytest.LogCaptureFixture) -> None:
    calls = []
    fn = rank_zero_only(lambda: calls.append(1) or "ran", default="skipped")
    saved = rank_zero_only.rank
    try:
        rank_zero_only.rank = 0
        assert fn() == "ran"
        with pytest.warns(UserWarning, match="hello"):
            rank_zero_warn("hello")
        with caplog.at_level(logging.INFO, logger="trainer"):
            rank_zero_info("info on zero")
        assert "info on zero" in caplog.text
        rank_zero_only.rank = 1
        assert fn() == "skipped" and calls == [1]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rank_zero_warn("not on rank 1")  # would raise if it warned
        rank_zero_only.rank = None
        with pytest.raises(RuntimeError, match="rank_zero_only.rank is not set"):
            fn()
    finally:
        rank_zero_only.rank = saved


def test_rank_is_read_from_the_launcher_environment() -> None:
    from trainer.utilities.rank_zero import _rank_from_environment

    os.environ.pop("RANK", None)
    os.environ["LOCAL_RANK"] = "3"
    os.environ["SLURM_PROCID"] = "5"
    assert _rank_from_environment() == 3
    os.environ["RANK"] = "7"
    assert _rank_from_environment() == 7


def test_lightning_names_have_homes() -> None:
    from trainer.core import LightningDataModule, LightningModule, LightningOptimizer
    from trainer.core.module import LightningModule as CoreModule

    assert LightningModule is trainer.TrainModule is trainer.LightningModule is CoreModule
    assert LightningDataModule is trainer.DataModule is trainer.LightningDataModule
    assert trainer.seed_everything is seed_everything and trainer.Callback.__name__ == "Callback"
    net = torch.nn.Linear(2, 1)
    opt = LightningOptimizer(torch.optim.SGD(net.parameters(), lr=0.5))
    net(torch.ones(1, 2)).sum().backward()
    before = net.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, net.weight) and isinstance(opt, torch.optim.Optimizer)
    opt.zero_grad()
    assert net.weight.grad is None
    with pytest.raises(RuntimeError, match="toggle_model\\(\\) needs the module"), opt.toggle_model():
        pass
    with pytest.raises(TypeError, match="Received: int"):
        LightningOptimizer(3)  # type: ignore[arg-type]
    assert STEP_OUTPUT is not None and OptimizerLRScheduler is not None


def test_manual_optimizers_are_lightning_optimizers_with_toggle_model() -> None:
    from tests.trainer.helpers import QUIET, Regressor, data
    from trainer import Trainer
    from trainer.core import LightningOptimizer

    class Manual(Regressor):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.other = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            opt = self.optimizers()[0]
            assert isinstance(opt, LightningOptimizer) and isinstance(opt, torch.optim.SGD)  # the user's class
            with opt.toggle_model():  # freezes the other optimizer's parameters (Lightning's toggle_optimizer)
                self.frozen = self.other.weight.requires_grad
                x, y = batch
                self.manual_backward(torch.nn.functional.mse_loss(self.net(x), y))
                opt.step()
                opt.zero_grad()
            self.restored = self.other.weight.requires_grad

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return [torch.optim.SGD(self.net.parameters(), lr=0.1), torch.optim.SGD(self.other.parameters(), lr=0.1)]

    module = Manual()
    Trainer(**QUIET, max_epochs=1, limit_train_batches=1).fit(module, data())
    assert (module.frozen, module.restored) == (False, True)


def test_a_lightning_optimizer_is_an_instance_of_the_users_optimizer_class() -> None:
    import copy
    import pickle

    from trainer.core import LightningOptimizer

    adam = torch.optim.Adam(torch.nn.Linear(3, 4).parameters())
    opt = LightningOptimizer(adam)
    # As Lightning: a `LightningAdam`, an Adam for isinstance checks, printed as torch prints the Adam.
    assert isinstance(opt, torch.optim.Adam) and isinstance(opt, LightningOptimizer)
    assert type(opt).__name__ == "LightningAdam" and str(opt) == "Lightning" + str(adam)
    assert type(LightningOptimizer(torch.optim.Adam(torch.nn.Linear(1, 1).parameters()))) is type(opt)
    opt.param_groups[0]["lr"] = 0.5
    assert adam.param_groups[0]["lr"] == 0.5 and opt.state_dict() == adam.state_dict()
    for copied in (pickle.loads(pickle.dumps(opt)), copy.deepcopy(opt)):  # the made class is rebuilt, not looked up
        assert type(copied).__name__ == "LightningAdam" and copied.param_groups[0]["lr"] == 0.5
