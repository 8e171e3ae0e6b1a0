"""``ProcessControl``: an Accelerator's barriers, who-goes-first blocks, per-process decorators and triggers."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from engine import operations
from engine.state import AcceleratorState, DistributedType


class ProcessControl:
    """Decisions that involve every process; each one is a thin layer over ``PartialState`` or a collective.

    Owns the trigger flag (``set_trigger`` / ``check_trigger``). Which process this is comes from ``state`` at each
    call; whether the run is distributed is fixed with the process group.

    >>> from engine import Accelerator
    >>> control = ProcessControl(Accelerator(cpu=True).state, use_distributed=False)
    >>> control.set_trigger()
    >>> control.check_trigger(), control.check_trigger()
    (True, False)
    """

    def __init__(self, state: AcceleratorState, use_distributed: bool) -> None:
        self.state = state
        self.use_distributed = use_distributed
        self.flag_tensor: torch.Tensor | None = None

    def wait_for_everyone(self) -> None:
        self.state.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.local_main_process_first()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> contextlib.AbstractContextManager[Any]:
        return self.state.split_between_processes(inputs, apply_padding=apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        self.state.print(*args, **kwargs)

    def _run_when(self, should_run: Callable[[], bool], function: Callable[..., Any]) -> Callable[..., Any]:
        # Decided at call time (unlike PartialState's decorators), as in Accelerate.
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if should_run() or not self.use_distributed:
                return function(*args, **kwargs)
            return None

        functools.update_wrapper(wrapper, function, assigned=(), updated=())  # sets __wrapped__ only
        wrapper.__name__ = getattr(function, "__name__", "wrapper")
        wrapper.__doc__ = function.__doc__
        return wrapper

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._run_when(lambda: self.state.is_main_process, function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._run_when(lambda: self.state.is_local_main_process, function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._run_when(lambda: self.state.is_last_process, function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        if function is None:
            return lambda f: self.on_process(f, process_index=process_index)
        return self._run_when(lambda: self.state.process_index == process_index, function)

    def on_local_process(self, function: Callable[..., Any] | None = None,
                         local_process_index: int | None = None) -> Any:
        if function is None:
            return lambda f: self.on_local_process(f, local_process_index=local_process_index)
        return self._run_when(lambda: self.state.local_process_index == local_process_index, function)

    def set_trigger(self) -> None:
        """Raise this process's flag; the next ``check_trigger`` returns True on every process."""
        self.flag_tensor = torch.tensor(1, device=self.state.device)

    def check_trigger(self) -> bool:
        """True on all processes if any process called ``set_trigger`` since the last check (then resets it)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.state.device)
        flag = operations.reduce(self.flag_tensor, "sum")
        if int(flag.item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self.state.device)
            return True
        return False

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], dataloaders: Sequence[Any],
                           even_batches: bool | None = None) -> Iterator[None]:
        """``torch.distributed.algorithms.Join`` over ``joinables`` for uneven inputs (multi-GPU DDP only);
        ``even_batches`` applies to ``dataloaders`` (the prepared ones) inside the block."""
        distributed_type = self.state.distributed_type
        if distributed_type != DistributedType.MULTI_GPU:
            if self.use_distributed:
                warnings.warn("join_uneven_inputs is only supported for multi-GPU DDP training; it has no effect "
                              f"with {distributed_type}.", stacklevel=3)
            yield
            return
        from torch.distributed.algorithms import Join

        loaders = [dl for dl in dataloaders if hasattr(dl, "set_even_batches")]
        previous = [dl.even_batches for dl in loaders]
        if even_batches is not None:
            for dl in loaders:
                dl.set_even_batches(even_batches)
        try:
            with Join(joinables):
                yield
        finally:
            for dl, value in zip(loaders, previous):
                dl.set_even_batches(value)


def mesh_rank(dim: str) -> property:
    """The Accelerator's ``*_parallel_rank`` property for the mesh dimension ``dim`` (its backend answers)."""
    def rank(self: Any) -> int:  # self: the Accelerator (which imports this module)
        return int(self.backend.mesh_rank(dim))
    return property(rank)
