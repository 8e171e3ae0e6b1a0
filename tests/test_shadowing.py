"""A user's own ``callbacks.py`` / ``engine/`` / ``trackers.py`` beside their script hides Ember's package of that
name: importing Ember says which file hides which package and what to do, before running the user's file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(folder: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``python train.py`` in ``folder``: the script's folder comes first on sys.path, as for a user."""
    (folder / "train.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "train.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


# The user's file announces itself if it is ever run: the check must not run it.
RAN = "print('USER FILE RAN')\n"


@pytest.mark.parametrize(("shadow", "script", "hidden", "importer"), [
    ("callbacks.py", "from trainer import Trainer\n", "callbacks", "trainer"),
    ("engine/__init__.py", "from trainer import Trainer\n", "engine", "trainer"),
    ("trackers.py", "from engine import Accelerator\n", "trackers", "engine"),
    ("engine.py", "from callbacks import ModelCheckpoint\n", "engine", "callbacks"),
])
def test_a_shadowing_file_is_named_with_the_fix(shadow: str, script: str, hidden: str, importer: str,
                                               tmp_path: Path) -> None:
    path = tmp_path / shadow
    path.parent.mkdir(exist_ok=True)
    path.write_text(RAN + "from callbacks import Callback\n")
    done = run_script(tmp_path, script)
    assert done.returncode == 1
    assert "USER FILE RAN" not in done.stdout
    shown = str(path.parent) + os.sep if shadow.endswith("__init__.py") else str(path)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ember_packages.ShadowedPackageError: Ember's package {hidden!r} is shadowed by "), last
    assert shown in last and f"`import {importer}` would import it instead" in last and "Rename " in last


def test_a_package_ember_does_not_need_may_share_a_name(tmp_path: Path) -> None:
    # `engine` never imports `trainer`: a user's own trainer.py is fine with the engine alone.
    (tmp_path / "trainer.py").write_text("NAME = 'mine'\n")
    done = run_script(tmp_path, "from engine import Accelerator\nimport trainer\nprint(trainer.NAME)\n")
    assert done.returncode == 0 and done.stdout.strip() == "mine", done.stderr
