"""``engine.utils`` (Accelerate's ``accelerate.utils`` names), the ``is_*_available`` helpers, debug mode and the
reset-state message, in one process.

Observed with Accelerate 1.15.0 (``tests/parity_scripts/issue17_differential.py accelerate``):
- after ``AcceleratorState._reset_state()``, ``acc.state.mixed_precision`` raises AttributeError
  "'AcceleratorState' object has no attribute 'mixed_precision'"; after ``_reset_state(True)``,
  ``acc.state.num_processes`` raises AttributeError "... This happens if `AcceleratorState._reset_state()` was
  called ...". Ember raises AttributeError naming ``_reset_state()`` in both cases.
- ``PartialState().debug`` is False by default and settable.
- ``is_*_available`` answer None (not False) for a missing package, and ``is_rich_available()`` is False unless
  ``ACCELERATE_ENABLE_RICH`` is set even when rich is installed; Ember answers True/False for "is it installed".
  Side by side in one environment (the reference venv, both packages importable), all 36 helpers the two share
  agree in truthiness except ``is_rich_available`` (Accelerate False, Ember True: rich is installed there).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import engine
from engine import (
    Accelerator,
    AcceleratorState,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    PartialState,
    utils,
)
from engine.imports import _is_package_available

# The names the issue asks `engine.utils` to carry, as `accelerate.utils` spells them.
PORTED = ["set_seed", "gather", "gather_object", "broadcast", "broadcast_object_list", "reduce",
          "pad_across_processes", "send_to_device", "DistributedDataParallelKwargs", "GradScalerKwargs",
          "InitProcessGroupKwargs", "AutocastKwargs", "KwargsHandler", "ProjectConfiguration",
          "DataLoaderConfiguration", "GradientAccumulationPlugin", "FullyShardedDataParallelPlugin",
          "DistributedType", "DDPCommunicationHookType", "synchronize_rng_state", "synchronize_rng_states",
          "copy_tensor_to_devices", "is_torch_version", "is_tensorboard_available", "is_wandb_available",
          "is_comet_ml_available", "is_mlflow_available", "is_xpu_available", "is_npu_available", "is_mps_available",
          "is_cuda_available", "is_bf16_available", "is_fp16_available", "is_schedulefree_available",
          "is_rich_available", "is_transformers_available", "is_datasets_available", "is_deepspeed_available",
          "recursively_apply", "find_batch_size", "find_device", "concatenate", "convert_outputs_to_fp32",
          "extract_model_from_parallel", "wait_for_everyone", "patch_environment", "clear_environment",
          "compare_versions", "RNGType"]


def test_engine_utils_carries_accelerates_names_as_the_engines_own_objects() -> None:
    missing = [name for name in PORTED if not hasattr(utils, name)]
    assert missing == []
    assert set(PORTED) <= set(utils.__all__)
    for name in ("gather", "set_seed", "DistributedType", "DistributedDataParallelKwargs", "send_to_device"):
        assert getattr(utils, name) is getattr(engine, name)  # re-exports, not copies
    assert utils.FullyShardedDataParallelPlugin is engine.FullyShardedDataParallelPlugin
    assert engine.DDPCommunicationHookType is utils.DDPCommunicationHookType
    assert callable(engine.notebook_launcher) and callable(engine.debug_launcher)


def _only_in(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `root` the only place packages and their metadata can be found (hides real installations)."""
    import importlib.machinery
    import importlib.metadata
    import importlib.util

    def find_spec(name: str, package: str | None = None) -> object:
        return importlib.machinery.PathFinder.find_spec(name, [str(root)])

    def distribution(name: str) -> object:
        found = list(importlib.metadata.distributions(name=name, path=[str(root)]))
        if not found:
            raise importlib.metadata.PackageNotFoundError(name)
        return found[0]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


