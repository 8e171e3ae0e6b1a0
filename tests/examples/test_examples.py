"""Each example runs for a few steps, as a user would start it, and does its job (files, checkpoints, resume).

The scripts run in fresh interpreters (``python examples/x.py ...``, ``ember launch ...``) with tiny flags, in a
temporary working directory, so nothing is written into the repository.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
VAL_SAMPLES = int(0.15 * 1797)  # examples/data.py's validation split of the 1,797 digits (an odd number)

pytest.importorskip("sklearn", reason="the examples read scikit-learn's bundled digits")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The repository first, so the examples import this checkout's packages; one thread, as on a small CI box.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    for name in [n for n in env if n.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))]:
        del env[name]  # a test runner launched under torchrun must not make the examples think they are rank N
    return env


def run(args: list[str], cwd: Path, timeout: float = 60) -> str:
    """Run a command to completion; its stdout and stderr, or a failure showing both."""
    done = subprocess.run(args, check=False, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} exited with {done.returncode}:\n{output[-4000:]}"
    return output


def example(name: str, *args: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / name), *args]


def committed_checkpoints(folder: Path) -> list[Path]:
    """Checkpoints under ``folder`` whose save completed: ``.ckpt`` files in place and folders with a manifest
    (sharded and asynchronous saves), not hidden temporaries (``.name.tmp-...``).

    Walks by hand, tolerating entries that vanish meanwhile: a running example renames its temporary file or
    folder into place while this polls (``Path.rglob`` would raise on that).
    """
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if "manifest.json" in files:
            found.append(Path(root))
        found += [Path(root) / name for name in files if name.endswith(".ckpt") and not name.startswith(".")]
    return found


def test_digits_trains_tests_plots_and_resumes(tmp_path: Path) -> None:
    project = tmp_path / "runs" / "digits"
    out = run(example("digits.py", "--project-dir", str(project), "--max-epochs", "2"), tmp_path)
    run0 = project / "version_0"
    assert f"Starting a new run in {run0}" in out
    accuracy = float(re.search(r"Test accuracy ([\d.]+)%", out).group(1))  # type: ignore[union-attr]
    assert accuracy > 80, out
    assert (run0 / "COMPLETED").is_file()
    assert committed_checkpoints(run0 / "checkpoints"), f"no checkpoint under {run0}"
    # A flat run folder: metrics.csv, tensorboard/ and checkpoints/ side by side in version_0.
    assert list(run0.rglob("metrics.csv")) == [run0 / "metrics.csv"]
    rows = (run0 / "metrics.csv").read_text().splitlines()
    assert "val/acc" in rows[0]
    header = rows[0].split(",")
    labels = [(cells[0], cells[header.index("epoch")]) for cells in (row.split(",") for row in rows[1:])]
    # One row per step and epoch: a new epoch's learning rate at the last step of the one before, and the test's
    # results after fit, get rows of their own (the test's is the last), never a training row's epoch.
    assert len(labels) == len(set(labels)), "one csv row per step and epoch"
    assert labels[-1] == (labels[-2][0], "2") and "test/acc" in header and rows[-1].split(",")[header.index(
        "test/acc")] and not rows[-2].split(",")[header.index("test/acc")]
    assert (run0 / "curves.png").stat().st_size > 10_000
    assert list((run0 / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert f"tensorboard --logdir {project}" in out

    # The same command again: the completed run is left alone and a new version starts; kill it once it has
    # committed a checkpoint, as a crash or a pre-emption would.
    run1 = project / "version_1"
    command = example("digits.py", "--project-dir", str(project), "--max-epochs", "50", "--patience", "50")
    process = subprocess.Popen(command, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 45
        while not committed_checkpoints(run1 / "checkpoints"):
            assert process.poll() is None, f"the run ended before its first checkpoint:\n{process.stderr.read()}"
            assert time.monotonic() < deadline, "no checkpoint after 45 s"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.communicate()
    assert not (run1 / "COMPLETED").exists()

    out = run(example("digits.py", "--project-dir", str(project), "--max-epochs", "2"), tmp_path)
    assert f"Resuming the interrupted run in {run1}" in out
    assert f"Resumed from {run1 / 'checkpoints'}" in out  # the trainer found the killed run's checkpoint
    assert (run1 / "COMPLETED").is_file()
    assert not (project / "version_2").exists()
    assert list(run1.rglob("metrics.csv")) == [run1 / "metrics.csv"]  # the csv tracker continued the killed run's file


def test_digits_fast_dev_run_writes_nothing(tmp_path: Path) -> None:
    out = run(example("digits.py", "--project-dir", str(tmp_path / "d"), "--fast-dev-run"), tmp_path)
    assert "Test accuracy" in out
    assert not any(tmp_path.rglob("metrics.csv")) and not committed_checkpoints(tmp_path)


def test_char_lm_trains_samples_and_resumes(tmp_path: Path) -> None:
    tiny = ["--project-dir", str(tmp_path / "lm"), "--dim", "32", "--layers", "1", "--block", "32",
            "--batch-size", "8", "--val-every", "2", "--val-batches", "2", "--sample-bytes", "40"]
    out = run(example("char_lm.py", *tiny, "--max-steps", "4"), tmp_path)
    assert "Trained to step 4" in out and "Sample:\ndef " in out
    assert len(committed_checkpoints(tmp_path / "lm")) >= 2  # steps 2 and 4 (and the last pointer)

    out = run(example("char_lm.py", *tiny, "--max-steps", "6"), tmp_path)
    assert f"Resumed from {tmp_path / 'lm' / 'checkpoints' / 'step=4.ckpt'}" in out, out
    assert "Trained to step 6" in out


@pytest.mark.parametrize("data", ["module", "datamodule"])
def test_port_from_lightning(tmp_path: Path, data: str) -> None:
    flags = ["--datamodule"] if data == "datamodule" else []
    out = run(example("port_from_lightning.py", "--max-epochs", "3", "--project-dir", str(tmp_path / "p"), *flags),
              tmp_path)
    assert float(re.search(r"test accuracy ([\d.]+)%", out).group(1)) > 50, out  # type: ignore[union-attr]
    assert "epoch 2: train_loss" in out  # the module's on_train_epoch_end hook ran
    assert list((tmp_path / "p").rglob("metrics.csv")) and committed_checkpoints(tmp_path / "p")


def test_engine_loop_one_process(tmp_path: Path) -> None:
    out = run(example("engine_loop.py", "--project-dir", str(tmp_path / "e"), "--epochs", "1", "--max-steps", "6"),
              tmp_path)
    assert "epoch 0: val accuracy" in out and f"on {VAL_SAMPLES} samples" in out
    assert committed_checkpoints(tmp_path / "e")


def test_engine_loop_two_processes(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "engine.launch.cli", "launch", "--nproc-per-node", "2", "--cpu",
               str(EXAMPLES / "engine_loop.py"), "--project-dir", str(tmp_path / "e"), "--epochs", "1",
               "--max-steps", "4"]
    out = run(command, tmp_path, timeout=90)
    # gather_for_metrics drops the sample repeated to even out the two shards: each one is counted once.
    assert "epoch 0: val accuracy" in out and f"on {VAL_SAMPLES} samples" in out
    assert out.count("epoch 0: val accuracy") == 1  # accelerator.print: the main process only
    assert committed_checkpoints(tmp_path / "e")


def test_digits_on_two_processes_prints_one_test_accuracy(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "engine.launch.cli", "launch", "--nproc-per-node", "2", "--cpu",
               str(EXAMPLES / "digits.py"), "--project-dir", str(tmp_path / "d"), "--max-epochs", "1"]
    out = run(command, tmp_path, timeout=120)  # exits 0: rank 1 writes none of the main process's files
    accuracies = re.findall(r"\[rank (\d)\] Test accuracy (\S+)%", out)
    assert sorted(rank for rank, _ in accuracies) == ["0", "1"], out[-3000:]
    assert accuracies[0][1] == accuracies[1][1]  # exact evaluation: every test sample once, the same on both
    assert out.count("Metrics csv:") == 1 and (tmp_path / "d" / "version_0" / "COMPLETED").exists()
