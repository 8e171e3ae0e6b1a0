"""Pytest plugin for the conformance run: one JSON line per test outcome (and per collection error).

Loaded on both sides (``-p conformance_report``) with ``CONFORMANCE_REPORT=<file>``: the runner reads the
outcomes back instead of parsing pytest's terminal output.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

_results: dict[str, dict[str, Any]] = {}


def _text(report: Any) -> str:
    if report.longrepr is None:
        return ""
    crash = getattr(report.longrepr, "reprcrash", None)
    full = str(report.longrepr)
    # The crash line names the exception; the tail of the traceback shows where it was raised.
    head = f"{crash.message}\n" if crash is not None else ""
    return head + full[-4000:]


_PATH = re.compile(r"""['"](/[^'"]+)['"]""")  # a quoted absolute path


def _folder_checkpoints(text: str) -> list[str]:
    """Paths the failure treated as files (``isfile(...)``, ``torch.load`` raising ``IsADirectoryError``) that are
    folders on disk right now: the test read a checkpoint that Ember writes as a folder."""
    lines = [line for line in text.splitlines() if "isfile" in line or "IsADirectoryError" in line
             or "getsize(" in line]
    return sorted({p for line in lines for p in _PATH.findall(line) if os.path.isdir(p)})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "text": ""})
    if report.failed:
        if entry["outcome"] != "failed":  # the first failing phase says why (setup before call before teardown)
            text = _text(report)
            entry.update(outcome="failed", text=text, when=report.when, folders=_folder_checkpoints(text))
    elif report.skipped and report.when in ("setup", "call"):
        if hasattr(report, "wasxfail"):
            entry.update(outcome="xfailed")
        else:
            entry.update(outcome="skipped")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _results[f"{report.nodeid}::<collection>"] = {"outcome": "failed", "text": _text(report),
                                                      "when": "collect"}


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("CONFORMANCE_REPORT")
    if path:
        with open(path, "w") as f:
            f.writelines(json.dumps({"nodeid": nodeid, **entry}) + "\n" for nodeid, entry in _results.items())