@pytest.mark.parametrize(("helper", "module", "distribution"), [
    ("is_tensorboard_available", "tensorboard", "tensorboard"),
    ("is_tensorboard_available", "tensorboardX", "tensorboardX"), ("is_wandb_available", "wandb", "wandb"),
    ("is_comet_ml_available", "comet_ml", "comet_ml"), ("is_mlflow_available", "mlflow", "mlflow"),
    ("is_mlflow_available", "mlflow", "mlflow-skinny"),
    ("is_schedulefree_available", "schedulefree", "schedulefree"), ("is_rich_available", "rich", "rich"),
    ("is_transformers_available", "transformers", "transformers"),
    ("is_datasets_available", "datasets", "datasets"), ("is_deepspeed_available", "deepspeed", "deepspeed"),
])
def test_package_helpers_answer_whether_the_package_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 helper: str, module: str, distribution: str) -> None:
    check = getattr(utils, helper)
    _only_in(tmp_path, monkeypatch)
    assert check() is False
    (tmp_path / module).mkdir()
    (tmp_path / module / "__init__.py").write_text("")
    assert check() is False  # a bare folder of that name is not the package: no installed metadata
    info = tmp_path / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    assert check() is True


def test_package_helpers_agree_with_this_environment() -> None:
    import importlib.util

    for helper, module in (("is_tensorboard_available", "tensorboard"), ("is_wandb_available", "wandb"),
                           ("is_comet_ml_available", "comet_ml"), ("is_transformers_available", "transformers"),
                           ("is_datasets_available", "datasets"), ("is_deepspeed_available", "deepspeed")):
        present = importlib.util.find_spec(module) is not None
        assert getattr(utils, helper)() is present or (helper == "is_tensorboard_available"
                                                        and utils.is_tensorboard_available()), helper
    assert _is_package_available("torch") is True
    assert _is_package_available("no_such_package_for_ember_tests") is False


def test_device_and_version_helpers_are_truthful() -> None:
    assert utils.is_cuda_available() is torch.cuda.is_available()
    mps = torch.backends.mps.is_available() and torch.backends.mps.is_built()
    assert utils.is_mps_available() is mps
    assert utils.is_xpu_available() is bool(hasattr(torch, "xpu") and torch.xpu.is_available())
    if not _is_package_available("torch_npu"):
        assert utils.is_npu_available() is False
    assert utils.is_bf16_available() is (torch.cuda.is_bf16_supported() if torch.cuda.is_available() else True)
    assert utils.is_fp16_available() is True
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    assert utils.is_torch_version(">=", f"{major}.{minor}") is True
    assert utils.is_torch_version("<", f"{major}.{minor}") is False
    assert utils.is_torch_version(">", f"{major + 1}.0") is False
    assert utils.compare_versions("torch", ">=", "2.0") is True
    assert utils.compare_versions("2.1.0", "<", "2.10") is True  # numeric, not string, comparison
    with pytest.raises(ValueError, match=r"operation='~='\) is not one of"):
        utils.compare_versions("torch", "~=", "2.0")


def test_patch_environment_restores_what_was_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_TEST_KEEP", "before")
    with utils.patch_environment(ember_test_keep="during", ember_test_new=3):
        assert os.environ["EMBER_TEST_KEEP"] == "during" and os.environ["EMBER_TEST_NEW"] == "3"
    assert os.environ["EMBER_TEST_KEEP"] == "before" and "EMBER_TEST_NEW" not in os.environ
    with utils.clear_environment():
        assert "EMBER_TEST_KEEP" not in os.environ
    assert os.environ["EMBER_TEST_KEEP"] == "before"


