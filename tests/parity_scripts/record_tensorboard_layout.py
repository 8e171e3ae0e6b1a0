"""Record what Accelerate 1.15's tracker and Lightning 2.6's TensorBoardLogger write (run once, by hand).

    /work/venvs/acc/bin/python tests/parity_scripts/record_tensorboard_layout.py

The venv holds torch==2.13.0 (installed first), then accelerate 1.15.x, lightning 2.6.x and tensorboard. Each
library logs the same things: a configuration, numbers, a string, and a dict of numbers (a group). What each
wrote (folders, files, tags, values, hyper-parameters; tests/trackers/tensorboard_layout.py reads it) goes to
tests/trackers/tensorboard_recorded.py, which tests/trackers/test_tensorboard_layout.py asserts for Ember.
"""

from __future__ import annotations

import pinned  # noqa: F401 - first: the suite's CPU kernel path before torch loads (tests/kernel_path.py)

# isort: split

import pprint
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "trackers" / "tensorboard_recorded.py"



def accelerate_run(folder: str) -> None:
    from accelerate import Accelerator

    from tests.trackers.tensorboard_layout import CONFIG, STEPS

    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=folder)
    accelerator.init_trackers("proj", config=CONFIG)
    for values, step in STEPS:
        accelerator.log(values, step=step)
    accelerator.end_training()


def lightning_run(folder: str) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger

    from tests.trackers.tensorboard_layout import CONFIG, STEPS

    logger = TensorBoardLogger(folder, name="tb")
    logger.log_hyperparams(CONFIG)
    for values, step in STEPS:
        logger.log_metrics({k: v for k, v in values.items() if not isinstance(v, str)}, step=step)
    logger.save()
    logger.finalize("success")


def main() -> None:
    import accelerate
    import lightning

    from tests.trackers.tensorboard_layout import layout

    recorded = {}
    for name, run in (("accelerate", accelerate_run), ("lightning", lightning_run)):
        with tempfile.TemporaryDirectory() as folder:
            run(folder)
            recorded[name] = layout(folder)
    OUT.write_text(f'"""Recorded by tests/parity_scripts/record_tensorboard_layout.py with Accelerate '
                   f'{accelerate.__version__}, Lightning {lightning.__version__}, torch '
                   f'{__import__("torch").__version__}."""\n\nRECORDED = {pprint.pformat(recorded, width=116)}\n')
    print(OUT.read_text())


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
