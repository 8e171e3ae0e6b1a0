"""``Precision``: how a run computes, as one value with one of four kinds.

- ``"full"``: fp32 throughout (Accelerate's ``mixed_precision="no"``, Lightning's ``"32-true"``).
- ``"mixed"``: fp32 weights, the forward pass under autocast to fp16 or bf16 (with a GradScaler for fp16).
- ``"fp8"``: torchao's float8 layers inside a bf16 autocast (``engine.precision.fp8``).
- ``"true"``: the whole model in one dtype (Lightning's ``"64-true"``, ``"16-true"``, ``"bf16-true"``): the
  module's floating parameters and buffers converted once, every batch's floating tensors converted before a
  step, and the dtype torch's default while a step runs (a tensor a step creates with ``torch.zeros`` has it).

The Accelerator's state answers ``precision`` with this value; the Trainer resolves its ``precision`` /
``mixed_precision`` keywords into one (``trainer.args.parse_precision``), hands the engine its
``mixed_precision`` and applies the true kind's conversions through the same value. The autocast dtypes live here
only (``engine.precision.mixed`` asks ``autocast_dtype``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils._pytree import tree_map

Kind = Literal["full", "mixed", "true", "fp8"]
MIXED_PRECISIONS = ("no", "fp16", "bf16", "fp8")  # Accelerate's mixed_precision values
# The autocast dtype of each mixed_precision (fp8 runs inside a bf16 autocast, as in Accelerate).
_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
_TRUE_DTYPES = (torch.float64, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Precision:
    """One run's precision: its ``kind`` and ``dtype`` (the autocast dtype for mixed / fp8, the whole model's for
    true, None for full).

    Example:
        >>> Precision.from_mixed_precision("bf16")
        Precision(kind='mixed', dtype=torch.bfloat16)
        >>> true = Precision.true("float64")
        >>> true.mixed_precision, true.autocast_dtype
        ('no', None)
        >>> module = true.convert_module(torch.nn.Linear(2, 1))
        >>> with true.step_context():
        ...     x = true.convert_input((torch.ones(1, 2), torch.tensor([1])))
        ...     module(x[0]).dtype, x[1].dtype, torch.zeros(1).dtype
        (torch.float64, torch.int64, torch.float64)
    """

    kind: Kind = "full"
    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        allowed: dict[str, tuple[torch.dtype | None, ...]] = {
            "full": (None,), "mixed": (torch.float16, torch.bfloat16), "fp8": (torch.bfloat16,), "true": _TRUE_DTYPES}
        if self.kind not in allowed:
            raise ValueError(f"Precision(kind={self.kind!r}): the kinds are {list(allowed)}.")
        if self.dtype not in allowed[self.kind]:
            raise ValueError(f"Precision(kind={self.kind!r}, dtype={self.dtype}): a {self.kind} precision takes a "
                             f"dtype among {list(allowed[self.kind])}.")

    @classmethod
    def from_mixed_precision(cls, mixed_precision: str) -> Precision:
        """The value of Accelerate's ``mixed_precision`` (``"no"``, ``"fp16"``, ``"bf16"``, ``"fp8"``)."""
        if mixed_precision not in MIXED_PRECISIONS:
            raise ValueError(f"Unknown mixed_precision={mixed_precision!r}: choose one of "
                             f"{', '.join(map(repr, MIXED_PRECISIONS))}.")
        if mixed_precision == "no":
            return cls()
        return cls("fp8" if mixed_precision == "fp8" else "mixed", _AUTOCAST[mixed_precision])

    @classmethod
    def true(cls, dtype: str | torch.dtype) -> Precision:
        """The whole model in ``dtype`` (``"float64"``, ``"float16"``, ``"bfloat16"`` or the ``torch.dtype``)."""
        resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        if resolved not in _TRUE_DTYPES:
            raise ValueError(f"Precision.true({dtype!r}): a true precision is one of "
                             f"{[str(d).removeprefix('torch.') for d in _TRUE_DTYPES]}.")
        return cls("true", resolved)

    @property
    def mixed_precision(self) -> str:
        """Accelerate's name of what the engine does with the forward pass (``"no"`` for full and true)."""
        if self.kind in ("full", "true"):
            return "no"
        names: dict[torch.dtype | None, str] = {torch.float16: "fp16", torch.bfloat16: "bf16"}  # a mixed kind's
        return "fp8" if self.kind == "fp8" else names[self.dtype]

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the forward pass autocasts to (None: no autocast)."""
        return self.dtype if self.kind in ("mixed", "fp8") else None

    # -- the true kind: the whole model and every batch in the dtype ----------------------------------------------
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module's floating parameters and buffers in the true dtype (in place; other kinds: unchanged)."""
        return module.to(dtype=self.dtype) if self.kind == "true" else module

    def convert_input(self, data: Any) -> Any:
        """Every floating tensor in a batch (nested lists, tuples, dicts) in the true dtype; other values, and
        every value under other kinds, unchanged."""
        if self.kind != "true":
            return data
        return tree_map(lambda x: x.to(self.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x,
                        data)

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """The true dtype as torch's default dtype inside the block (restored after it); other kinds: nothing."""
        if self.kind != "true":
            yield
            return
        previous = torch.get_default_dtype()
        assert self.dtype is not None  # a true precision always has one (__post_init__)
        torch.set_default_dtype(self.dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)


def autocast_dtype(mixed_precision: str) -> torch.dtype | None:
    """The autocast dtype of an Accelerate ``mixed_precision`` value (None for ``"no"`` or an unknown one)."""
    return _AUTOCAST.get(mixed_precision)
