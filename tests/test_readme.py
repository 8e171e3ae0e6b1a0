"""The README's quickstarts run as written: each ```python block under a "Quickstart" heading, in a fresh
interpreter, in an empty working directory (they write their runs/ there)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quickstarts() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = []
    for section in re.split(r"^## ", text, flags=re.MULTILINE):
        title = section.splitlines()[0] if section else ""
        if title.startswith("Quickstart"):
            code = "\n".join(re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL))
            found.append((title, code))
    return found


def test_the_readme_has_its_quickstarts() -> None:
    assert [title.split(":")[0] for title, _ in quickstarts()] == ["Quickstart 1", "Quickstart 2", "Quickstart 3"]


@pytest.mark.parametrize("title, code", quickstarts(), ids=lambda v: v.split(":")[0] if ":" in v else "code")
def test_a_quickstart_runs_as_written(title: str, code: str, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")  # Quickstart 1 logs to TensorBoard too
    script = tmp_path / "quickstart.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, f"{title}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
