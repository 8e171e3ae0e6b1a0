"""A fake ``lightning`` package whose public names are Ember's (the conformance run's shim; never shipped).

Put ``tests/parity_scripts/conformance/shim`` first on ``sys.path`` and ``import lightning.pytorch as pl`` gives
Ember: ``pl.Trainer`` is ``trainer.Trainer``, ``lightning.pytorch.callbacks.EarlyStopping`` is
``callbacks.EarlyStopping``, and so on, following the README's import table (``PUBLIC`` below). Lightning's test
scaffolding (``lightning.pytorch.demos.*``: ``BoringModel`` and friends) is executed from the Lightning checkout
named by ``LIGHTNING_CHECKOUT``, so it subclasses Ember's classes through this shim.

Every other module or name of Lightning is one of two kinds:

- **internal** (a private name, or a module of Lightning's machinery: loops, connectors, accelerators, plugins,
  Fabric...): importing it works, but using it raises ``LightningInternalUsed``; the conformance runner counts a
  test that fails that way as "reads Lightning internals" (out of scope), never as an Ember failure;
- **public but missing in Ember**: an ``ImportError`` / ``AttributeError`` naming it, counted as a failure.

The environment facts Lightning's test helpers read (``_TORCH_GREATER_EQUAL_2_8``, ``_RICH_AVAILABLE``, the
``RunIf`` reasons) are answered here from the installed packages (``HARNESS``): they describe the machine, not
Lightning's behaviour.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import sys
import types
from typing import Any

MARK = "<lightning internal:"
DEVICE_MARK = "<device only:"
# Public names that exist for TPUs only (XLA): using one raises LightningDeviceOnly, which the runner counts as
# "GPU/TPU/MPS-only"; importing one works, so a test file that imports it beside CPU tests still collects.
DEVICE_ONLY_NAMES = frozenset({"XLAStrategy", "SingleDeviceXLAStrategy", "XLAFSDPStrategy", "XLAProfiler"})

# Lightning module -> the Ember modules its names come from (searched in order). A listed package also resolves
# the public names of its public submodules (``lightning.pytorch.callbacks.early_stopping.EarlyStopping``).
PUBLIC: dict[str, tuple[str, ...]] = {
    "lightning": ("trainer",),
    "lightning.pytorch": ("trainer",),
    "lightning.pytorch.trainer": ("trainer", "trainer.states"),
    "lightning.pytorch.trainer.trainer": ("trainer",),
    "lightning.pytorch.trainer.states": ("trainer.states",),
    "lightning.pytorch.callbacks": ("callbacks",),
    "lightning.pytorch.core": ("trainer.core", "trainer"),
    "lightning.pytorch.core.module": ("trainer.core", "trainer"),
    "lightning.pytorch.core.datamodule": ("trainer.datamodule", "trainer.core", "trainer"),
    "lightning.pytorch.core.optimizer": ("trainer.core.optimizer",),
    "lightning.pytorch.core.saving": ("trainer.core.saving",),
    "lightning.pytorch.core.hooks": ("trainer.core.hooks",),
    "lightning.pytorch.core.mixins": ("trainer.hparams",),
    "lightning.pytorch.core.mixins.hparams_mixin": ("trainer.hparams",),
    "lightning.pytorch.loggers": ("trainer.loggers",),
    "lightning.pytorch.profilers": ("trainer.profiling",),
    "lightning.pytorch.strategies": ("trainer.strategies",),
    "lightning.pytorch.tuner": ("trainer.tuner",),
    "lightning.pytorch.tuner.batch_size_scaling": ("trainer.tools.batch_size",),
    "lightning.pytorch.cli": ("trainer.cli",),
    "lightning.pytorch.utilities": ("trainer.utilities",),
    "lightning.pytorch.utilities.rank_zero": ("trainer.utilities.rank_zero",),
    "lightning.pytorch.utilities.parsing": ("trainer.utilities.parsing", "trainer.hparams"),
    "lightning.pytorch.utilities.model_summary": ("callbacks.model_summary",),
    "lightning.pytorch.utilities.combined_loader": ("trainer.utilities.combined_loader",),
    "lightning.pytorch.utilities.types": ("trainer.utilities.types",),
    "lightning.pytorch.utilities.enums": ("trainer.utilities.enums",),
    "lightning.pytorch.utilities.seed": ("trainer.utilities.seed",),
    "lightning.pytorch.utilities.exceptions": ("trainer.utilities.exceptions",),
    "lightning.pytorch.utilities.warnings": ("trainer.utilities.warnings",),
    "lightning.fabric.utilities.seed": ("trainer.utilities.seed",),
    "lightning.fabric.utilities.spike": ("callbacks.spike",),
    "lightning.fabric.utilities.throughput": ("trainer.utilities.throughput",),
    "lightning.fabric.utilities.rank_zero": ("trainer.utilities.rank_zero",),
    "lightning.fabric.utilities.exceptions": ("trainer.utilities.exceptions",),
    "lightning.fabric.utilities.warnings": ("trainer.utilities.warnings",),
}
# Lightning submodule -> Ember submodule of the mapped package, where the names differ.
SUBMODULES = {"model_checkpoint": "checkpoint", "stochastic_weight_avg": "weight_averaging",
              "gradient_accumulation_scheduler": "accumulation", "throughput_monitor": "throughput",
              "progress.tqdm_progress": "tqdm_progress", "progress.progress_bar": "progress",
              "progress.rich_progress": "rich_progress", "csv_logs": "csv_logs",
              "tuning": "tuner", "device_stats_monitor": "device_stats"}
# Packages whose public submodules resolve through the package itself.
PUBLIC_PACKAGES = ("lightning.pytorch.callbacks", "lightning.pytorch.loggers", "lightning.pytorch.profilers",
                   "lightning.pytorch.strategies", "lightning.pytorch.tuner")
# Lightning's machinery: anything under these is internal (out of scope for a port).
INTERNAL_PREFIXES = ("lightning.fabric", "lightning.pytorch.loops", "lightning.pytorch.trainer.connectors",
                     "lightning.pytorch.trainer.call", "lightning.pytorch.trainer.setup",
                     "lightning.pytorch.trainer.configuration_validator", "lightning.pytorch.overrides",
                     "lightning.pytorch.plugins", "lightning.pytorch.accelerators", "lightning.pytorch.serve",
                     "lightning.pytorch.utilities.migration", "lightning.pytorch.utilities.upgrade_checkpoint",
                     "lightning.pytorch.utilities.signature_utils", "lightning.pytorch.utilities.model_helpers",
                     "lightning.pytorch.utilities.compile", "lightning.pytorch.utilities.data",
                     "lightning.pytorch.utilities.memory", "lightning.pytorch.utilities.argparse")
# Module attributes that are Lightning's implementation, not API (a module's logger object).
INTERNAL_NAMES = frozenset({"log"})
# Public-looking names that are Lightning's machinery (none now: trainer.strategies.Strategy answers Lightning's
# public strategy surface, backward included, which tests wrap to watch the loop).
INTERNAL_QUALIFIED: frozenset[str] = frozenset()
# Lightning's test scaffolding, executed from the checkout so that it subclasses Ember's classes.
SCAFFOLDING_PREFIX = "lightning.pytorch.demos"
# Environment facts for Lightning's test helpers (see module docstring).
HARNESS = ("lightning.pytorch.utilities.imports", "lightning.fabric.utilities.imports",
           "lightning.pytorch.utilities.testing", "lightning.fabric.utilities.testing")


class LightningInternalUsed(Exception):
    """A test used a Lightning internal that has no Ember counterpart by design."""


class LightningDeviceOnly(LightningInternalUsed):
    """A test used a name that exists for a device this harness does not run (a TPU)."""


def _internal_error(path: str) -> LightningInternalUsed:
    return LightningInternalUsed(f"{MARK} {path}> has no Ember counterpart (Lightning's machinery)")


class _InternalMeta(type):
    """The type of placeholders: every use but naming one raises ``LightningInternalUsed``."""

    _path: str

    def __new__(mcs, name: str, bases: tuple, namespace: dict, **kwargs: Any) -> Any:
        for base in bases:
            if isinstance(base, _InternalMeta):
                raise _internal_error(base._path)
        return super().__new__(mcs, name, bases, namespace)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise _internal_error(cls._path)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return placeholder(f"{cls._path}.{name}")

    def __setattr__(cls, name: str, value: Any) -> None:
        raise _internal_error(f"{cls._path}.{name}")

    def __instancecheck__(cls, instance: Any) -> bool:
        raise _internal_error(cls._path)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        raise _internal_error(cls._path)

    def __repr__(cls) -> str:
        return f"{MARK} {cls._path}>"

    def __iter__(cls) -> Any:
        raise _internal_error(cls._path)

    def __bool__(cls) -> bool:
        raise _internal_error(cls._path)


def placeholder(path: str) -> Any:
    """A stand-in for the Lightning internal ``path``."""
    cls = type.__new__(_InternalMeta, path.rsplit(".", 1)[-1], (), {})
    type.__setattr__(cls, "_path", path)
    return cls


class _DeviceOnlyMeta(_InternalMeta):
    """Placeholders of device-only names: every use raises ``LightningDeviceOnly``."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise LightningDeviceOnly(f"{DEVICE_MARK} {cls._path}> needs a TPU")

    def __instancecheck__(cls, instance: Any) -> bool:
        return False  # nothing in an Ember run is one


