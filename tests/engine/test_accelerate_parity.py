"""Single-process behaviour that must match Hugging Face Accelerate 1.15 (values observed by running it).

Each expected value below was produced by the same user code with ``from accelerate import ...`` on CPU; the
tests do not import ``accelerate``. Deliberate differences are in ENGINE.md's decisions table, not here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from engine import Accelerator, GradientState, ProjectConfiguration


def _stream(make: Any, skip: int | None = None) -> dict[str, Any]:
    """Batches of two epochs and the global draws around them (think dropout), from a fixed global seed."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(3)
    loader = accelerator.prepare(make())
    out: dict[str, Any] = {"after_prepare": round(torch.rand(1).item(), 6)}
    if skip is not None:
        loader = accelerator.skip_first_batches(loader, skip)
    out["epochs"] = [[(b.tolist(), round(torch.rand(1).item(), 6)) for b in loader] for _ in range(2)]
    out["after"] = round(torch.rand(1).item(), 6)
    return out


def test_prepared_loaders_consume_the_global_rng_as_accelerate() -> None:
    # Per epoch: one draw for DataLoader's iterator seed; a RandomSampler without generator draws one more.
    assert _stream(lambda: DataLoader(list(range(10)), batch_size=2)) == {
        "after_prepare": 0.004264,
        "epochs": [[([0, 1], 0.026955), ([2, 3], 0.471614), ([4, 5], 0.060116), ([6, 7], 0.771866),
                    ([8, 9], 0.743699)],
                   [([0, 1], 0.451031), ([2, 3], 0.799491), ([4, 5], 0.149841), ([6, 7], 0.401469),
                    ([8, 9], 0.054177)]],
        "after": 0.459405}
    assert _stream(lambda: DataLoader(list(range(10)), batch_size=2, shuffle=True)) == {
        "after_prepare": 0.004264,
        "epochs": [[([6, 7], 0.060116), ([2, 1], 0.771866), ([5, 8], 0.743699), ([0, 4], 0.594421),
                    ([9, 3], 0.887857)],
                   [([2, 3], 0.054177), ([1, 8], 0.459405), ([4, 0], 0.175605), ([7, 6], 0.949183),
                    ([5, 9], 0.847319)]],
        "after": 0.874856}
    # A user generator gives the iterator seed too, before the sampler shuffles with it.
    assert _stream(lambda: DataLoader(list(range(10)), batch_size=2, shuffle=True,
                                      generator=torch.Generator().manual_seed(7))) == {
        "after_prepare": 0.004264,
        "epochs": [[([1, 3], 0.105569), ([5, 7], 0.285842), ([9, 4], 0.026955), ([6, 2], 0.471614),
                    ([8, 0], 0.060116)],
                   [([5, 1], 0.771866), ([6, 0], 0.743699), ([9, 7], 0.594421), ([8, 4], 0.887857),
                    ([3, 2], 0.451031)]],
        "after": 0.799491}


def test_prepare_returns_other_objects_unchanged() -> None:
    accelerator = Accelerator(cpu=True)
    model, scheduler = accelerator.prepare(torch.nn.Linear(1, 1), None)  # e.g. a run without a scheduler
    assert isinstance(model, torch.nn.Linear) and scheduler is None and accelerator.prepare(5) == 5


def test_gather_for_metrics_leaves_a_scalar_of_one_process_alone() -> None:
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(DataLoader(list(range(10)), batch_size=4))
    assert [accelerator.gather_for_metrics(b.sum()).tolist() for b in loader] == [6, 22, 17]


def test_reduce_ignores_scale_outside_xla() -> None:
    assert Accelerator(cpu=True).reduce(torch.tensor([1.0]), "sum", scale=2.0).tolist() == [1.0]


def test_gradient_state_reports_plugin_kwargs() -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.gradient_state.plugin_kwargs == {"num_steps": 1}
    assert repr(GradientState()) == ("Sync Gradients: True\nAt end of current dataloader: False\n"
                                     "Extra samples added: -1\nGradient accumulation plugin: {'num_steps': 1}\n")


@pytest.mark.parametrize("kwargs", [{"mixed_precision": "BF16"}, {"gradient_accumulation_steps": 2.0},
                                    {"gradient_accumulation_steps": True}])
def test_init_rejects_what_accelerate_rejects(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Accelerator(cpu=True, **kwargs)


def test_init_accepts_what_accelerate_accepts(tmp_path: Any) -> None:
    assert Accelerator(cpu=True, gradient_accumulation_steps="2").gradient_accumulation_steps == 2  # type: ignore
    GradientState._reset_state()
    config = ProjectConfiguration(project_dir=str(tmp_path / "config"))
    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path / "argument"), project_config=config)
    assert accelerator.project_dir == accelerator.logging_dir == str(tmp_path / "config")  # the config wins
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, log_with="all")  # "all" makes no logging-directory check...
    assert not {"csv", "tensorboard"} & set(accelerator._tracker_hub.names)  # ...it leaves those trackers out
