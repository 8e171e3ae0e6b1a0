"""``Trainer(strategy="ddp_spawn" | "ddp_fork", devices=2)`` called from this one pytest process: each call starts
two real gloo workers, and rank 0's results come back here (trainer.compat.spawn)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from torch.multiprocessing import ProcessRaisedException

from tests.conftest import run_distributed
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer

ARGS: dict[str, Any] = {**QUIET, "accelerator": "cpu", "devices": 2, "max_epochs": 2}


def _launched_fit() -> dict[str, Any]:
    """The reference: the same fit under a launch (RANK / WORLD_SIZE set by run_distributed), strategy="ddp"."""
    torch.manual_seed(0)
    module = Regressor()
    trainer = Trainer(**ARGS, strategy="ddp")
    trainer.fit(module, data(), data())
    return {"weights": module.state_dict(), "step": trainer.global_step,
            "val": trainer.validate(module, data(), verbose=False)}


@pytest.fixture(scope="module")
def launched() -> dict[str, Any]:
    return run_distributed(_launched_fit, world_size=2, timeout=240)[0]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_each_call_runs_in_two_workers_and_its_results_come_back(strategy: str, launched: dict[str, Any]) -> None:
    torch.manual_seed(0)
    module = Regressor()
    trainer = Trainer(**ARGS, strategy=strategy)
    assert trainer.world_size == 1  # the caller stays one plain process: no process group, nothing launched
    assert trainer.fit(module, data(), data()) is None
    for name, value in launched["weights"].items():  # the caller's own module object holds rank 0's weights
        assert torch.equal(module.state_dict()[name], value), name
    assert (trainer.global_step, trainer.current_epoch) == (launched["step"], 2) == (4, 2)  # 16 samples / 4 / 2
    assert (trainer.state.fn, trainer.state.status) == ("fit", "finished")
    assert trainer.lightning_module is module and set(trainer.callback_metrics) == {"train/loss", "val/loss"}
    assert trainer.validate(module, data(), verbose=False) == launched["val"]


@pytest.mark.timeout(120)
def test_test_and_predict_return_rank_zeros_values(launched: dict[str, Any]) -> None:
    module = Regressor()
    module.load_state_dict(launched["weights"])
    trainer = Trainer(**ARGS, strategy="ddp_fork")
    tested = trainer.test(module, data(), verbose=False)
    assert tested[0]["test/loss"] == pytest.approx(launched["val"][0]["val/loss"])  # same data, same weights
    predictions = trainer.predict(module, data())
    assert predictions is not None
    with torch.no_grad():  # every process's predictions, in dataset order
        assert torch.allclose(torch.cat(predictions), module(data().dataset.tensors[0]))


class _FailsOnRankOne(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_rank == 1:
            raise ValueError("boom on the second worker")
        return super().training_step(batch, batch_idx)


@pytest.mark.timeout(120)
def test_a_worker_exception_reaches_the_caller_with_its_traceback() -> None:
    trainer = Trainer(**ARGS, strategy="ddp_fork")
    with pytest.raises(ProcessRaisedException, match=r"(?s)Process 1 terminated.*training_step.*boom on the second"):
        trainer.fit(_FailsOnRankOne(), data())


class _HoldsALambda(Regressor):
    def __init__(self) -> None:
        super().__init__()
        self.scale = lambda x: 2 * x


def test_an_unpicklable_module_under_ddp_spawn_is_refused_before_any_process_starts() -> None:
    trainer = Trainer(**ARGS, strategy="ddp_spawn")
    with pytest.raises(pickle.PicklingError, match=r"hands the module \(_HoldsALambda\).*cannot be pickled.*"
                                                   r"strategy='ddp_fork' / 'ddp_notebook'"):
        trainer.fit(_HoldsALambda(), data())
    assert trainer.state.status == "initializing"  # nothing ran


def test_ddp_still_runs_the_script_again_and_is_refused_inside_pytest() -> None:
    with pytest.raises(RuntimeError, match="would run the test runner again"):
        Trainer(**ARGS, strategy="ddp")
