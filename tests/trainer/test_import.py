"""`import trainer` stays cheap: it needs no progress bar or tracker backend (they are imported when used)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("tqdm", "tensorboard", "wandb", "comet_ml", "mlflow", "torchmetrics", "matplotlib", "pandas",
            "jsonargparse", "torchao", "rich", "litlogger")


def test_import_trainer_works_with_every_optional_package_blocked() -> None:
    # A None entry in sys.modules makes `import tqdm` raise ImportError, so any eager import would fail here.
    code = (f"import sys; sys.modules.update(dict.fromkeys({OPTIONAL!r})); "
            "import trainer, callbacks; print('imported')")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"
