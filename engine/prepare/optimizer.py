"""``AcceleratedOptimizer``: an optimizer that only steps on gradient-sync micro-steps and reports scaler skips."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from engine.operations import send_to_device
from engine.state import GradientState

_TORCH_ZERO_GRAD = torch.optim.Optimizer.zero_grad
_profiler_enabled = torch._C._autograd._profiler_enabled


def zeroes_plainly(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.zero_grad()`` is torch's own (not overridden by its class or patched on the object), so
    ``clear_grads`` may stand in for it."""
    return type(optimizer).zero_grad is _TORCH_ZERO_GRAD and "zero_grad" not in vars(optimizer)


def clear_grads(optimizer: torch.optim.Optimizer, plain: bool) -> None:
    """``optimizer.zero_grad()`` (``set_to_none=True``), about 20 µs cheaper per call on CPU when that is allowed.

    torch's ``Optimizer.zero_grad`` wraps its loop (set every ``.grad`` to None) in a dynamo guard and a profiler
    range, which cost several times the loop on a small model. ``plain`` is ``zeroes_plainly(optimizer)``, worked
    out once by the caller; with it, and when neither wrapper can matter (no profiler recording, not inside
    ``torch.compile``), the loop runs alone: the same gradients end as None. Otherwise torch's method is called.
    """
    if plain and not _profiler_enabled() and not torch.compiler.is_compiling():
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
    else:
        optimizer.zero_grad()


def _set_step(optimizer: torch.optim.Optimizer, step: Callable[..., Any]) -> None:
    """Give ``optimizer`` an instance ``step`` (``AcceleratedOptimizer.step`` sees the scaler skip a step so)."""
    optimizer.step = step  # type: ignore[method-assign]  # shadows the method on this instance only, on purpose


class OptimizerView(torch.optim.Optimizer):
    """A real ``torch.optim.Optimizer`` (``isinstance`` holds) whose state lives in ``self.optimizer``.

    Base of the wrappers that change when or how ``step`` runs; ``torch.optim.Optimizer.__init__`` is deliberately
    not called, since it would build a second set of param groups.
    """

    optimizer: torch.optim.Optimizer

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, state: Any) -> None:
        self.optimizer.state = state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, param_groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.optimizer.defaults = defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)



class AcceleratedOptimizer(OptimizerView):
    """Wraps ``optimizer``; ``step`` / ``zero_grad`` do nothing while gradients are being accumulated.

    It is a real ``torch.optim.Optimizer`` subclass (``isinstance`` holds), but every piece of state
    (``state``, ``param_groups``, ``defaults``) lives in the wrapped optimizer.

    Args:
        optimizer: the optimizer to wrap.
        device_placement: move the optimizer state to the device of the process.
        scaler: the fp16 ``GradScaler``; with it, ``step_was_skipped`` tells whether the last step was skipped
            because of inf/nan gradients.
    """

    _is_accelerate_prepared: bool  # Accelerate's mark, set by Accelerator.prepare (declared, not defaulted)

    def __init__(self, optimizer: torch.optim.Optimizer, device_placement: bool = True,
                 scaler: torch.amp.GradScaler | None = None, device: torch.device | None = None) -> None:
        self.optimizer = optimizer
        self.scaler = scaler
        self.gradient_state = GradientState()
        self.device_placement = device_placement
        self._is_overflow = False
        parameters = inspect.signature(optimizer.zero_grad).parameters
        # A zero_grad taking **kwargs (a wrapper, a mock) is given set_to_none too.
        self._accepts_set_to_none = "set_to_none" in parameters or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        self._plain_zero_grad = zeroes_plainly(optimizer)
        if device_placement and device is not None and device.type != "cpu" and optimizer.state:
            state_dict = send_to_device(optimizer.state_dict(), device)
            optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        if not self.gradient_state.sync_gradients:
            return
        if self._plain_zero_grad and set_to_none is not False:
            clear_grads(self.optimizer, plain=True)
        elif set_to_none is None:
            self.optimizer.zero_grad(**({"set_to_none": True} if self._accepts_set_to_none else {}))
        elif self._accepts_set_to_none:
            self.optimizer.zero_grad(set_to_none=set_to_none)
        else:
            raise ValueError(f"`set_to_none={set_to_none}` was passed, but {type(self.optimizer).__name__}.zero_grad "
                             "does not accept it: call zero_grad() without arguments.")

    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> Any:
        """The wrapped optimizer's step (through the fp16 scaler), once the gradients are synchronised;
        ``kwargs`` go to that step (an optimizer taking extra step arguments: Lightning passes them through)."""
        if not self.gradient_state.sync_gradients:
            return None
        if self.scaler is None:
            return self.optimizer.step(**kwargs) if closure is None else self.optimizer.step(closure, **kwargs)
        # GradScaler.step silently skips the real step on inf/nan gradients; record whether it ran.
        ran = False
        had_own_step = "step" in vars(self.optimizer)
        real_step = self.optimizer.step

        def tracking_step(*args: Any, **kwargs: Any) -> Any:
            nonlocal ran
            ran = True
            return real_step(*args, **kwargs)

        _set_step(self.optimizer, tracking_step)
        try:
            result = (self.scaler.step(self.optimizer, closure, **kwargs) if closure is not None
                      else self.scaler.step(self.optimizer, **kwargs))
            self.scaler.update()
        finally:
            if had_own_step:
                _set_step(self.optimizer, real_step)
            else:
                del self.optimizer.step
        self._is_overflow = not ran
        return result

    def train(self) -> None:
        """Forward to schedule-free optimizers, which need to know the mode."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last ``step`` was skipped because the fp16 scaler found inf/nan gradients."""
        return self._is_overflow

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "gradient_state"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.gradient_state = GradientState()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


def unscale_gradients(scaler: Any, optimizers: Any) -> None:
    """Divide the gradients of ``optimizers`` (one, or a list; prepared or not) by ``scaler``'s loss scale."""
    for opt in optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]:
        scaler.unscale_(opt.optimizer if isinstance(opt, AcceleratedOptimizer) else opt)
