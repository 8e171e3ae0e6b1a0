"""Where and how a module's tensors are created: Lightning's ``trainer.init_module()`` and
``strategy.tensor_init_context()``.

Inside the context, tensors are created on the run's device right away (no copy from the CPU later) and, under a
true precision (``precision="bf16-true"``, ``"64"`` ...), in its dtype. ``empty_init=True`` also skips the
``torch.nn.init`` calls of the layers' constructors: their memory is left as allocated (for a model whose weights a
checkpoint is about to replace). Every strategy does the same here: Ember's sharded strategies shard a module
built on the device (they do not materialise one built on the ``meta`` device as Lightning's FSDP does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from engine.precision.policy import Precision


class SkipInit(TorchFunctionMode):
    """Turns the in-place ``torch.nn.init`` functions that dispatch torch functions (``kaiming_uniform_``,
    ``uniform_``, ``normal_``, ``constant_`` ...: what the layers' ``reset_parameters`` call) into no-ops that return
    their tensor, so constructing a layer allocates its parameters without filling them (Lightning's rule too).

    Example:
        >>> with SkipInit():
        ...     weight = torch.nn.init.constant_(torch.zeros(2), 5.0)
        >>> weight.tolist()
        [0.0, 0.0]
    """

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" and func.__name__.endswith("_"):
            return args[0] if args else kwargs.get("tensor")
        return func(*args, **kwargs)


@contextlib.contextmanager
def tensor_init_context(device: torch.device, precision: Precision | None,
                        empty_init: bool | None = None) -> Iterator[None]:
    """Create tensors on ``device``, in ``precision``'s dtype when it is a true one, without the initialisation
    functions when ``empty_init`` (``None``: initialised, as Lightning's default strategies decide).

    Example:
        >>> with tensor_init_context(torch.device("cpu"), Precision.true("float64")):
        ...     layer = torch.nn.Linear(2, 1)
        >>> layer.weight.dtype, torch.get_default_dtype()
        (torch.float64, torch.float32)
    """
    with contextlib.ExitStack() as stack:
        if empty_init:
            stack.enter_context(SkipInit())
        stack.enter_context(device)
        if precision is not None and precision.kind == "true":
            stack.enter_context(precision.step_context())  # the true dtype as torch's default dtype
        yield
