"""``ParallelismConfig`` answers as Accelerate 1.15's does: the fields and defaults, every property for a set of
meshes, the constructor checks in Accelerate's words, the environment variables and the repr — the values in
tests/distributed/parallelism_config_expected.py were observed from Accelerate by
tests/parity_scripts/record_parallelism_config.py. Also the tensor-parallel plan's early errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from engine import ParallelismConfig
from engine.backends.parallelism_config import TorchContextParallelConfig, TorchTensorParallelConfig
from engine.backends.tensor_parallel import resolve_plan
from tests.distributed.model_parallel_script import TinyTransformer
from tests.distributed.parallelism_config_expected import EXPECTED

PROPERTIES = ("dp_dim_names", "non_dp_dim_names", "dp_shard_cp_dim_names", "dp_cp_dim_names", "fsdp_dim_names",
              "total_size", "data_parallel_size", "non_data_parallel_size", "active_mesh_dims",
              "dp_replicate_enabled", "dp_shard_enabled", "tp_enabled", "cp_enabled", "sp_enabled")
CONFIGS = {"all_ones": {}, "fsdp4": {"dp_shard_size": 4}, "hsdp2x2": {"dp_replicate_size": 2, "dp_shard_size": 2},
           "fsdp2_tp2": {"dp_shard_size": 2, "tp_size": 2}, "tp4": {"tp_size": 4}, "tp2": {"tp_size": 2},
           "fsdp2_cp2": {"dp_shard_size": 2, "cp_size": 2},
           "hsdp2x2_tp2": {"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2},
           "size_mismatch": {"dp_shard_size": 2}}
ERRORS = {
    "dp_replicate_size_0": "ParallelismConfig(dp_replicate_size=0)",
    "dp_shard_size_0": "ParallelismConfig(dp_shard_size=0)",
    "tp_size_0": "ParallelismConfig(tp_size=0)",
    "cp_size_0": "ParallelismConfig(cp_size=0)",
    "sp_size_0": "ParallelismConfig(sp_size=0)",
    "cp_backend_bad": "ParallelismConfig(cp_backend='ring')",
    "sp_backend_bad": "ParallelismConfig(sp_backend='ulysses')",
    "replicate_with_tp": "ParallelismConfig(dp_replicate_size=2, tp_size=2)",
    "replicate_with_cp": "ParallelismConfig(dp_replicate_size=2, cp_size=2)",
    "replicate_shard_tp_ok": "ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2).total_size",
    "cp_and_sp": "ParallelismConfig(cp_size=2, sp_size=2)",
    "cp_handler_wrong_type": "ParallelismConfig(cp_size=2, cp_handler=TorchTensorParallelConfig())",
    "cp_comm_strategy_bad": "TorchContextParallelConfig(cp_comm_strategy='ring')",
    "tp_handler_with_tp_1": "ParallelismConfig(tp_handler=TorchTensorParallelConfig()).tp_handler is not None",
}
# Deliberate: Accelerate's TorchTensorParallelConfig requires transformers (a version check); Ember's plans do not
# use it, so tp_size=2 builds without it.
DELIBERATE = {"tp_without_transformers": "OK"}


def describe(config: ParallelismConfig) -> dict[str, Any]:
    dims = config.active_mesh_dims if config.total_size > 1 else []
    return {**{name: getattr(config, name) for name in PROPERTIES}, "mesh_dim_names": list(dims),
            "mesh_shape": [getattr(config, f"{name}_size") for name in dims],
            "sizes": {name: getattr(config, f"{name}_size") for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp")},
            "cp_backend": config.cp_backend, "sp_backend": config.sp_backend,
            "tp_handler": type(config.tp_handler).__name__ if config.tp_handler is not None else None,
            "cp_handler": repr(config.cp_handler) if config.cp_handler is not None else None}


def test_fields_and_defaults_are_accelerates() -> None:
    ours = [(f.name, repr(f.default)) for f in dataclasses.fields(ParallelismConfig)]
    assert ours == [(f["name"], f["default"]) for f in EXPECTED["fields"]]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_properties_are_accelerates(name: str) -> None:
    expected = dict(EXPECTED["configs"][name])
    ours = describe(ParallelismConfig(**CONFIGS[name]))
    # Accelerate prints its own class path in the handler's repr; the values are what is compared.
    for key in ("cp_handler",):
        if expected[key] is not None:
            expected[key] = expected[key].split("(", 1)[1]
            ours[key] = ours[key].split("(", 1)[1]
    assert ours == expected


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_checks_raise_accelerates_messages(name: str) -> None:
    scope = {"ParallelismConfig": ParallelismConfig, "TorchContextParallelConfig": TorchContextParallelConfig,
             "TorchTensorParallelConfig": TorchTensorParallelConfig}
    try:
        got = "OK " + repr(eval(ERRORS[name], scope))  # our own fixed expressions
    except Exception as error:  # noqa: BLE001 - the message is what is compared
        got = f"{type(error).__name__}: {error}"
    expected = EXPECTED["errors"][name].replace("accelerate.utils.dataclasses.", "engine.backends.parallelism_config.")
    assert got == expected


def test_tensor_parallelism_needs_no_transformers() -> None:
    assert EXPECTED["errors"]["tp_without_transformers"].startswith("PackageNotFoundError")  # Accelerate's
    assert ParallelismConfig(tp_size=2).tp_enabled and DELIBERATE["tp_without_transformers"] == "OK"


def test_sizes_come_from_the_environment_and_the_repr_is_accelerates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")
    config = ParallelismConfig()
    assert {"dp_shard_size": config.dp_shard_size, "total_size": config.total_size} == EXPECTED["dp_shard_2_from_env"]
    monkeypatch.delenv("PARALLELISM_CONFIG_DP_SHARD_SIZE")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    assert ParallelismConfig().tp_size == 2
    monkeypatch.delenv("PARALLELISM_CONFIG_TP_SIZE")
    assert repr(ParallelismConfig(dp_shard_size=2, tp_size=2)) == EXPECTED["repr_fsdp2_tp2"]


def test_the_world_size_must_be_the_product_in_accelerates_words() -> None:
    error = EXPECTED["processes"]["size_mismatch"]["cpu"]["error"]
    with pytest.raises(ValueError) as raised:
        ParallelismConfig(dp_shard_size=2).check_world(4)
    assert f"ValueError: {raised.value}" == error


def test_plan_errors_name_the_module_and_the_fix() -> None:
    model = TinyTransformer()
    with pytest.raises(ValueError, match=r"layers\.\*\.attention\.nope"):
        resolve_plan(model, {"layers.*.attention.nope": "colwise"}, 2)
    with pytest.raises(ValueError, match="diagonal"):
        resolve_plan(model, {"output": "diagonal"}, 2)
    with pytest.raises(ValueError, match="3"):
        resolve_plan(model, {"layers.*.attention.wq": "colwise"}, 3)  # 16 features do not split in 3
    resolved = resolve_plan(model, {"layers.*.attention.wq": "colwise", "output": "colwise_rep"}, 2)
    assert sorted(resolved) == ["layers.*.attention.wq", "output"]  # torch's parallelize_module matches "*"
    assert type(resolved["output"]).__name__ == "ColwiseParallel"
    assert type(resolved["layers.*.attention.wq"]).__name__ == "ColwiseParallel"


def test_named_dimensions_are_kept_at_size_one_and_bad_names_are_refused() -> None:
    # Ember's addition (the Trainer's ModelParallelStrategy names the engine's mesh Lightning's way); Accelerate's
    # fields, properties and repr stay as they are.
    config = ParallelismConfig(tp_size=2)
    assert config.mesh_dims == ["tp"] and config.mesh_name("tp") == "tp"
    config.name_mesh_dims({"dp_shard": "data_parallel", "tp": "tensor_parallel"})
    assert config.mesh_dims == ["dp_shard", "tp"] and config.active_mesh_dims == ["tp"]
    assert (config.mesh_name("dp_shard"), config.mesh_name("tp"), config.mesh_name("dp")) == (
        "data_parallel", "tensor_parallel", "dp")
    assert [f.name for f in dataclasses.fields(config)] == [f["name"] for f in EXPECTED["fields"]]
    with pytest.raises(ValueError, match=r"got the dimension 'pp'; the mesh's dimensions are"):
        config.name_mesh_dims({"pp": "pipeline"})
    with pytest.raises(ValueError, match=r"'tp': 'dp'\): a new name must be a non-empty string other than"):
        config.name_mesh_dims({"tp": "dp"})
    with pytest.raises(ValueError, match="two dimensions cannot take the same name"):
        config.name_mesh_dims({"tp": "x", "dp_shard": "x"})
