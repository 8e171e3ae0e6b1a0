"""FSDPStrategy takes Lightning's keywords (trainer/strategies/fsdp.py): each translated to the FSDP2 plugin's, or
refused naming what to use. The plugin is what the engine shards with (tests/distributed covers the plugin)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
from torch.distributed.fsdp import CPUOffload, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from engine.backends.fsdp import FullyShardedDataParallelPlugin
from trainer.strategies import FSDPStrategy


class Block(torch.nn.Module):
    pass


def plugin(strategy: FSDPStrategy) -> FullyShardedDataParallelPlugin:
    return strategy.accelerator_kwargs()["fsdp_plugin"]


def test_lightnings_keywords_build_the_same_plugin_as_the_plugins_own() -> None:
    lightning = FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block},
                             sharding_strategy="SHARD_GRAD_OP", state_dict_type="full", cpu_offload=True)
    own = FSDPStrategy(transformer_cls_names_to_wrap=["Block"], activation_checkpointing=True,
                       reshard_after_forward=False, state_dict_type="FULL_STATE_DICT", cpu_offload=True)
    assert plugin(lightning) == plugin(own)
    assert plugin(lightning).transformer_cls_names_to_wrap == ["Block"]


def test_torchs_objects_are_read_as_lightning_passes_them() -> None:
    strategy = FSDPStrategy(auto_wrap_policy=ModuleWrapPolicy({Block}), sharding_strategy=ShardingStrategy.FULL_SHARD,
                            cpu_offload=CPUOffload(offload_params=True), state_dict_type="sharded")
    built = plugin(strategy)
    assert built.transformer_cls_names_to_wrap == ["Block"] and built.reshard_after_forward is True
    assert built.cpu_offload is True and built.state_dict_type == "SHARDED_STATE_DICT"


def test_backend_and_timeout_go_to_the_process_group() -> None:
    handlers = FSDPStrategy(process_group_backend="gloo", timeout=90).accelerator_kwargs()["kwargs_handlers"]
    assert handlers[0].backend == "gloo" and handlers[0].timeout == timedelta(seconds=90)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"sharding_strategy": "NO_SHARD"}, "use DDPStrategy"),
    ({"sharding_strategy": "HYBRID_SHARD"}, "hybrid sharding needs a 2-D mesh"),
    ({"mixed_precision": object()}, r"precision='bf16-mixed'"),
    ({"device_mesh": (2, 2)}, "ModelParallelStrategy"),
    ({"auto_wrap_policy": lambda module, recurse, nonwrapped_numel: True}, "got a function"),
    ({"auto_wrap_policy": {Block}, "activation_checkpointing_policy": {torch.nn.Linear}},
     r"must name the same block classes as auto_wrap_policy \(got \['Block'\]\)"),
    ({"state_dict_type": "local"}, "'full' and 'sharded'"),
])
def test_keywords_without_an_fsdp2_meaning_are_refused_naming_what_to_use(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FSDPStrategy(**kwargs)


def test_an_unknown_keyword_lists_both_vocabularies() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'wrap_policy'.*auto_wrap_policy.*"
                                        r"transformer_cls_names_to_wrap"):
        FSDPStrategy(wrap_policy={Block})
