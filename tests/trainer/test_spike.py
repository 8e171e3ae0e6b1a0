"""``SpikeDetection``: where it raises and which batches it excludes, on the loss sequences of
``tests/parity_scripts/record_spike.py``, as Lightning 2.6.6 did (its lines copied into ``LIGHTNING`` below)."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import SpikeDetection, TrainingSpikeException
from tests.trainer.helpers import QUIET
from trainer import Trainer, TrainModule

INF = float("inf")
# The scenarios of record_spike.py: the loss of each batch, and SpikeDetection's arguments.
SCENARIOS: dict[str, tuple[list[float], dict[str, Any]]] = {
    "steady": ([1.0, 0.9, 0.8, 0.7, 0.6, 0.5], {}),
    "jump": ([1.0, 0.9, 0.8, 0.7, 5.0, 0.5], {}),
    "small_jump": ([1.0, 0.9, 0.8, 0.7, 1.5, 0.5], {}),
    "inf": ([1.0, 0.9, 0.8, INF, 0.6, 0.5], {}),
    "inf_not_finite_only": ([1.0, 0.9, 0.8, INF, 0.6, 0.5], {"finite_only": False}),
    "nan_not_finite_only": ([1.0, 0.9, 0.8, float("nan"), 0.6, 0.5], {"finite_only": False}),
    "atol": ([1.0, 0.9, 0.8, 0.7, 2.0, 0.5], {"atol": 2.0}),
    "max_mode": ([1.0, 2.0, 3.0, 4.0, 0.1, 5.0], {"mode": "max", "rtol": 0.5}),
    "warmup": ([1.0, 9.0, 0.8, 0.7, 0.6, 0.5], {"warmup": 2}),
    "window": ([1.0, 1.0, 1.0, 3.5, 3.6, 3.7], {"window": 2}),
}


class Losses(TrainModule):
    """Returns the given loss at each batch (with a graph, so the step runs)."""

    def __init__(self, losses: list[float]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1, bias=False)
        self.losses = losses

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum() * 0 + self.losses[batch_idx]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

# record_spike.py on Lightning 2.6.6: the batch the exception names (None: none raised) and the excluded batches.
LIGHTNING: dict[str, tuple[int | None, list[int] | None]] = {
    "steady": (None, None), "jump": (4, [3, 4]), "small_jump": (None, None), "inf": (3, [2, 3]),
    "inf_not_finite_only": (3, [2, 3]), "nan_not_finite_only": (None, None), "atol": (None, None),
    "max_mode": (4, [3, 4]), "warmup": (None, None), "window": (3, [2, 3]),
}


def test_a_given_nonfinite_policy_still_wins_over_the_spike_callback(tmp_path: Any) -> None:
    losses = SCENARIOS["nan_not_finite_only"][0]
    trainer = Trainer(**{**QUIET, "max_epochs": 1, "on_nonfinite_loss": "raise",
                         "callbacks": [SpikeDetection(exclude_batches_path=tmp_path / "x.json", finite_only=False)]})
    with pytest.raises(FloatingPointError, match="Non-finite loss"):
        trainer.fit(Losses(losses), DataLoader(torch.ones(len(losses), 1), batch_size=1))
    assert Trainer(**QUIET).loss_check.policy == "raise"


@pytest.mark.parametrize("name", sorted(LIGHTNING))
def test_spikes_as_lightning(tmp_path: Any, name: str) -> None:
    losses, options = SCENARIOS[name]
    path = tmp_path / "skip.json"
    # Ember stops at a non-finite loss by default; with a SpikeDetection attached (and on_nonfinite_loss not
    # given) the callback decides, as in Lightning, which these scenarios need.
    trainer = Trainer(**{**QUIET, "max_epochs": 1,
                         "callbacks": [SpikeDetection(exclude_batches_path=path, **options)]})
    raised = None
    try:
        trainer.fit(Losses(losses), DataLoader(torch.ones(len(losses), 1), batch_size=1))
    except TrainingSpikeException as error:
        raised = error.batch_idx
        assert str(error) == f"Training spike detected in batch {raised}"
    excluded = json.loads(path.read_text()) if path.exists() else None
    assert (raised, excluded) == LIGHTNING[name]


def test_default_path_is_in_the_root_dir_and_state_round_trips(tmp_path: Any) -> None:
    detector = SpikeDetection()
    trainer = Trainer(**{**QUIET, "max_epochs": 1, "default_root_dir": str(tmp_path), "callbacks": [detector]})
    with pytest.raises(TrainingSpikeException):
        trainer.fit(Losses([1.0, 0.9, 0.8, 0.7, 5.0, 0.5]), DataLoader(torch.ones(6, 1), batch_size=1))
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [3, 4]
    copy = SpikeDetection()
    copy.load_state_dict(pickle.loads(pickle.dumps(detector.state_dict())))
    assert copy.state_dict() == detector.state_dict() and copy.running_mean == pytest.approx(0.85)


@pytest.mark.parametrize(("kwargs", "match"), [({"mode": "mean"}, "mode"), ({"window": 0}, "window"),
                                               ({"warmup": -1}, "warmup"), ({"rtol": "2"}, "rtol")])
def test_bad_arguments_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SpikeDetection(**kwargs)
