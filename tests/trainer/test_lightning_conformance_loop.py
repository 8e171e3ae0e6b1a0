"""Lightning loop behaviours Ember shares (issue 27, second round), each compared with what lightning 2.6.6 did on
the same scenario (``tests/lightning_corpus/conformance_loop.py``; the recording script runs the same file under
Lightning with its imports swapped back and writes ``tests/lightning_corpus/expected.py``)."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest

from tests.lightning_corpus.expected import EXPECTED
from tests.trainer.test_lightning_corpus import approx


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    module = importlib.import_module("tests.lightning_corpus.conformance_loop")
    return json.loads(json.dumps(module.main(str(tmp_path_factory.mktemp("conformance_loop")))))


@pytest.mark.parametrize("part", sorted(EXPECTED["conformance_loop"]))
def test_scenario_matches_lightning(observed: dict[str, Any], part: str) -> None:
    assert observed[part] == approx(EXPECTED["conformance_loop"][part])
