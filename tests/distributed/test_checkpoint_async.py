"""save_state(async_save=True) on 2 real gloo processes: kill-and-resume is bitwise exact, a write failing on one
rank is raised on every rank at the next save, FSDP2 shards go through torch.distributed.checkpoint's
async_save and hold the state at the call."""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.test_fsdp import TOL, _load_then_continue, _net, _plugin, _run_steps


def _train_and_die(tmp: str, die_at: int) -> None:
    from tests.engine.test_checkpoint import Run

    run = Run(tmp, total_limit=2)

    def save() -> None:
        run.acc.save_state(async_save=True)
        if run.batches.n == die_at:  # every rank dies with its write in flight
            os.kill(os.getpid(), signal.SIGKILL)

    run.train(after_batch=save)


def _resume_after_kill(tmp: str) -> dict[str, Any]:
    from tests.engine.test_checkpoint import Run

    reference = Run()
    reference.train()
    expected = reference.snapshot()
    resumed = Run(tmp)
    folder = resumed.acc.load_state()
    position = resumed.batches.n
    resumed.train()
    got = resumed.snapshot()
    return {"folder": folder, "position": position,
            "params_equal": all(torch.equal(a, b) for a, b in zip(expected["params"], got["params"])),
            "rng_equal": torch.equal(expected["rng"], got["rng"]),
            "other_equal": (expected["scale"], expected["lr"], expected["counters"]) == (got["scale"], got["lr"],
                                                                                         got["counters"])}


def test_kill_and_resume_with_async_saves_on_two_processes_is_bitwise_exact(
        run_distributed: Callable[..., list[Any]], tmp_path: Path) -> None:
    die_at = 7  # 5 batches per rank and epoch: mid-accumulation in epoch 1
    with pytest.raises(RuntimeError, match="died with exit code -9"):
        run_distributed(_train_and_die, 2, str(tmp_path), die_at)
    results = run_distributed(_resume_after_kill, 2, str(tmp_path))
    assert results[0]["folder"] == results[1]["folder"]
    for rank, result in enumerate(results):
        assert 1 <= result["position"] <= die_at
        assert result["params_equal"] and result["rng_equal"] and result["other_equal"], (rank, result)


def _fail_on_rank_1(tmp: str) -> dict[str, Any]:
    from engine.checkpoint import io as checkpoint_io
    from engine.checkpoint.io import CheckpointError
    from tests.engine.test_checkpoint import Run

    run = Run(tmp)
    run.train(stop_at=2)
    real = checkpoint_io._write_all

    def full(fd: int, view: memoryview) -> None:
        if run.acc.process_index == 1 and threading.current_thread().name.startswith("ember-checkpoint-writer"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, view)

    checkpoint_io._write_all = full
    bad = run.acc.save_state(async_save=True)
    run.train(stop_at=4)
    try:
        run.acc.save_state()
    except CheckpointError as err:
        message = str(err)
    else:
        message = ""
    checkpoint_io._write_all = real
    good = run.acc.save_state(async_save=True)
    run.acc.wait_for_checkpoint()
    return {"bad": bad, "message": message, "good": good, "listing": sorted(os.listdir(os.path.dirname(bad)))}


def test_a_background_write_failing_on_one_rank_is_raised_on_every_rank(
        run_distributed: Callable[..., list[Any]], tmp_path: Path) -> None:
    results = run_distributed(_fail_on_rank_1, 2, str(tmp_path))
    for result in results:
        assert f"asynchronous save of checkpoint {result['bad']} failed" in result["message"], result
        assert "No space left on device" in result["message"]
        assert result["listing"] == [os.path.basename(result["good"])]  # nothing of the failed save is left
    assert "(on rank 1)" in results[0]["message"]


def _fsdp_async_save_then_continue(folder: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from engine import Accelerator

    uploads = []
    real = dcp.async_save
    dcp.async_save = lambda *args, **kwargs: uploads.append(real(*args, **kwargs)) or uploads[-1]

    acc = Accelerator(fsdp_plugin=_plugin(state_dict_type="SHARDED_STATE_DICT"))
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    model, opt = acc.prepare(model, opt)
    _run_steps(acc, model, opt, 0, 3)
    acc.save_state(folder, async_save=True)
    after = _run_steps(acc, model, opt, 3, 3)  # trains on while the shards are written
    committed = acc.wait_for_checkpoint()
    dcp.async_save = real
    return {"after": after, "uploads": len(uploads), "committed": committed, "files": sorted(os.listdir(folder))}


def test_fsdp2_sharded_state_is_saved_asynchronously(run_distributed: Callable[..., list[Any]],
                                                     tmp_path: Path) -> None:
    folder = str(tmp_path / "sharded")
    saved = run_distributed(_fsdp_async_save_then_continue, 2, folder)
    assert saved[0]["committed"] == folder
    assert saved[0]["uploads"] == saved[1]["uploads"] == 2  # the model's and the optimizer's shards
    assert {"pytorch_model_fsdp_0", "optimizer_0", "manifest.json"} <= set(saved[0]["files"])
    loaded = run_distributed(_load_then_continue, 2, folder, True)
    torch.testing.assert_close(loaded[0]["after"], saved[0]["after"], **TOL)
