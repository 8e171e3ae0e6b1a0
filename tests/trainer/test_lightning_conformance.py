"""Lightning behaviours Ember now shares (issue 27), each compared with what lightning 2.6.6 did on the same scenario.

The scenarios are ``tests/lightning_corpus/conformance.py`` (Lightning-style code; the recording script runs the same
file under Lightning with its imports swapped back and writes ``tests/lightning_corpus/expected.py``): checkpoint
names and rotation, early-stopping reasons, learning-rate monitor names, the Timer, true precisions, a module
without an optimizer, Trainer attributes, the default logger and ``hp_metric``, ``BackboneFinetuning``.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.lightning_corpus.expected import EXPECTED
from tests.trainer.test_lightning_corpus import approx


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    module = importlib.import_module("tests.lightning_corpus.conformance")
    return json.loads(json.dumps(module.main(str(tmp_path_factory.mktemp("conformance")))))


@pytest.mark.parametrize("part", ["early_stopping", "lr_monitor", "timer", "trainer_attributes", "finetuning"])
def test_scenarios_match_lightning(observed: dict[str, Any], part: str) -> None:
    assert observed[part] == approx(EXPECTED["conformance"][part])


def test_checkpoint_names_and_rotation_match_lightning(observed: dict[str, Any]) -> None:
    ours, lightning = dict(observed["checkpoints"]), dict(EXPECTED["conformance"]["checkpoints"])
    # Ember's messages hold Lightning's, then say what to do.
    for mine, theirs in zip(ours.pop("errors"), lightning.pop("errors"), strict=True):
        assert theirs.rstrip(".") in mine
    assert ours == approx(lightning)


def test_loggers_match_lightning(observed: dict[str, Any]) -> None:
    ours, lightning = dict(observed["loggers"]), dict(EXPECTED["conformance"]["loggers"])
    # A CSVLogger's folder: Lightning's files, and Ember's config.json (the same configuration as JSON).
    our_csv, their_csv = ours.pop("csv_logger"), lightning.pop("csv_logger")
    assert our_csv[:2] == their_csv[:2] and set(their_csv[2]) | {"config.json"} == set(our_csv[2])
    assert ours == approx(lightning)


def _run(name: str, tmp_path: Path) -> dict[str, Any]:
    module = importlib.import_module(f"tests.lightning_corpus.{name}")
    return json.loads(json.dumps(module.main(str(tmp_path))))


@pytest.mark.parametrize("name", ["bf16_transformer", "batchnorm_metrics"])
@pytest.mark.recorded_bits
def test_the_two_modules_of_issue_27_give_lightnings_weights_exactly(name: str, tmp_path: Path) -> None:
    # bf16-mixed + clipping + accumulation + a warm-up/cosine schedule over the estimated steps; BatchNorm +
    # torchmetrics + ReduceLROnPlateau + ModelCheckpoint + test on the best weights: equal to the last bit.
    assert _run(name, tmp_path) == EXPECTED[name]
