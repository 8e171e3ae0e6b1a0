"""``AcceleratedScheduler``: steps the learning-rate scheduler only when the optimizer really stepped."""

from __future__ import annotations

from typing import Any

from engine.prepare.optimizer import AcceleratedOptimizer
from engine.state import GradientState, PartialState


class AcceleratedScheduler:
    """Wraps a scheduler so ``step()`` follows the optimizer (ENGINE.md 2.3).

    With ``step_with_optimizer`` (the default) the scheduler does not step on accumulation micro-steps or when
    the fp16 scaler skipped the optimizer step; otherwise it steps ``num_processes`` times per call (once with
    ``split_batches``), because each optimizer step consumed ``num_processes`` batches.
    """

    _is_accelerate_prepared: bool  # Accelerate's mark, set by Accelerator.prepare (declared, not defaulted)

    def __init__(self, scheduler: Any, optimizers: AcceleratedOptimizer | list[AcceleratedOptimizer],
                 step_with_optimizer: bool = True, split_batches: bool = False) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(opt.step_was_skipped for opt in self.optimizers if isinstance(opt, AcceleratedOptimizer)):
            return
        if self.split_batches:
            self.scheduler.step(*args, **kwargs)
            return
        total_steps = getattr(self.scheduler, "total_steps", None)
        for _ in range(PartialState().num_processes):
            # OneCycleLR raises past its total_steps; stop there instead.
            if total_steps is None or self.scheduler._step_count <= total_steps:
                self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> list[float]:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Read-only access to the wrapped scheduler's attributes (last_epoch, base_lrs, ...).
        if name.startswith("__") or name in ("scheduler", "optimizers", "gradient_state"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"
