"""Ctrl-C and a preemption signal end a training script with one line saying what is saved and how to resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, signal, sys
# As in a terminal: a test runner started in the background (nohup, `cmd &`) hands its children SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {root!r})
from callbacks import Callback, ModelCheckpoint
from tests.trainer.helpers import Regressor, data
from trainer import Trainer

class SignalAt(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == 6:
            os.kill(os.getpid(), signal.{signal})

trainer = Trainer(max_epochs=5, log_with=None, project_dir={project!r}, enable_progress_bar=False,
                  enable_model_summary=False, callbacks=[ModelCheckpoint(filename="{{epoch}}-{{step}}"), SignalAt()])
trainer.fit(Regressor(), data(n=16, batch_size=4), data(n=8, batch_size=4))
"""


def _run(tmp_path: Path, signal_name: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=str(ROOT), signal=signal_name, project=str(tmp_path / "run")))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env,
                          check=False)


@pytest.mark.parametrize("signal_name, code, first", [
    ("SIGINT", 130, "Interrupted (Ctrl-C) at epoch 1, step 6: the newest checkpoint is "),
    ("SIGTERM", 143, "Preempted by SIGTERM at epoch 1, batch 2, step 6: checkpoint saved; the newest checkpoint is "),
])
def test_one_line_on_interrupt_and_on_preemption(tmp_path: Path, signal_name: str, code: int, first: str) -> None:
    done = _run(tmp_path, signal_name)
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    # Ctrl-C saves nothing new; a preemption saves the position as the ModelCheckpoint's last checkpoint.
    folder = "epoch=0-step=4.ckpt" if signal_name == "SIGINT" else "last.ckpt"
    assert lines[0] == (f"{first}{tmp_path / 'run' / 'checkpoints' / folder}; run the same command with "
                        "fit(..., ckpt_path='last') to resume from it.")
