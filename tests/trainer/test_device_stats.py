"""``DeviceStatsMonitor`` against what lightning 2.6.6 logged on the same CPU runs (``tests/lightning_corpus/
device_stats.py``, recorded by ``record_corpus.py device_stats``): the keys, the hooks and the steps."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks.device_stats import DeviceStatsMonitor, get_device_stats
from tests.lightning_corpus.expected import EXPECTED

pytest.importorskip("psutil")
LIGHTNING = EXPECTED["device_stats"]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    module = importlib.import_module("tests.lightning_corpus.device_stats")
    return json.loads(json.dumps(module.main(str(tmp_path_factory.mktemp("device_stats")))))


@pytest.mark.parametrize("case", ["default", "cpu_stats_true", "cpu_stats_false", "every_2"])
def test_logged_keys_hooks_and_steps_match_lightning(observed: dict[str, Any], case: str) -> None:
    assert observed[case] == LIGHTNING[case]


def test_no_logger_is_refused_with_lightnings_text(observed: dict[str, Any]) -> None:
    assert observed["no_logger"].startswith(LIGHTNING["no_logger"].rstrip("."))


def test_cpu_stats_are_percentages() -> None:
    stats = get_device_stats(torch.device("cpu"))
    assert sorted(stats) == ["cpu_percent", "cpu_swap_percent", "cpu_vm_percent"]
    assert all(0.0 <= value <= 100.0 for value in stats.values())


def test_cpu_stats_argument_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cpu_stats=...\\) takes None, True or False. Received: 'yes'"):
        DeviceStatsMonitor(cpu_stats="yes")  # type: ignore[arg-type]