def device_placeholder(path: str) -> Any:
    """A stand-in for the device-only public name ``path``."""
    cls = type.__new__(_DeviceOnlyMeta, path.rsplit(".", 1)[-1], (), {})
    type.__setattr__(cls, "_path", path)
    return cls


class ShimModule(types.ModuleType):
    """A Lightning module whose names come from Ember modules (``sources``); private names are placeholders."""

    def __init__(self, name: str, sources: tuple[str, ...], internal: bool) -> None:
        super().__init__(name)
        self.__dict__["_shim_sources"] = sources
        self.__dict__["_shim_internal"] = internal
        self.__dict__["__path__"] = []  # a package: submodules are found by the finder

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        for module in _sources(self._shim_sources):
            if hasattr(module, name):
                return getattr(module, name)
        full = f"{self.__name__}.{name}"
        if name in DEVICE_ONLY_NAMES:
            return device_placeholder(full)
        if _lightning_has_module(full):
            return importlib.import_module(full)
        if self._shim_internal or name.startswith("_") or name in INTERNAL_NAMES or full in INTERNAL_QUALIFIED:
            return placeholder(full)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}: Ember has no {full}")

    def __setattr__(self, name: str, value: Any) -> None:
        binding = isinstance(value, types.ModuleType) or (name.startswith("__") and name.endswith("__"))
        if self._shim_internal and not binding:  # the import system binds submodules and dunders: let it  # mock.patch("lightning.pytorch.loops...") patches Lightning's machinery
            raise _internal_error(f"{self.__name__}.{name}")
        if not binding:
            # A name of the Ember counterpart (the first source) is set there, so that mock.patch(
            # "lightning.pytorch.callbacks.timer.time") changes what Ember's Timer reads; its undo comes back here.
            forwarded = self.__dict__.setdefault("_shim_forwarded", {})
            owner = forwarded[name][0] if name in forwarded else next(
                (m for m in _sources(self._shim_sources)[:1] if hasattr(m, name)), None)
            if owner is not None:
                forwarded.setdefault(name, (owner, getattr(owner, name)))
                setattr(owner, name, value)
                return
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        # mock.patch's undo of a forwarded name: the counterpart gets its own value back.
        forwarded = self.__dict__.get("_shim_forwarded", {})
        if name in forwarded:
            owner, original = forwarded.pop(name)
            setattr(owner, name, original)
            return
        super().__delattr__(name)

    def __dir__(self) -> list[str]:
        names: set[str] = set()
        for module in _sources(self._shim_sources):
            names.update(n for n in dir(module) if not n.startswith("_"))
        return sorted(names)


