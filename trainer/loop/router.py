"""`StepRouter`: ``training_step`` & co. through ``forward``, so the run's wrappers (DDP, FSDP2, autocast, a true
precision, ``torch.compile``) see every step; ``step_function``: a step called with the arguments it takes."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from engine.precision.policy import Precision
from trainer.tools.compiling import Compiler, strip_prefix

if TYPE_CHECKING:
    from trainer.module import TrainModule


class StepRouter(torch.nn.Module):
    """Sends ``training_step`` & co. through ``forward``, so DDP / FSDP2 / autocast wrappers see every step.

    DDP only all-reduces gradients of a backward that follows its own ``forward``, and FSDP2 gathers parameters
    in the root's forward; calling ``module.training_step`` directly would bypass both.

    The router is a second view of the module, not a wrapper around it: it shares the module's parameter,
    buffer and submodule tables. Its parameter names are the module's own (``net.weight``, no ``module.``
    prefix), so checkpoints hold the user's keys, and the fully qualified names FSDP2's distributed state-dict
    functions resolve on the sharded root (``getattr(router, "net")``) exist; a replacement ``fully_shard``
    makes (a ``DTensor`` for a parameter) is seen by both.

    Example:
        >>> from trainer import TrainModule
        >>> class Tiny(TrainModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(2, 1)
        >>> router = StepRouter(Tiny())
        >>> list(router.state_dict()), router.net is router.module.net
        (['net.weight', 'net.bias'], True)
    """

    # Set with object.__setattr__ in __init__ (plain attributes, not nn.Module children); declared for their types.
    _target: TrainModule
    _steps: dict[tuple[str, int], Callable[..., Any]]
    _compiler: Compiler | None
    _precision: Precision | None

    def __init__(self, module: TrainModule, compiler: Compiler | None = None,
                 precision: Precision | None = None) -> None:
        super().__init__()
        # A plain attribute (not a child): nn.Module.__getattr__ costs ~0.5 us on every step, and a child would
        # prefix every name with "module.".
        object.__setattr__(self, "_target", module)
        object.__setattr__(self, "_steps", {})
        object.__setattr__(self, "_compiler", compiler)  # torch.compile's the steps (and the forward they call)
        # The run's engine.precision.Precision when it is a true one (precision="64" / "16-true" / "bf16-true"):
        # the module in its dtype from here on, and every step's batch and default dtype too (forward).
        if precision is not None:
            precision.convert_module(module)
        object.__setattr__(self, "_precision", precision)
        for table in ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules"):
            object.__setattr__(self, table, getattr(module, table))

    @property
    def module(self) -> TrainModule:
        """The ``TrainModule`` this router steps."""
        return self._target

    def forward(self, step: str, *args: Any) -> Any:
        key = (step, len(args))
        fn = self._steps.get(key)
        if fn is None:
            fn = step_function(self._target, step, len(args))
            if self._compiler is not None:
                fn = self._compiler(fn)
            self._steps[key] = fn
        precision = self._precision
        if precision is not None:
            with precision.step_context():
                return fn(precision.convert_input(args[0]), *args[1:])
        return fn(*args)

    def state_dict(self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        """The module's keys; a ``torch.compile``d submodule's ``_orig_mod.`` level left out (as the module's)."""
        state = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        return strip_prefix(state, prefix)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Through the module's own ``load_state_dict`` (the tables are shared), so an override of it, or hooks
        registered on the module, run on a resume as they do in Lightning. ``assign`` is passed only when set:
        overrides written before torch added it take ``(state_dict, strict)`` only."""
        if assign:
            return self._target.load_state_dict(state_dict, strict=strict, assign=True)
        return self._target.load_state_dict(state_dict, strict=strict)

    def train(self, mode: bool = True) -> StepRouter:
        super().train(mode)
        self._target.training = mode  # the module itself is not one of the shared children
        return self


def step_function(module: TrainModule, name: str, given: int = 3) -> Callable[..., Any]:
    """``module.<name>`` called with as many of the ``given`` arguments (``batch, batch_idx[, dataloader_idx]``)
    as its signature takes.

    Lightning inspects the step's signature, so ``def training_step(self, batch)`` works; the check is done once
    here, and a step taking every given argument is returned as it is (no wrapper on the hot path).

    Example:
        >>> from trainer import TrainModule
        >>> class M(TrainModule):
        ...     def training_step(self, batch):
        ...         return batch * 2
        >>> step_function(M(), "training_step")(3, 0)
        6
    """
    fn = getattr(module, name)
    taken = 0
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return fn
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            taken += 1
    if taken >= given:
        return fn

    def call(*args: Any) -> Any:
        return fn(*args[:taken])

    return call

