"""``trainer.strategy``: Lightning's public strategy surface on every strategy object (trainer/strategies/base.py),
answered by the connected Trainer; the Trainer's own backward goes through ``Strategy.backward``, which Lightning's
code and tests wrap."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch

from tests.conftest import run_distributed
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer
from trainer.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy, Strategy


@pytest.mark.parametrize("strategy", ["auto", "fsdp"])
def test_every_strategy_answers_lightnings_surface_on_one_process(strategy: str) -> None:
    trainer = Trainer(**QUIET, max_steps=2, strategy=strategy)
    # As Lightning: "auto" on one process is a SingleDeviceStrategy.
    assert isinstance(trainer.strategy, SingleDeviceStrategy if strategy == "auto" else FSDPStrategy)
    module = Regressor()
    with mock.patch.object(Strategy, "backward", autospec=True, side_effect=Strategy.backward) as backward:
        trainer.fit(module, data())
    assert backward.call_count == 2  # one per training batch, as Lightning's loop calls it
    s = trainer.strategy
    assert s.root_device == torch.device("cpu") and s.lightning_module is module and s.model is not None
    assert (s.global_rank, s.local_rank, s.node_rank, s.world_size, s.num_nodes, s.num_processes) == (0, 0, 0, 1, 1, 1)
    assert s.is_global_zero and s.optimizers == trainer.optimizers
    assert s.broadcast({"a": 1}) == {"a": 1} and s.reduce(torch.tensor(3.0)).item() == 3.0
    assert s.all_gather(torch.ones(2)).shape == (2,) and s.reduce_boolean_decision(True)
    s.barrier("here")


def _two_processes() -> dict[str, Any]:
    trainer = Trainer(**QUIET, max_steps=1)
    trainer.fit(Regressor(), data())
    s, rank = trainer.strategy, trainer.global_rank
    return {"rank": s.global_rank, "world": s.world_size, "zero": s.is_global_zero,
            "broadcast": s.broadcast(f"from {rank}", src=1),
            "mean": s.reduce(torch.tensor(float(rank)), reduce_op="mean").item(),
            "sum": s.reduce(torch.tensor(float(rank)), reduce_op="sum").item(),
            "gathered": s.all_gather(torch.tensor([rank, 10 + rank])).tolist(),
            "all": s.reduce_boolean_decision(rank == 0, all=True), "any": s.reduce_boolean_decision(rank == 0, all=False),
            "plain": s.reduce("not a tensor")}


def test_collectives_on_two_processes() -> None:
    for rank, got in enumerate(run_distributed(_two_processes, 2)):
        assert got["rank"] == rank and got["world"] == 2 and got["zero"] == (rank == 0)
        assert got["broadcast"] == "from 1"
        assert got["mean"] == 0.5 and got["sum"] == 1.0
        assert got["gathered"] == [[0, 10], [1, 11]]  # stacked along a new first dimension, as Lightning
        assert got["all"] is False and got["any"] is True and got["plain"] == "not a tensor"


def test_single_device_strategy_is_one_process_only() -> None:
    assert isinstance(Trainer(**QUIET, strategy="single_device").strategy, SingleDeviceStrategy)
    assert Trainer(**QUIET, strategy=SingleDeviceStrategy(device="cpu")).strategy.root_device == torch.device("cpu")
    with pytest.raises(ValueError, match="SingleDeviceStrategy runs one process, but the run has 2"):
        SingleDeviceStrategy().accelerator_kwargs(world_size=2)


def test_a_strategy_not_connected_says_how_to_connect_it() -> None:
    with pytest.raises(RuntimeError, match=r"not connected to a Trainer yet: pass it as Trainer\(strategy=...\)"):
        _ = DDPStrategy().root_device


def test_a_strategy_object_given_to_two_trainers_answers_for_each() -> None:
    # The Tuner's and the LR finder's search trainers are built from the same config: the first Trainer's steps
    # must still go through its own strategy once a second one exists.
    shared = DDPStrategy()
    first = Trainer(**QUIET, max_steps=2, strategy=shared)
    second = Trainer(**QUIET, max_steps=1, strategy=shared)
    assert first.strategy is shared and second.strategy is not shared and isinstance(second.strategy, DDPStrategy)
    second.fit(Regressor(), data())
    first.fit(Regressor(), data())
    assert (first.global_step, second.global_step) == (2, 1)
    assert first.strategy.lightning_module is first.lightning_module
    assert second.strategy.lightning_module is second.lightning_module


def test_connecting_a_module_attaches_it_without_a_run() -> None:
    trainer = Trainer(**QUIET, max_steps=1)
    module = Regressor()
    assert trainer.strategy.connect(module) is trainer.strategy  # Lightning's connect(model)
    assert trainer.lightning_module is module and module.trainer is trainer and trainer.strategy.lightning_module is module


def test_the_launcher_is_the_in_process_one_or_none() -> None:
    # Lightning's strategy.launcher: None where this process trains itself; ddp_spawn's launcher in the caller.
    from trainer.compat.spawn import SpawnLauncher

    assert Trainer(**QUIET, max_epochs=1).strategy.launcher is None
    spawning = Trainer(**QUIET, max_epochs=1, strategy="ddp_spawn", accelerator="cpu", devices=2).strategy.launcher
    assert isinstance(spawning, SpawnLauncher) and spawning.processes == 2


@pytest.mark.parametrize("precision, dtype", [(None, torch.float32), ("64-true", torch.float64),
                                              ("bf16-true", torch.bfloat16), ("bf16-mixed", torch.float32)])
def test_init_module_builds_on_the_device_in_a_true_precisions_dtype(precision: str | None,
                                                                     dtype: torch.dtype) -> None:
    trainer = Trainer(**QUIET, **({} if precision is None else {"precision": precision}))
    with trainer.init_module():
        layer = torch.nn.Linear(3, 2)
        made = torch.zeros(1)
    assert layer.weight.device == trainer.strategy.root_device and layer.weight.dtype == dtype
    assert made.dtype == dtype and torch.get_default_dtype() == torch.float32  # restored after the block


def test_empty_init_skips_the_layers_initialisation_only() -> None:
    class Ones(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4))
            torch.nn.init.constant_(self.weight, 1.0)  # what empty_init skips (torch.zeros itself still runs)

    trainer = Trainer(**QUIET)
    with trainer.init_module(empty_init=True):
        skipped = Ones()
    with trainer.init_module(empty_init=False):
        initialised = Ones()
    assert skipped.weight.tolist() == [0.0] * 4 and initialised.weight.tolist() == [1.0] * 4
    assert Ones().weight.tolist() == [1.0] * 4  # only inside the block
