"""Importing `trackers` / `engine` loads no tracking backend until a tracker of that kind starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, tempfile
heavy = ("tensorboard", "wandb", "comet_ml", "mlflow")
import trackers
loaded = [m for m in (*heavy, "tqdm") if m in sys.modules]
assert not loaded, f"import trackers loaded {loaded}"
import engine, engine.tracking.hub
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, f"import engine loaded {loaded}"

root = tempfile.mkdtemp()
hub = engine.tracking.hub.TrackerHub(["csv", "tensorboard", "wandb", "comet_ml", "mlflow"], root, is_main_process=True)
built = [trackers.TensorBoardTracker("p", root), trackers.WandBTracker("p"), trackers.CometMLTracker("p"),
         trackers.MLflowTracker("p", root)]
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, f"validating log_with or constructing trackers loaded {loaded}"

built[0].start()  # starting one kind loads that backend and no other
assert "tensorboard" in sys.modules and not {"wandb", "comet_ml", "mlflow"} & set(sys.modules)
built[0].finish()
print("ok")
"""


def test_backends_are_imported_only_when_a_tracker_starts() -> None:
    # A fresh interpreter: this test process has long imported every backend.
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
