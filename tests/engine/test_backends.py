"""One object per backend: the Accelerator delegates what differs between backends to ``accelerator.backend``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from engine import Accelerator
from engine.backends import Backend
from engine.backends.single import SingleProcess


class Recording(SingleProcess):
    """A backend that records every call the Accelerator delegates to it."""

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.calls: list[str] = []

    def wrap_model(self, model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> torch.nn.Module:
        self.calls.append(f"wrap_model({type(model).__name__}, {len(optimizers)} optimizer(s))")
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, models: Sequence[torch.nn.Module]) -> None:
        self.calls.append(f"prepare_optimizer({len(models)} model(s))")

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:  # type: ignore[override]
        self.calls.append("no_sync")
        yield

    def backward(self, loss: torch.Tensor, scaler: Any, **kwargs: Any) -> None:
        self.calls.append("backward")
        super().backward(loss, scaler, **kwargs)

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor:
        self.calls.append(f"clip_grad_norm_({max_norm})")
        return super().clip_grad_norm_(parameters, max_norm, norm_type)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        self.calls.append("full_state_dict")
        return super().full_state_dict(model)


def test_one_process_runs_on_the_single_process_backend() -> None:
    backend = Accelerator(cpu=True).backend
    assert isinstance(backend, Backend) and type(backend).__name__ == "SingleProcess"
    assert backend.places_models and backend.saves_mid_accumulation and backend.allows_inference_mode


def test_the_accelerator_delegates_what_differs_to_its_backend(tmp_path: Any) -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    backend = accelerator.backend = Recording(accelerator.state)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(2):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(4, 2)).sum())
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.get_state_dict(model)
    accelerator.save_state(str(tmp_path / "ckpt"))
    # One process: accumulate() takes its fast path (nothing to pause), so the backend's no_sync is not asked.
    assert backend.calls == ["wrap_model(Linear, 0 optimizer(s))", "prepare_optimizer(1 model(s))", "backward",
                             "backward", "clip_grad_norm_(0.5)", "full_state_dict", "full_state_dict"]
    with accelerator.no_sync(model):
        pass
    assert backend.calls[-1] == "no_sync"
