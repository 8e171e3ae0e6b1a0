"""``DeepSpeedPlugin``'s config object and what it tells transformers (no process group, no deepspeed import).

transformers is not a dependency; a stand-in ``transformers.integrations`` with its two functions and its
``HfDeepSpeedConfig`` records what the plugin shows it. The same steps were checked against transformers 5.24
with a tiny GPT-2: ``from_pretrained`` built it partitioned after ``Accelerator(deepspeed_plugin=ZeRO-3)``, and
whole inside ``zero3_init_context_manager(enable=False)`` (Accelerate 1.15 partitions it there too).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

import pytest

from engine.backends.deepspeed_config import HfDeepSpeedConfig
from engine.backends.deepspeed_plugin import DeepSpeedPlugin


class _Shown:
    """transformers' weak-reference global: the config it was last shown (None when unset)."""

    config: dict[str, Any] | None = None


@pytest.fixture
def transformers_stub(monkeypatch: pytest.MonkeyPatch) -> type[_Shown]:
    _Shown.config = None

    class StubConfig:
        def __init__(self, config: dict[str, Any]) -> None:
            self.config = config
            _Shown.config = config

    def unset() -> None:
        _Shown.config = None

    package = types.ModuleType("transformers")
    package.__spec__ = importlib.machinery.ModuleSpec("transformers", None)
    integrations = types.ModuleType("transformers.integrations")
    integrations.HfDeepSpeedConfig = StubConfig  # type: ignore[attr-defined]
    integrations.unset_hf_deepspeed_config = unset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", package)
    monkeypatch.setitem(sys.modules, "transformers.integrations", integrations)
    return _Shown


def test_hf_ds_config_is_the_config_object_and_deepspeed_config_its_dict() -> None:
    given = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "gradient_clipping": "auto"}
    plugin = DeepSpeedPlugin(hf_ds_config=given, gradient_clipping=0.5)
    assert isinstance(plugin.hf_ds_config, HfDeepSpeedConfig)
    assert plugin.deepspeed_config is plugin.hf_ds_config.config  # one dict, as in Accelerate
    assert given["gradient_clipping"] == "auto"  # the caller's dict is not filled in
    assert plugin.deepspeed_config["gradient_clipping"] == 0.5
    assert plugin.hf_ds_config.is_zero3() and plugin.hf_ds_config.is_offload()
    assert plugin.msamp_opt_level == "O1" and "deepspeed_config" not in {f for f in plugin.__dataclass_fields__}
    plugin.hf_ds_config.del_config_sub_tree("zero_optimization.offload_param")
    plugin.hf_ds_config.set_stage_and_offload()
    assert not plugin.hf_ds_config.is_offload() and "offload_param" not in plugin.deepspeed_config["zero_optimization"]
    with pytest.raises(ValueError, match="Can't find optimizer.params entry"):
        plugin.hf_ds_config.del_config_sub_tree("optimizer.params", must_exist=True)
    again = DeepSpeedPlugin(hf_ds_config=plugin.hf_ds_config)  # an HfDeepSpeedConfig is taken as it is
    assert again.hf_ds_config is plugin.hf_ds_config


def test_transformers_is_shown_the_config_with_settled_batch_keys(transformers_stub: type[_Shown]) -> None:
    plugin = DeepSpeedPlugin(zero_stage=3)
    plugin.set_deepspeed_weakref()
    shown = transformers_stub.config
    assert shown is not None and shown is not plugin.deepspeed_config
    assert shown["train_micro_batch_size_per_gpu"] == 1 and shown["gradient_accumulation_steps"] == 1
    assert "train_batch_size" not in shown and plugin.deepspeed_config["train_batch_size"] == "auto"
    assert plugin.dschf.config is shown  # the plugin keeps transformers' object alive


def test_models_built_inside_zero3_init_disabled_are_whole(transformers_stub: type[_Shown]) -> None:
    plugin = DeepSpeedPlugin(zero_stage=3)
    plugin.set_deepspeed_weakref()
    assert plugin.is_zero3_init_enabled()
    with plugin.zero3_init_context_manager(enable=False):
        assert transformers_stub.config is None and not plugin.is_zero3_init_enabled()
    assert transformers_stub.config is not None and plugin.is_zero3_init_enabled()
    with plugin.zero3_init_context_manager(enable=True):  # already on: nothing changes
        assert transformers_stub.config is not None


def test_without_transformers_nothing_is_shown_and_nothing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "transformers" else
                        real(name, *rest))
    plugin = DeepSpeedPlugin(zero_stage=3)
    plugin.set_deepspeed_weakref()  # Accelerate refuses to start without transformers here; Ember needs none
    with plugin.zero3_init_context_manager(enable=False):
        assert not plugin.is_zero3_init_enabled()
    assert plugin.dschf is None and plugin.zero3_init_flag
