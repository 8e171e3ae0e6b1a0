"""A module exported for serving: ``TrainModule.to_onnx`` and ``TrainModule.to_torchscript`` (Lightning's names and
arguments).

Both run the module in evaluation mode and give it back in the mode it was in; the sample input goes through the
module's batch-transfer hooks first (``on_before_batch_transfer``, ``transfer_batch_to_device`` to the module's
device, ``on_after_batch_transfer``), as a batch of the Trainer's would.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from trainer.utilities.rank_zero import LightningDeprecationWarning


class TrainModule(Protocol):
    """What an export needs of a ``trainer.TrainModule`` (named here without importing it: the module imports
    this file)."""

    training: bool

    @property
    def device(self) -> torch.device: ...
    def eval(self) -> Any: ...
    def train(self, mode: bool = True) -> Any: ...
    def modules(self) -> Iterator[torch.nn.Module]: ...
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any: ...
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any: ...
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any: ...

# Lightning 2.6's own words (observed), so that code filtering on them keeps working; Ember's version is not 2.7.
TORCHSCRIPT_DEPRECATION = (
    "TrainModule.to_torchscript, as Lightning's `LightningModule.to_torchscript` (which has been deprecated in v2.7 "
    "and will be removed in v2.8), is deprecated: TorchScript is deprecated in PyTorch. Use `torch.export.export()` "
    "for model exporting instead (https://pytorch.org/docs/stable/export.html).")


def _sample(module: TrainModule, sample: Any) -> Any:
    """``sample`` as a batch of the Trainer's reaches the module: through the transfer hooks, on its device."""
    sample = module.on_before_batch_transfer(sample, 0)
    sample = module.transfer_batch_to_device(sample, module.device, 0)
    return module.on_after_batch_transfer(sample, 0)


def _example(module: TrainModule, given: Any, missing: str) -> Any:
    if given is not None:
        return given
    example = getattr(module, "example_input_array", None)
    if example is None:
        raise ValueError(f"{missing}: pass one, or set `self.example_input_array` in the module's __init__.")
    return example


@contextlib.contextmanager
def _jit_reading(module: TrainModule) -> Iterator[None]:
    """torch.jit reads every attribute of the modules it compiles or traces: inside, an unattached module's
    ``trainer`` reads ``None`` instead of raising (Lightning's ``_jit_is_scripting``)."""
    children = list(module.modules())
    for child in children:
        child.__dict__["_jit_is_scripting"] = True
    try:
        yield
    finally:
        for child in children:
            child.__dict__.pop("_jit_is_scripting", None)


@torch.no_grad()
def to_torchscript(module: TrainModule, file_path: str | os.PathLike[str] | None = None,
                   method: str | None = "script", example_inputs: Any = None, **kwargs: Any) -> Any:
    """The module compiled to a ``torch.jit.ScriptModule`` (``method="script"``) or traced on ``example_inputs``
    (``method="trace"``; default ``example_input_array``), saved to ``file_path`` when given; ``kwargs`` go to
    ``torch.jit.script`` / ``torch.jit.trace``. Deprecated, as Lightning's (a ``LightningDeprecationWarning``, a
    ``DeprecationWarning``): TorchScript is deprecated in torch.

    Example:
        >>> import warnings
        >>> from trainer import TrainModule
        >>> class Tiny(TrainModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.layer = torch.nn.Linear(3, 2)
        ...     def forward(self, x):
        ...         return self.layer(x)
        >>> model = Tiny()
        >>> with warnings.catch_warnings(record=True):
        ...     traced = model.to_torchscript(method="trace", example_inputs=torch.ones(1, 3))
        >>> torch.equal(traced(torch.ones(1, 3)), model(torch.ones(1, 3))), model.training
        (True, True)
    """
    warnings.warn(TORCHSCRIPT_DEPRECATION, LightningDeprecationWarning, stacklevel=2)
    mode = module.training
    with _jit_reading(module):
        try:
            if method == "script":
                scripted = torch.jit.script(module.eval(), **kwargs)
            elif method == "trace":
                missing = (f"{type(module).__name__}.to_torchscript(method='trace') requires either `example_inputs` "
                           "or `model.example_input_array` to be defined")
                inputs = _sample(module, _example(module, example_inputs, missing))
                scripted = torch.jit.trace(func=module.eval(), example_inputs=inputs, **kwargs)
            else:
                raise ValueError(f"to_torchscript(method=...) only supports 'script' or 'trace'. Received: {method!r}.")
        finally:
            module.train(mode)
    if file_path is not None:  # any fsspec URL, as Lightning's (a local path, s3://, memory://, ...)
        import fsspec

        with fsspec.open(os.fspath(file_path), "wb") as handle:
            torch.jit.save(scripted, handle)
    return scripted


def to_onnx(module: TrainModule, file_path: str | os.PathLike[str] | Any = None, input_sample: Any = None,
            **kwargs: Any) -> Any:
    """Export the module with ``torch.onnx.export`` on ``input_sample`` (default ``example_input_array``) to
    ``file_path`` (a path or a binary file object); ``kwargs`` go to ``torch.onnx.export``, whose return value is
    returned (an ``ONNXProgram`` from torch's default exporter). Needs ``onnx`` (``pip install onnx``), and
    ``onnxscript`` for torch's default exporter (``dynamo=True``)."""
    name = type(module).__name__
    if importlib.util.find_spec("onnx") is None:
        raise ModuleNotFoundError(f"`{name}.to_onnx()` requires `onnx` to be installed: pip install onnx onnxscript "
                                  "(or ember-train[onnx]).")
    if kwargs.get("dynamo", True) and importlib.util.find_spec("onnxscript") is None:
        raise ModuleNotFoundError(f"`{name}.to_onnx()` exports with torch's dynamo exporter, which requires "
                                  "`onnxscript`: pip install onnxscript, or pass dynamo=False for the TorchScript "
                                  "exporter.")
    missing = "Could not export to ONNX since neither `input_sample` nor `model.example_input_array` attribute is set"
    sample = _sample(module, _example(module, input_sample, missing))
    mode = module.training
    try:
        target = os.fspath(file_path) if isinstance(file_path, os.PathLike) else file_path
        return torch.onnx.export(module.eval(), sample if isinstance(sample, tuple) else (sample,), target,
                                 **kwargs)
    finally:
        module.train(mode)