def _sources(names: tuple[str, ...]) -> list[types.ModuleType]:
    """The Ember modules named (one Ember does not have yet is skipped: its names are then missing)."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise
    return modules


def _checkout() -> str:
    path = os.environ.get("LIGHTNING_CHECKOUT", "")
    if not path or not os.path.isdir(os.path.join(path, "src", "lightning")):
        raise RuntimeError("LIGHTNING_CHECKOUT must name a Lightning checkout (with src/lightning). "
                           f"Received: {path!r}.")
    return path


def _source_file(name: str) -> str | None:
    base = os.path.join(_checkout(), "src", *name.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _lightning_has_module(name: str) -> bool:
    return _source_file(name) is not None


def _is_internal(name: str) -> bool:
    if any(part.startswith("_") for part in name.split(".")):
        return True
    return any(name == prefix or name.startswith(prefix + ".") for prefix in INTERNAL_PREFIXES)


def _public_sources(name: str) -> tuple[str, ...] | None:
    """The Ember modules a public Lightning module's names come from: its Ember counterpart first (so that
    ``mock.patch("lightning.pytorch.callbacks.timer.time")`` patches what Ember's ``Timer`` reads), then its
    package."""
    if name in PUBLIC:
        return PUBLIC[name]
    for package in PUBLIC_PACKAGES:
        if name.startswith(package + ".") and not _is_internal(name):
            tail = name[len(package) + 1:]
            ember_package = PUBLIC[package][0]
            counterpart = f"{ember_package}.{SUBMODULES.get(tail, tail)}"
            return (counterpart, *PUBLIC[package])
    return None


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name
        if name in HARNESS:
            return HarnessModule(name)
        if name == SCAFFOLDING_PREFIX or name.startswith(SCAFFOLDING_PREFIX + "."):
            module = types.ModuleType(name)
            module.__file__ = _source_file(name)
            if module.__file__ and module.__file__.endswith("__init__.py"):
                module.__path__ = []
            return module
        sources = _public_sources(name)
        if sources is not None:
            module = ShimModule(name, sources, internal=False)
            if name == "lightning.pytorch":  # the Lightning release whose checkpoint layout Ember writes
                from trainer.checkpoint.lightning_format import LIGHTNING_VERSION

                module.__dict__["__version__"] = LIGHTNING_VERSION
            return module
        # A Lightning module Ember does not map: machinery is internal; a public one lacks every name.
        return ShimModule(name, (), internal=_is_internal(name))

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == SCAFFOLDING_PREFIX or module.__name__.startswith(SCAFFOLDING_PREFIX + "."):
            with open(module.__file__) as f:  # type: ignore[arg-type]
                code = compile(f.read(), module.__file__, "exec")  # type: ignore[arg-type]
            exec(code, module.__dict__)  # noqa: S102 - Lightning's own scaffolding, from the checkout


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "lightning" and not fullname.startswith("lightning."):
            return None
        known = (fullname in PUBLIC or fullname in HARNESS or _lightning_has_module(fullname))
        if not known:
            return None
        is_package = fullname in PUBLIC or (_source_file(fullname) or "").endswith("__init__.py")
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=is_package)


class HarnessModule(types.ModuleType):
    """Environment facts Lightning's test helpers import: version flags, availability flags, ``RunIf`` reasons."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["__path__"] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name == "_runif_reasons":
            return runif_reasons
        if name == "_IS_WINDOWS":
            return sys.platform == "win32"
        match = re.fullmatch(r"_([A-Z0-9_]+?)_GREATER_EQUAL_(\d+(?:_\d+)*)", name)
        if match:
            return _version_at_least(match.group(1), match.group(2).replace("_", "."))
        match = re.fullmatch(r"_([A-Z0-9_]+)_AVAILABLE", name)
        if match:
            return _installed(match.group(1))
        return placeholder(f"{self.__name__}.{name}")


