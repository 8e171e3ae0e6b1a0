"""The four packages type-check: mypy passes with the project's configuration (``[tool.mypy]`` in pyproject.toml,
as ``make lint`` runs it), and the ``type: ignore`` comments that remain are few, each with its reason.

An ignore is for what the code cannot say to the checker (a gap in torch's or numpy's stubs, an attribute set on a
function or on a third-party object on purpose), never for an error that a correct annotation would fix: each
names its error code and says why on its line, e.g. ``# type: ignore[arg-type]  # torch's stub says float``.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "trainer", "callbacks", "trackers")
MAX_IGNORES = 19  # fewer than 20; lower it when one goes

_IGNORE = re.compile(r"#\s*type:\s*ignore\b")
# The error codes, then the reason as a comment of its own: `# type: ignore[code]  # why`.
_JUSTIFIED = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,\s*[a-z-]+)*\]\s+#\s*\S")


def _comments() -> list[tuple[str, int, str]]:
    """Every comment in the packages' Python files: (path, line, text)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.COMMENT:
                    found.append((str(path.relative_to(ROOT)), token.start[0], token.string))
    return found


def test_type_ignores_are_few_and_each_says_why() -> None:
    ignores = [(path, line, text) for path, line, text in _comments() if _IGNORE.search(text)]
    unjustified = [f"{path}:{line}: {text}" for path, line, text in ignores if not _JUSTIFIED.search(text)]
    assert unjustified == [], ("Each `type: ignore` names its error code(s) and says why on its line "
                               "(`# type: ignore[code]  # reason`):\n" + "\n".join(unjustified))
    assert len(ignores) <= MAX_IGNORES, (
        f"{len(ignores)} `type: ignore` comments (at most {MAX_IGNORES}): fix the types rather than ignore them.\n"
        + "\n".join(f"{path}:{line}" for path, line, _ in ignores))


def test_no_file_turns_the_checker_off() -> None:
    switched_off = [f"{path}:{line}: {text}" for path, line, text in _comments()
                    if re.search(r"#\s*mypy:", text)]
    assert switched_off == [], "Inline mypy settings (e.g. `# mypy: ignore-errors`):\n" + "\n".join(switched_off)


def test_mypy_passes_on_the_four_packages() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (it is in the `dev` extra: pip install -e '.[dev]')")
    result = subprocess.run([sys.executable, "-m", "mypy", *PACKAGES], cwd=ROOT, capture_output=True, text=True,
                            timeout=280, check=False)
    assert result.returncode == 0, f"mypy found errors (run `make lint`):\n{result.stdout}{result.stderr}"
    assert result.stdout.startswith("Success: no issues found"), result.stdout
