"""Shared test fixtures: a real multi-process runner (gloo on 127.0.0.1) and state hygiene.

``run_distributed(fn, world_size=2)`` runs a module-level function ``fn`` in ``world_size`` fresh processes with
the standard torchrun variables set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``) and returns the list of per-rank return values, or raises
with the failing rank's traceback. Processes come from a forkserver that has already imported torch, so a
2-rank check costs well under a second of start-up instead of ~2 s of ``import torch`` per rank.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import queue as queue_module
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from tests.kernel_path import cpu_description, moved_kernels, native_requested, pin, pins_cover_this_cpu

# One kernel path for every test and every process it starts (tests/kernel_path.py says why), set before torch
# starts: the values recorded from Lightning / Accelerate / DeepSpeed / torchao hold on any CPU only under it.
# EMBER_TEST_KERNELS=native keeps this CPU's own kernels instead (the recorded-anchor comparisons then skip).
if not native_requested():
    pin()

import torch.distributed as dist

# Scripts that record values from the real Lightning / Accelerate (run by hand in a throwaway environment with
# those packages); not tests, and `--doctest-modules` must not import them.
collect_ignore_glob = ["parity_scripts/*",
                       # 2-process DeepSpeed scripts (run by their tests and by the recorders); they import
                       # deepspeed and the API package named by DS_SCRIPT_API, optional here.
                       "distributed/deepspeed_script.py", "distributed/deepspeed_probe_script.py",
                       "lightning_corpus/deepspeed_script.py"]

DEFAULT_TIMEOUT_S = 120.0
_context: Any = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "recorded_bits: compares Ember's results bit for bit with values recorded "
                                       "from a real anchor package (tests/kernel_path.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a CPU the pins do not cover whose kernels give other bits, skip the recorded-anchor comparisons, saying
    which kernels moved; on a covered CPU (Intel with AVX2) they run whatever the kernels do, and fail if moved."""
    marked = [item for item in items if item.get_closest_marker("recorded_bits")]
    if marked and native_requested():
        for item in marked:
            item.add_marker(pytest.mark.skip(reason="EMBER_TEST_KERNELS=native: this CPU's own kernels, not the "
                                                    "pinned path the anchors were recorded under"))
        return
    if not marked or pins_cover_this_cpu():
        return
    moved = moved_kernels()
    if moved:
        reason = (f"this CPU ({cpu_description()}) is outside the pinned kernel path's reach (tests/kernel_path.py) "
                  f"and computes {sorted(moved)} with other bits than the machine the anchors were recorded on: the "
                  "bitwise comparison with recorded values cannot hold here")
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (never a fixed port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _mp_context() -> Any:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        # The server imports torch once; every rank is then a cheap fork of a single-threaded process.
        # torch._dynamo too: every optimizer constructor imports it (~1 s) when a process builds its first one.
        _context.set_forkserver_preload(["torch", "torch._dynamo", "engine"])
    return _context


def _child(module: str, qualname: str, rank: int, env: dict[str, str], sys_path: list[str],
           args: tuple, kwargs: dict, results: Any) -> None:
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = sys_path
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        value = target(*args, **kwargs)
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent with its traceback
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        # DDP wrappers that outlive the group would free it during interpreter shutdown, which can abort.
        parallel = sys.modules.get("engine.prepare.parallel")
        if parallel is not None:
            parallel.release_ddp_wrappers()


def run_distributed(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout: float = DEFAULT_TIMEOUT_S,
                    env: dict[str, str] | None = None, daemon: bool = True, launch_env: bool = True,
                    **kwargs: Any) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` real processes and return each rank's result, in rank order.

    ``daemon=False`` lets the ranks start processes of their own (DataLoader workers); they are killed below
    either way. ``launch_env=False`` (one process) leaves out torchrun's variables: a plain process of its own,
    for a test that needs other kernel settings than this session's (``env``, read when the child starts torch's
    kernels).
    """
    if "<locals>" in fn.__qualname__ or fn.__module__ == "__main__":
        raise ValueError(f"run_distributed needs a module-level function, got {fn.__module__}.{fn.__qualname__}")
    ctx = _mp_context()
    port = str(free_port())
    results = ctx.Queue()
    procs = []
    for rank in range(world_size):
        child_env = dict(os.environ)
        if launch_env:
            child_env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
                              "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                              "LOCAL_WORLD_SIZE": str(world_size)})
        child_env["OMP_NUM_THREADS"] = "1"
        child_env.update(env or {})
        proc = ctx.Process(target=_child, args=(fn.__module__, fn.__qualname__, rank, child_env, list(sys.path),
                                                args, kwargs, results), daemon=daemon)
        proc.start()
        procs.append(proc)

    outcome: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcome) < world_size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(world_size)) - set(outcome))
                raise TimeoutError(f"{fn.__qualname__}: ranks {missing} did not finish within {timeout:.0f} s")
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in outcome]
                if dead:
                    time.sleep(0.5)  # let a traceback already in flight arrive first
                    if results.empty():
                        raise RuntimeError(f"{fn.__qualname__}: rank {dead[0]} died with exit code "
                                           f"{procs[dead[0]].exitcode} and no traceback") from None
                continue
            if not ok:
                raise RuntimeError(f"{fn.__qualname__} failed on rank {rank}:\n{value}")
            outcome[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=5 if len(outcome) == world_size else 0.1)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        results.close()
    return [outcome[r] for r in range(world_size)]


@pytest.fixture(name="run_distributed")
def run_distributed_fixture() -> Callable[..., list[Any]]:
    return run_distributed
