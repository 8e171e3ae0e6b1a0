"""The Lightning-style corpus (tests/lightning_corpus), with only its imports swapped, against what lightning
2.6.6 observed on the same seed (tests/lightning_corpus/expected.py, written by
tests/parity_scripts/record_corpus.py from the very same source files)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lightning_corpus.expected import EXPECTED

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "lightning_corpus"
# What a Lightning script imports from Ember: the swapped import lines are the only difference.
EMBER_ONLY = ("TrainModule", "pl.DataModule", "import DataModule", "log_with", "project_dir", "from engine",
              "import engine")


def approx(value: Any) -> Any:
    """``value`` with every float compared to 1e-5 relative (float reduction order may differ in the last bits)."""
    if isinstance(value, dict):
        return {k: approx(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [approx(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-5, abs=1e-6)
    return value


def _run(name: str, tmp_path: Path) -> dict[str, Any]:
    module = importlib.import_module(f"tests.lightning_corpus.{name}")
    return json.loads(json.dumps(module.main(str(tmp_path))))  # tuples -> lists, as recorded


def test_the_corpus_uses_only_lightning_names() -> None:
    for path in CORPUS.glob("*.py"):
        if path.name in ("expected.py", "__init__.py"):
            continue
        source = path.read_text()
        assert not [name for name in EMBER_ONLY if name in source], path.name


@pytest.mark.parametrize("name", ["demo", "gan", "classification", "plateau"])
def test_a_lightning_module_matches_lightning(name: str, tmp_path: Path) -> None:
    assert _run(name, tmp_path) == approx(EXPECTED[name])


def test_logger_objects_match_lightning(tmp_path: Path) -> None:
    got = _run("loggers", tmp_path)
    # The loggers get Lightning's steps (the count before each step), so their files match as they are.
    assert got == approx(EXPECTED["loggers"])


def test_hook_order_matches_lightning(tmp_path: Path) -> None:
    got = _run("hook_order", tmp_path)
    for stage in ("fit", "test"):
        assert got[stage] == EXPECTED["hook_order"][stage]


def test_devices_2_from_a_plain_python_process_matches_lightning(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_CURRENT_TEST", None)  # the script is a user's `python train.py`, not a test
    result = subprocess.run([sys.executable, str(CORPUS / "ddp_script.py"), str(out)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "starting 2 processes with torch.distributed.run" in result.stderr
    got = json.loads(out.read_text())
    assert got["world_size"] == 2 and got["rank"] == 0
    assert got == approx(EXPECTED["ddp"])
