"""A SIGKILL at any file-system call of a ``.ckpt`` write leaves the previous file intact, verified and loadable
(DESIGN.md promise 2), with the fault injection of tests/engine/test_checkpoint_crash.py: a child process saves a
checkpoint over the previous one and is killed at its N-th file-system call, for every N until a save completes."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import torch

from tests.engine.test_checkpoint_crash import _DIST_VARS, _context, _die_at
from tests.trainer.helpers import QUIET, Regressor, data
from trainer import Trainer
from trainer.checkpoint import ckpt_file


class Wide(Regressor):
    """About 1 MB of weights and Adam state: a write of many calls."""

    def __init__(self) -> None:
        super().__init__(features=3)
        self.wide = torch.nn.Linear(256, 256)


def _stamp(module: torch.nn.Module, value: float) -> None:
    with torch.no_grad():
        for param in module.parameters():
            param.fill_(value)


def _saver(path: str, kill_at: int, seen: Any) -> None:
    """Child: write the checkpoint of stamp 1, then (dying at file-system call ``kill_at``) the one of stamp 2."""
    for name in _DIST_VARS:
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    trainer = Trainer(**QUIET, max_epochs=1, seed=0)
    module = Wide()
    trainer.fit(module, data())
    _stamp(module, 1.0)
    trainer.save_checkpoint(path)
    _stamp(module, 2.0)
    _die_at(kill_at, seen)
    trainer.save_checkpoint(path)


def _run(ctx: Any, path: str, kill_at: int) -> tuple[bool, int]:
    seen = ctx.Value("i", 0)
    proc = ctx.Process(target=_saver, args=(path, kill_at, seen), daemon=True)
    proc.start()
    proc.join(120)
    assert proc.exitcode in (-signal.SIGKILL, 0), f"saver failed with exit code {proc.exitcode}"
    return proc.exitcode == -signal.SIGKILL, int(seen.value)


def _stamp_of(path: str) -> float:
    checkpoint = ckpt_file.read(path)  # every digest verified
    values = {float(v.flatten()[0]) for v in checkpoint["state_dict"].values()}
    assert len(values) == 1, values  # one checkpoint's weights, never a mix of two
    return values.pop()


def test_sigkill_at_any_call_of_a_ckpt_write_leaves_the_previous_file(tmp_path: Path) -> None:
    ctx = _context()
    killed, calls = _run(ctx, str(tmp_path / "probe.ckpt"), kill_at=10**9)
    assert not killed and _stamp_of(str(tmp_path / "probe.ckpt")) == 2.0
    # ``calls``: the file-system calls of the whole second save (the first one ran before counting started).
    points = sorted(set(range(1, min(calls, 24) + 1)) | set(range(max(1, calls - 8), calls + 1)))
    outcomes = []
    for kill_at in points:
        path = str(tmp_path / f"kill{kill_at}" / "last.ckpt")
        os.makedirs(os.path.dirname(path))
        killed, _ = _run(ctx, path, kill_at)
        stamp = _stamp_of(path)  # the file there verifies: the previous one, or the new one complete
        visible = [n for n in os.listdir(os.path.dirname(path)) if not n.startswith(".")]
        assert visible == ["last.ckpt"], visible
        outcomes.append((killed, stamp))
    assert (True, 1.0) in outcomes and (True, 2.0) in outcomes  # killed before the rename, and after it
    assert all(stamp == 1.0 for killed, stamp in outcomes[:5])  # killed before the rename: the previous file
    assert sum(killed for killed, _ in outcomes) >= len(points) - 1
