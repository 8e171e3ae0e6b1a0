"""The Trainer under DeepSpeed: Lightning's strategy names and configs, training on 2 CPU processes with each
``deepspeed_stage_*`` string, resuming exactly from a ModelCheckpoint folder, and ``load_from_checkpoint``.

The module and script are ``tests/lightning_corpus/deepspeed_script.py`` (a LightningModule with only its imports
changed); the configs are Lightning 2.6's (``tests/lightning_corpus/deepspeed_expected.py``). Lightning's own runs
shard data with a DistributedSampler, Ember's like Accelerate, so the weights are compared with Ember's own
uninterrupted run, not with Lightning's (see the README).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed tests need the deepspeed extra: pip install "
                                        "\"ember-train[deepspeed]\"")

from tests.distributed.test_deepspeed import launch
from tests.lightning_corpus.deepspeed_expected import EXPECTED
from trainer.strategies import DEEPSPEED_NAMES, DeepSpeedStrategy, resolve_strategy

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "lightning_corpus" / "deepspeed_script.py"
pytestmark = pytest.mark.timeout(1200)


@pytest.mark.parametrize("name", [n for n in DEEPSPEED_NAMES if not n.endswith("nvme")])
def test_each_strategy_name_builds_lightnings_config(name: str) -> None:
    assert DeepSpeedStrategy(**DEEPSPEED_NAMES[name]).config == EXPECTED["strategies"]["configs"][name]
    assert EXPECTED["strategies"]["registered"][name]["init_params"] == DEEPSPEED_NAMES[name]
    kind, strategy, kwargs = resolve_strategy(name)
    assert kind == "deepspeed" and isinstance(strategy, DeepSpeedStrategy)
    assert kwargs["deepspeed_plugin"].deepspeed_config is strategy.config  # the live config, editable until fit


def test_the_strategy_takes_lightnings_keywords_and_defaults() -> None:
    ours = {name: repr(p.default) for name, p in inspect.signature(DeepSpeedStrategy).parameters.items()}
    for name, default in EXPECTED["strategies"]["defaults"].items():
        assert ours.get(name) == default, name


def test_a_strategy_that_sets_the_accumulation_in_its_config_is_refused() -> None:
    with pytest.raises(ValueError, match="Do not set `gradient_accumulation_steps` in the DeepSpeed config"):
        DeepSpeedStrategy(config={"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2}
                          ).accelerator_kwargs()


@pytest.mark.parametrize(("strategy", "precision"), [("deepspeed_stage_1", "32"),
                                                     ("deepspeed_stage_2_offload", "bf16-mixed"),
                                                     ("deepspeed_stage_3", "32")])
@pytest.mark.recorded_bits
def test_the_trainer_trains_and_resumes_exactly_under_deepspeed(tmp_path: Path, strategy: str,
                                                                precision: str) -> None:
    run: dict[str, Any] = {"strategy": strategy, "precision": precision}
    full = launch(SCRIPT, run, tmp_path / "full")
    assert full["global_step"] == 8 and full["world_size"] == 2
    assert full["precision"] == ("32-true" if precision == "32" else "bf16-mixed")
    first = full["checkpoints"]["epoch=0-step=4.ckpt"]
    assert {"latest", "manifest.json", "zero_to_fp32.py", "custom_checkpoint_0.pkl"} <= set(first)
    assert any(name.startswith("pytorch_model/") for name in first)
    checkpoint = tmp_path / "full" / "checkpoints" / "epoch=0-step=4.ckpt"
    resumed = launch(SCRIPT, {**run, "ckpt_path": str(checkpoint)}, tmp_path / "resumed")
    assert resumed["sha256"] == full["sha256"], "a resumed DeepSpeed run must end bitwise where the full one did"
    assert resumed["losses"] == full["losses"][8:]
    if strategy == "deepspeed_stage_3":  # the full weights, joined from the partitions, load without DeepSpeed
        final = tmp_path / "full" / "checkpoints" / "epoch=1-step=8.ckpt"
        loaded = _load_from_checkpoint(final)
        assert loaded == {name: value[2] for name, value in full["weights"].items()}  # the sums


def _load_from_checkpoint(folder: Path) -> dict[str, float]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("deepspeed_corpus", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Regressor.load_from_checkpoint(str(folder))
    return {name: float(t.double().sum()) for name, t in model.state_dict().items()}
