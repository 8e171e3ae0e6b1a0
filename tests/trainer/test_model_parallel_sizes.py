"""``ModelParallelStrategy``'s sizes as Lightning 2.6 resolves them (its ``_setup_device_mesh``): ``"auto"`` data
parallelism spans the machines and tensor parallelism the processes of one machine; explicit sizes must multiply
to the world size (Lightning's RuntimeError text, recorded in tests/distributed/model_parallel_expected.py)."""

from __future__ import annotations

import pytest

from tests.distributed.model_parallel_expected import EXPECTED
from trainer.strategies import ModelParallelStrategy, resolve_strategy


@pytest.mark.parametrize(("world_size", "num_nodes", "sizes"), [(1, 1, (1, 1)), (4, 1, (1, 4)), (8, 2, (2, 4))])
def test_auto_sizes_span_machines_then_processes(world_size: int, num_nodes: int, sizes: tuple[int, int]) -> None:
    strategy = ModelParallelStrategy()
    kind, same, kwargs = resolve_strategy(strategy, world_size, num_nodes)
    config = kwargs["parallelism_config"]
    assert (kind, same) == ("model_parallel", strategy)
    assert (config.dp_shard_size, config.tp_size) == sizes
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == sizes  # resolved, as Lightning's


def test_sizes_that_do_not_multiply_to_the_world_are_lightnings_error() -> None:
    with pytest.raises(RuntimeError) as raised:
        ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1).accelerator_kwargs(world_size=1)
    assert f"ERROR RuntimeError: {raised.value}" == EXPECTED["probes"]["sizes_do_not_multiply"]


def test_whole_weights_checkpoints_ask_the_engine_for_one_file() -> None:
    kwargs = ModelParallelStrategy(save_distributed_checkpoint=False).accelerator_kwargs(world_size=2)
    assert kwargs["fsdp_plugin"].state_dict_type == "FULL_STATE_DICT"
    assert "fsdp_plugin" not in ModelParallelStrategy().accelerator_kwargs(world_size=2)