def test_reset_state_message_names_reset_state_not_partial_state() -> None:
    accelerator = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match=r"AcceleratorState._reset_state\(\)") as raised:
        _ = accelerator.state.mixed_precision
    assert "'PartialState' object has no attribute" not in str(raised.value)
    with pytest.raises(AttributeError, match=r"_reset_state\(\)"):
        _ = accelerator.mixed_precision
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(AttributeError, match=r"PartialState._reset_state\(\)"):
        _ = accelerator.state.num_processes
    with pytest.raises(AttributeError, match=r"PartialState._reset_state\(\)"):
        _ = accelerator.state.debug
    with pytest.raises(AttributeError, match="no attribute 'not_a_field'"):
        _ = PartialState().not_a_field  # a fresh state: unknown names stay plain AttributeErrors


def test_preparing_after_reset_state_fails_early_in_accelerates_words() -> None:
    # What Accelerate's own test_script.py (test_reinstantiated_state) asserts of the message.
    accelerator = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError) as raised:
        accelerator.prepare(torch.nn.Linear(1, 1))
    message = str(raised.value.args[0])
    assert "`AcceleratorState` object has no attribute" in message
    assert "This happens if `AcceleratorState._reset_state()`" in message and "create an `Accelerator()`" in message


def test_an_unpickled_accelerator_has_an_equal_state() -> None:
    # What Accelerate's own test_distributed_data_loop.py (test_pickle_accelerator) asserts; the states are views
    # of the process's one record, so nothing identity-bound may sit in their __dict__.
    import pickle

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=2))
    unpickled = pickle.loads(pickle.dumps(accelerator))
    assert accelerator.state.__dict__ == unpickled.state.__dict__
    assert (unpickled.state.num_processes, unpickled.state.mixed_precision) == (1, "no")


def test_debug_mode_is_settable_and_read_from_accelerate_debug_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    state = PartialState()
    assert state.debug is False
    state.debug = True
    assert PartialState().debug is True  # one shared record
    Accelerator(cpu=True)
    assert AcceleratorState().debug is True
    AcceleratorState().debug = False
    assert PartialState().debug is False
    with pytest.raises(TypeError, match="True or False, got 'yes'"):
        state.debug = "yes"  # type: ignore[assignment]
    AcceleratorState._reset_state(reset_partial_state=True)
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")
    assert PartialState().debug is True
    # In one process the checks have nobody to compare with: the collectives behave as usual.
    assert utils.gather(torch.ones(2)).tolist() == [1.0, 1.0]
    assert utils.copy_tensor_to_devices(torch.arange(3)).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="single process"):
        utils.copy_tensor_to_devices(None)


def test_ddp_kwargs_take_accelerates_hook_settings_and_refuse_settings_with_no_effect() -> None:
    kwargs = DistributedDataParallelKwargs(comm_hook="power_sgd", comm_wrapper=DDPCommunicationHookType.FP16,
                                           comm_state_option={"matrix_approximation_rank": 2})
    assert kwargs.comm_hook is DDPCommunicationHookType.POWER_SGD
    assert kwargs.comm_wrapper is DDPCommunicationHookType.FP16
    # As Accelerate: the hook settings are not DDP arguments.
    assert "comm_hook" not in kwargs.to_dict() and kwargs.to_kwargs() == {}
    assert DistributedDataParallelKwargs(bucket_cap_mb=5, comm_hook="fp16").to_kwargs() == {"bucket_cap_mb": 5}
    with pytest.raises(ValueError, match=r"comm_hook='fp32'\) is not one of"):
        DistributedDataParallelKwargs(comm_hook="fp32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"comm_wrapper='power_sgd'\) is not one of \['no', 'fp16', 'bf16'\]"):
        DistributedDataParallelKwargs(comm_hook="fp16", comm_wrapper="power_sgd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="comm_hook='no'"):
        DistributedDataParallelKwargs(comm_wrapper="fp16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only applies to PowerSGD hooks"):
        DistributedDataParallelKwargs(comm_hook="fp16", comm_state_option={"matrix_approximation_rank": 2})
    with pytest.raises(ValueError, match=r"unknown PowerSGDState arguments \['rank'\]"):
        DistributedDataParallelKwargs(comm_hook="power_sgd", comm_state_option={"rank": 2})
