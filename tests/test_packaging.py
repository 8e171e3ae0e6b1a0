"""The package metadata builds without setuptools warnings (an install printed three per run before)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_applies_without_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("setuptools", minversion="77", reason="PEP 639 license expressions need setuptools >= 77")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # the readme and packages are found relative to the project
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), str(ROOT / "pyproject.toml"))
    assert [str(w.message) for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"  # an SPDX expression, not a table
