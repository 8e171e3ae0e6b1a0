"""TensorBoard folders, files and tags as the real libraries write them, read back from the event files.

``RECORDED`` is what Accelerate 1.15's tracker and Lightning 2.6's ``TensorBoardLogger`` wrote for the same
calls (tests/parity_scripts/record_tensorboard_layout.py). Each of Ember's two APIs must write its library's
layout: the engine's ``log_with="tensorboard"`` Accelerate's (a dict as ``add_scalars`` sub-folders, the
configuration in a timestamped sub-run and a ``hparams.yml``), ``trainer.loggers.TensorBoardLogger``
Lightning's (the same sub-folders, the configuration in the version folder itself).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine import Accelerator
from tests.trackers.tensorboard_layout import CONFIG, STEPS, layout
from tests.trackers.tensorboard_recorded import RECORDED
from trackers import TensorBoardTracker
from trainer.loggers import TensorBoardLogger


def test_the_engine_writes_accelerates_layout(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path))
    accelerator.init_trackers("proj", config=CONFIG)
    for values, step in STEPS:
        accelerator.log(values, step=step)
    accelerator.end_training()
    assert layout(str(tmp_path)) == RECORDED["accelerate"]


def test_the_lightning_logger_writes_lightnings_layout(tmp_path: Path) -> None:
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    logger.log_hyperparams(CONFIG)
    for values, step in STEPS:
        logger.log_metrics({k: v for k, v in values.items() if not isinstance(v, str)}, step=step)
    logger.finalize("success")
    assert layout(str(tmp_path)) == RECORDED["lightning"]


def test_a_resumed_run_hides_what_its_groups_logged_after_the_checkpoint(tmp_path: Path) -> None:
    first = TensorBoardTracker("proj", tmp_path)
    first.start()
    for step in range(4):
        first.log({"glue": {"acc": float(step)}, "loss": float(step)}, step=step)
        if step == 1:
            checkpoint = first.state_dict()
    first.finish()
    # TensorBoard reads a folder's files in name order, and names start with the second they were opened in
    # (then a per-process counter that sorts as text): a real resume starts in a later second, as here.
    started = int(time.time())
    while int(time.time()) == started:
        time.sleep(0.05)
    resumed = TensorBoardTracker("proj", tmp_path)
    resumed.load_state_dict(checkpoint)
    resumed.start()
    for step in range(2, 4):
        resumed.log({"glue": {"acc": 10.0 * step}, "loss": 10.0 * step}, step=step)
    resumed.finish()
    folders = {entry["folder"]: entry["scalars"] for entry in layout(str(tmp_path))}
    assert folders["proj"] == {"loss": [(0, 0.0), (1, 1.0), (2, 20.0), (3, 30.0)]}
    assert folders["proj/glue_acc"] == {"glue": [(0, 0.0), (1, 1.0), (2, 20.0), (3, 30.0)]}


def test_strings_in_a_group_go_to_text_and_other_configurations_are_shown_as_text(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("proj", tmp_path)
    tracker.start()
    tracker.store_init_configuration({"model": {"name": "mlp", "layers": [1, 2]}, "seed": None})
    tracker.log({"eval": {"acc": 0.5, "split": "test"}}, step=3)
    tracker.finish()
    entries = layout(str(tmp_path))
    assert entries[0] == {"folder": "proj", "files": ["events"], "scalars": {},
                          "texts": {"eval/split/text_summary": [(3, "test")]}}
    assert entries[1]["hparams"] == {"model/layers": ["string_value", "[1, 2]"],
                                     "model/name": ["string_value", "mlp"]}
    assert entries[2]["hparams.yml"] == {"model": {"name": "mlp", "layers": [1, 2]}, "seed": None}
    assert entries[3]["folder"] == "proj/eval_acc" and entries[3]["scalars"] == {"eval": [(3, 0.5)]}


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match=r"layout='keras'.*'accelerate'.*'lightning'"):
        TensorBoardTracker("proj", "logs", layout="keras")  # type: ignore[arg-type]
