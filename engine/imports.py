"""``is_*_available`` helpers with Accelerate's names: which optional packages are installed, which devices exist.

Each answers from the current environment when called (nothing is cached, so a package installed in a running
notebook counts), without importing the package: a package counts as installed when Python can find it *and* it
has installed metadata, as in Accelerate (a stray folder named ``wandb`` on the path is not wandb). Device checks
never initialise CUDA, so they are safe before ``notebook_launcher`` forks.

>>> is_torch_version(">=", "2.0")
True
>>> is_cuda_available() in (True, False)
True
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import operator
from collections.abc import Callable
from typing import Any

import torch

_OPERATIONS: dict[str, Callable[[Any, Any], Any]] = {  # typeshed types the operator functions loosely
    ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<=": operator.le, "<": operator.lt}


def _is_package_available(module: str, distribution: str | None = None) -> bool:
    """Whether ``import module`` would find an installed distribution (``distribution`` names its metadata)."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):  # a parent package that fails to import, or a broken __spec__
        return False
    try:
        importlib.metadata.distribution(distribution or module)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def compare_versions(library_or_version: str, operation: str, requirement_version: str) -> bool:
    """Compare an installed library's version (or a version string) with ``requirement_version``.

    >>> compare_versions("2.1.0", "<", "2.10")
    True
    """
    from torch.torch_version import TorchVersion  # torch's vendored PEP 440 comparison: no `packaging` needed

    if operation not in _OPERATIONS:
        raise ValueError(f"compare_versions(operation={operation!r}) is not one of {sorted(_OPERATIONS)}.")
    version = library_or_version
    if not version[:1].isdigit():
        version = importlib.metadata.version(library_or_version)
    return _OPERATIONS[operation](TorchVersion(version), requirement_version)


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch version, e.g. ``is_torch_version(">=", "2.4")``."""
    return compare_versions(str(torch.__version__), operation, version)


# -- devices -------------------------------------------------------------------------------------------------
def is_cuda_available() -> bool:
    """Whether a CUDA GPU is usable, asked through NVML (``torch.cuda.device_count``) so the CUDA driver is not
    initialised here: what ``torch.cuda.is_available()`` does under ``PYTORCH_NVML_BASED_CUDA_CHECK=1``."""
    return bool(torch.backends.cuda.is_built() and torch.cuda.device_count() > 0)


def is_rocm_available() -> bool:
    """This torch is a ROCm (AMD) build and a GPU is visible."""
    return torch.version.hip is not None and is_cuda_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    """Apple's Metal backend is built into this torch and usable on this machine."""
    mps = getattr(torch.backends, "mps", None)
    return bool(is_torch_version(">=", min_version) and mps is not None and mps.is_available() and mps.is_built())


def is_xpu_available(check_device: bool = False) -> bool:
    """An Intel XPU is usable (``check_device`` also requires at least one device to be visible)."""
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return False
    return not check_device or xpu.device_count() > 0


def _plugin_device_available(package: str, attribute: str, check_device: bool) -> bool:
    # Out-of-tree accelerators (Ascend NPU, Cambricon MLU, Moore Threads MUSA, ...) register `torch.<attribute>`
    # when their package is imported; without the package they cannot be used.
    if not _is_package_available(package):
        return False
    importlib.import_module(package)
    backend = getattr(torch, attribute, None)
    if backend is None or not backend.is_available():
        return False
    return not check_device or backend.device_count() > 0


def is_npu_available(check_device: bool = False) -> bool:
    """An Ascend NPU (``torch_npu``) is usable."""
    return _plugin_device_available("torch_npu", "npu", check_device)


def is_mlu_available(check_device: bool = False) -> bool:
    """A Cambricon MLU (``torch_mlu``) is usable."""
    return _plugin_device_available("torch_mlu", "mlu", check_device)


def is_musa_available(check_device: bool = False) -> bool:
    """A Moore Threads MUSA device (``torch_musa``) is usable."""
    return _plugin_device_available("torch_musa", "musa", check_device)


def is_hpu_available(init_hccl: bool = False) -> bool:
    """An Intel Gaudi HPU (``habana_frameworks``) is usable."""
    if not _is_package_available("habana_frameworks", "habana_torch_plugin"):
        return False
    import habana_frameworks.torch  # noqa: F401 - registers torch.hpu

    hpu = getattr(torch, "hpu", None)  # the module habana_frameworks adds to torch
    return bool(hpu is not None and hpu.is_available())


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """``torch_xla`` is installed (Ember runs no XLA backend; the answer is for scripts that branch on it)."""
    return _is_package_available("torch_xla")


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """bfloat16 can be used here: always on CPU; on CUDA when the GPU supports it; on MPS from macOS 14."""
    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_mps_available():
        return bool(torch.backends.mps.is_macos_or_newer(14, 0))
    return True


def is_fp16_available() -> bool:
    """float16 can be used here (everywhere but Gaudi 1, which Ember does not run on)."""
    return True


# -- packages ------------------------------------------------------------------------------------------------
def is_tensorboard_available() -> bool:
    return _is_package_available("tensorboard") or _is_package_available("tensorboardX")


def is_wandb_available() -> bool:
    return _is_package_available("wandb")


def is_comet_ml_available() -> bool:
    return _is_package_available("comet_ml")


def is_mlflow_available() -> bool:
    return _is_package_available("mlflow") or _is_package_available("mlflow", "mlflow-skinny")


def is_aim_available() -> bool:
    return _is_package_available("aim")


def is_clearml_available() -> bool:
    return _is_package_available("clearml")


def is_dvclive_available() -> bool:
    return _is_package_available("dvclive")


def is_swanlab_available() -> bool:
    return _is_package_available("swanlab")


def is_trackio_available() -> bool:
    return _is_package_available("trackio")


def is_schedulefree_available() -> bool:
    return _is_package_available("schedulefree")


def is_rich_available() -> bool:
    """Whether ``rich`` is installed (Accelerate also requires ``ACCELERATE_ENABLE_RICH=1``, its opt-in to rich
    tracebacks, which Ember does not have)."""
    return _is_package_available("rich")


def is_transformers_available() -> bool:
    return _is_package_available("transformers")


def is_datasets_available() -> bool:
    return _is_package_available("datasets")


def is_peft_available() -> bool:
    return _is_package_available("peft")


def is_timm_available() -> bool:
    return _is_package_available("timm")


def is_torchvision_available() -> bool:
    return _is_package_available("torchvision")


def is_deepspeed_available() -> bool:
    return _is_package_available("deepspeed")


def is_bnb_available(min_version: str | None = None) -> bool:
    if not _is_package_available("bitsandbytes"):
        return False
    return min_version is None or compare_versions("bitsandbytes", ">=", min_version)


def is_torchao_available(min_version: str = "0.6.1") -> bool:
    """Whether torchao (fp8 training, the ``fp8`` extra) is installed, at least ``min_version`` (as Accelerate)."""
    return _is_package_available("torchao") and compare_versions("torchao", ">=", min_version)


def is_pandas_available() -> bool:
    return _is_package_available("pandas")


def is_matplotlib_available() -> bool:
    return _is_package_available("matplotlib")


def is_torchdata_available() -> bool:
    return _is_package_available("torchdata")


def is_pytest_available() -> bool:
    return _is_package_available("pytest")


def is_boto3_available() -> bool:
    return _is_package_available("boto3")


def is_pynvml_available() -> bool:
    return _is_package_available("pynvml") or _is_package_available("pynvml", "nvidia-ml-py")


def is_triton_available() -> bool:
    return _is_package_available("triton")
