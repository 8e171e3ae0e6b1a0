"""Mixed precision: the autocast forward wrapper, the fp16 GradScaler and the autocast context."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch

from engine.config import AutocastKwargs, GradScalerKwargs
from engine.operations import convert_outputs_to_fp32
from engine.precision.cpu_features import bf16_slowdown_note, cpu_flags
from engine.precision.fp8 import require_torchao
from engine.precision.policy import MIXED_PRECISIONS as PRECISIONS
from engine.precision.policy import autocast_dtype


def validate_precision(mixed_precision: str | None) -> str | None:
    """Check a ``mixed_precision`` value (case-sensitive, as Accelerate's argument); fp8 needs torchao installed
    (checked now, before any state is built, without importing it)."""
    if mixed_precision is None:
        return None
    value = str(getattr(mixed_precision, "value", mixed_precision))
    if value not in PRECISIONS:
        choices = ", ".join(map(repr, PRECISIONS))
        raise ValueError(f"Unknown mixed_precision={mixed_precision!r}: choose one of {choices}.")
    if value == "fp8":
        require_torchao()
    return value


def check_autocast_support(device: torch.device, mixed_precision: str, cpu_bf16: str | None = None) -> None:
    """Fail now, with the fix, when this torch build cannot autocast to the requested dtype on ``device``; warn
    when CPU bf16 would be slower than fp32 (``cpu_bf16``: ``EMBER_CPU_BF16``, overriding the CPU's flags)."""
    dtype = autocast_dtype(mixed_precision)
    if dtype is None:
        return
    if device.type == "cpu" and dtype is torch.bfloat16:
        note = bf16_slowdown_note(cpu_flags(), cpu_bf16)
        if note is not None:
            # Said once per process (the warnings registry keys it on this line), not at every Accelerator.
            warnings.warn(note, UserWarning, stacklevel=1)
    try:
        with torch.autocast(device.type, dtype=dtype):
            pass
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"mixed_precision={mixed_precision!r} is not supported on {device} by torch "
                         f"{torch.__version__} ({err}); use mixed_precision='no' or another device.") from err


def make_grad_scaler(device: torch.device, mixed_precision: str, handler: GradScalerKwargs | None) -> Any:
    """The GradScaler fp16 needs (on CPU too: ``torch.amp.GradScaler("cpu")``), else None."""
    if mixed_precision != "fp16":
        return None
    kwargs = handler.to_kwargs() if handler is not None else {}
    return torch.amp.GradScaler(device.type, **kwargs)


def autocast_context(device: torch.device, mixed_precision: str,
                     handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
    dtype = autocast_dtype(mixed_precision)
    if dtype is None:
        return contextlib.nullcontext()
    kwargs = handler.to_kwargs() if handler is not None else {}
    return torch.autocast(device.type, dtype=dtype, **kwargs)


class AutocastForward:
    """A model's ``forward`` run under autocast, with fp16/bf16 outputs returned as fp32 (a plain callable,
    so the model stays picklable)."""

    def __init__(self, forward: Any, device_type: str, dtype: torch.dtype, cache_enabled: bool | None = None) -> None:
        self.forward = forward
        self.device_type = device_type
        self.dtype = dtype
        self.cache_enabled = cache_enabled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        extra = {} if self.cache_enabled is None else {"cache_enabled": self.cache_enabled}
        with torch.autocast(self.device_type, dtype=self.dtype, **extra):
            out = self.forward(*args, **kwargs)
        return convert_outputs_to_fp32(out)


def wrap_forward(model: torch.nn.Module, device: torch.device, mixed_precision: str,
                 handler: AutocastKwargs | None = None) -> None:
    """Replace ``model.forward`` by its autocast version, keeping the original as ``model._original_forward``."""
    dtype = autocast_dtype(mixed_precision)
    if dtype is None or isinstance(model.forward, AutocastForward):
        return
    if handler is not None and not handler.enabled:
        return
    model._original_forward = model.forward  # type: ignore[assignment]  # nn.Module's stub: Tensor | Module only
    model.forward = AutocastForward(model.forward, device.type, dtype,
                                    handler.cache_enabled if handler is not None else None)


def unwrap_forward(model: torch.nn.Module) -> None:
    """Undo ``wrap_forward``."""
    original = model.__dict__.pop("_original_forward", None)
    if original is not None:
        if getattr(original, "__self__", None) is model and "forward" in model.__dict__:
            del model.forward  # back to the class's method
        else:
            model.forward = original