_DISTRIBUTIONS = {"TORCH": "torch", "TORCHMETRICS": "torchmetrics", "PYTHON": "python", "SKLEARN": "scikit-learn",
                  "TENSORBOARDX": "tensorboardX", "JSONARGPARSE": "jsonargparse"}


def _installed(flag: str) -> bool:
    distribution = _DISTRIBUTIONS.get(flag, flag.lower())
    try:
        importlib.metadata.version(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return importlib.util.find_spec(distribution.replace("-", "_")) is not None


def _version_at_least(flag: str, version: str) -> bool:
    from packaging.version import Version

    if flag == "PYTHON":
        installed = ".".join(map(str, sys.version_info[:3]))
    else:
        try:
            installed = importlib.metadata.version(_DISTRIBUTIONS.get(flag, flag.lower()))
        except importlib.metadata.PackageNotFoundError:
            return False
    return Version(Version(installed).base_version) >= Version(version)


def runif_reasons(*, min_cuda_gpus: int = 0, min_torch: str | None = None, max_torch: str | None = None,
                  min_python: str | None = None, bf16_cuda: bool = False, tpu: bool = False,
                  mps: bool | None = None, skip_windows: bool = False, standalone: bool = False,
                  deepspeed: bool = False, dynamo: bool = False, rich: bool = False, omegaconf: bool = False,
                  psutil: bool = False, sklearn: bool = False, onnx: bool = False, linux_only: bool = False,
                  onnxscript: bool = False, tensorrt: bool = False) -> tuple[list[str], dict[str, bool]]:
    """The reasons to skip a test on this machine, for ``RunIf(...)`` (the same keywords as Lightning's)."""
    import torch
    from packaging.version import Version

    reasons = []
    torch_version = Version(Version(torch.__version__).base_version)
    if min_cuda_gpus and torch.cuda.device_count() < min_cuda_gpus:
        reasons.append(f"GPUs>={min_cuda_gpus}")
    if min_torch and torch_version < Version(min_torch):
        reasons.append(f"torch>={min_torch}")
    if max_torch and torch_version >= Version(max_torch):
        reasons.append(f"torch<{max_torch}")
    if min_python and sys.version_info[:3] < tuple(int(p) for p in min_python.split(".")):
        reasons.append(f"python>={min_python}")
    if bf16_cuda and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        reasons.append("CUDA device bf16")
    if tpu:
        reasons.append("TPU")
    mps_available = torch.backends.mps.is_available()
    if mps is True and not mps_available:
        reasons.append("MPS")
    if mps is False and mps_available:
        reasons.append("not MPS")
    if (skip_windows and sys.platform == "win32") or (linux_only and sys.platform != "linux"):
        reasons.append("platform")
    if standalone and os.getenv("PL_RUN_STANDALONE_TESTS", "0") != "1":
        reasons.append("Standalone execution")
    for wanted, flag in ((deepspeed, "DEEPSPEED"), (rich, "RICH"), (omegaconf, "OMEGACONF"), (psutil, "PSUTIL"),
                         (sklearn, "SKLEARN"), (onnx, "ONNX"), (onnxscript, "ONNXSCRIPT"),
                         (tensorrt, "TORCH_TENSORRT")):
        if wanted and not _installed(flag):
            reasons.append(flag.lower())
    if dynamo and sys.platform == "win32":
        reasons.append("torch.dynamo")
    return reasons, {"strict": True} if standalone else {}


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
