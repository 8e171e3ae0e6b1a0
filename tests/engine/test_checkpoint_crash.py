"""A SIGKILL at any instant of ``save_state`` leaves the previous checkpoint intact and loadable, and no half
checkpoint is ever discovered (DESIGN.md promise 2).

A child process saves checkpoints of a ~12 MB state (model + AdamW) into one project directory. It is killed
either between two file-system calls of a save (every call, counted deterministically) or after a random delay
while saving in a loop. After each kill, the parent checks the directory and loads the newest checkpoint.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import re
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from engine import Accelerator, AcceleratorState, GradientState, ProjectConfiguration
from engine.checkpoint.folders import (
    check_sizes,
    committed_checkpoints,
    next_checkpoint_number,
    read_manifest,
    verify_checksums,
)

_FS_CALLS = ("write", "fsync", "rename", "replace", "mkdir", "unlink", "rmdir")
_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Stamp:
    """A registered object holding the number of the checkpoint it was saved in."""

    def __init__(self) -> None:
        self.number = -1

    def state_dict(self) -> dict[str, int]:
        return {"number": self.number}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.number = state["number"]


def _build(project_dir: str) -> tuple[Accelerator, torch.nn.Module, Stamp]:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=2)
    acc = Accelerator(cpu=True, project_config=config)
    model = torch.nn.Linear(1024, 1024)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = acc.prepare(model, optimizer)
    model(torch.ones(1, 1024)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    stamp = Stamp()
    acc.register_for_checkpointing(stamp)
    return acc, model, stamp


def _stamp_next(acc: Accelerator, model: torch.nn.Module, stamp: Stamp) -> None:
    """Fill the weights with the number the next checkpoint will get, so its content says which one it is."""
    base = os.path.join(acc.project_configuration.project_dir or "", "checkpoints")
    stamp.number = next_checkpoint_number(base, acc.project_configuration.iteration)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float(stamp.number))


def _die_at(kill_at: int, seen: Any) -> None:
    """Make the ``kill_at``-th file-system call of this process SIGKILL it instead of running."""
    calls = [0]
    for name in _FS_CALLS:
        real = getattr(os, name)

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls[0] += 1
            seen.value = calls[0]
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return _real(*args, **kwargs)

        setattr(os, name, counted)


def _saver(project_dir: str, kill_at: int, ready: Any, seen: Any) -> None:
    """Child: one save that dies at file-system call ``kill_at`` (> 0), or saves until killed (0)."""
    for name in _DIST_VARS:
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    acc, model, stamp = _build(project_dir)
    _stamp_next(acc, model, stamp)
    if kill_at == 0:
        ready.set()
        while True:
            acc.save_state()
            _stamp_next(acc, model, stamp)
    _die_at(kill_at, seen)
    acc.save_state()


def _run_child(ctx: Any, project_dir: str, kill_at: int, delay: float | None = None) -> tuple[bool, int]:
    """Start a saver, let it die (or kill it after ``delay`` s); returns (killed, file-system calls it made)."""
    ready, seen = ctx.Event(), ctx.Value("i", 0)
    proc = ctx.Process(target=_saver, args=(project_dir, kill_at, ready, seen), daemon=True)
    proc.start()
    if delay is not None:
        assert ready.wait(60), "the saver did not start"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode in (-signal.SIGKILL, 0), f"saver failed with exit code {proc.exitcode}"
    return proc.exitcode == -signal.SIGKILL, int(seen.value)


def _check(project_dir: str, parent: tuple[Accelerator, torch.nn.Module, Stamp], previous_newest: int | None) -> int:
    """No half checkpoint is visible; every committed one is intact; the newest loads, with its own content."""
    base = os.path.join(project_dir, "checkpoints")
    committed = committed_checkpoints(base)
    final_names = sorted(n for n in os.listdir(base) if re.fullmatch(r"checkpoint_\d+", n))
    assert final_names == sorted(os.path.basename(path) for _, path in committed), os.listdir(base)
    for _, path in committed:
        manifest = read_manifest(path)
        assert manifest is not None
        check_sizes(path, manifest)
        verify_checksums(path, manifest)
    numbers = [n for n, _ in committed]
    if previous_newest is not None:
        assert previous_newest in numbers  # the last good checkpoint survives whatever the instant of the kill
    acc, model, stamp = parent
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the newest committed checkpoint is never damaged
        loaded = acc.load_state()
    assert loaded == committed[-1][1]
    assert stamp.number == numbers[-1]
    assert all(bool((p == float(numbers[-1])).all()) for p in model.parameters())
    return numbers[-1]


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    # Children are cheap forks of a server that imported these (conftest asks for the same list).
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "engine"])
    return ctx


def test_sigkill_between_any_two_file_system_calls_of_a_save(tmp_path: Path) -> None:
    ctx = _context()
    project = str(tmp_path)
    parent = _build(project)
    for _ in range(2):  # two complete saves first, so that the killed ones also prune
        assert _run_child(ctx, project, kill_at=10**9)[0] is False
    newest = _check(project, parent, None)
    kills = after_commit = 0
    for kill_at in range(1, 200):  # every call of the save, in turn, until one save runs to completion
        killed, _ = _run_child(ctx, project, kill_at=kill_at)
        previous, newest = newest, _check(project, parent, newest)
        if not killed:
            break
        kills += 1
        after_commit += newest > previous
    assert kills > 20, kills
    assert 0 < after_commit < kills  # kills landed before the commit (nothing changed) and after it (pruning)


def test_sigkill_at_random_instants_of_repeated_saves(tmp_path: Path) -> None:
    ctx = _context()
    project = str(tmp_path)
    parent = _build(project)
    _run_child(ctx, project, kill_at=10**9)
    newest = _check(project, parent, None)
    base = tmp_path / "checkpoints"
    rng = random.Random(0)
    mid_save = 0
    for _ in range(15):
        _run_child(ctx, project, kill_at=0, delay=rng.uniform(0.0, 0.3))
        leftovers = [n for n in os.listdir(base) if n.startswith(".tmp-")]
        assert len(leftovers) <= 1  # each save cleans what the previous crash left
        mid_save += len(leftovers)
        # Saves that completed before the kill may have pruned the previous newest; it is never lost otherwise.
        previous, newest = newest, _check(project, parent, None)
        assert newest >= previous
    assert mid_save >= 5  # the kills did land inside saves (the saver spends most of its time saving)
