"""MkDocs hooks (``hooks:`` in mkdocs.yml): the pictures generated from real runs join the site.

``docs/gen/figures.py`` writes them into ``build/docs/`` (not committed; ``make docs`` runs it first). A build
without them runs it here, so ``mkdocs build`` alone also works; ``EMBER_DOCS_REGENERATE=1`` forces a new run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "build" / "docs"
EXPECTED = ("figures/curves.png", "figures/hook_timeline.png", "demo_run_tree.txt", "hook_timeline.txt")


def on_config(config: MkDocsConfig, **kwargs: Any) -> MkDocsConfig:
    missing = [name for name in EXPECTED if not (GENERATED / name).exists()]
    if missing or os.environ.get("EMBER_DOCS_REGENERATE") == "1":
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        subprocess.run([sys.executable, str(ROOT / "docs" / "gen" / "figures.py"), str(GENERATED)], env=env,
                       check=True)
    return config


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    for path in sorted((GENERATED / "figures").glob("*.png")):
        files.append(File.generated(config, f"figures/{path.name}", abs_src_path=str(path)))
    return files
