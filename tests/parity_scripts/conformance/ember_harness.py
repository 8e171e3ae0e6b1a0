"""Pytest plugin for the conformance run's Ember side (``-p ember_harness``, with ``--noconftest``).

Lightning's ``tests_pytorch/conftest.py`` imports Lightning's machinery, so the Ember side runs without it and
this plugin gives the fixtures Lightning's tests ask for by name, written here for Ember: the same hygiene
(environment variables, signal handlers, process group, deterministic algorithms and rank restored after each
test), ``caplog`` seeing every logger, a local HTTP server, a one-process gloo group. Fixtures that mock
Lightning's accelerator registry (``cuda_count_2``, ``tpu_available``...) are not given: a test that needs one
fails with "fixture ... not found", which the runner counts as reading Lightning internals.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import ember_lightning_shim
import pytest
import torch
import torch.distributed

ember_lightning_shim.install()


@pytest.fixture(scope="session")
def datadir() -> Path:
    return Path(os.environ["LIGHTNING_CHECKOUT"]) / "Datasets"


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    saved = os.environ.copy()
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    signals = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
    handlers = {}
    for signum in signals:
        try:
            handlers[signum] = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
    yield
    for signum, handler in handlers.items():
        if handler is not None:
            try:
                signal.signal(signum, handler)
            except (ValueError, OSError):
                continue


@pytest.fixture(autouse=True)
def _teardown_process_group() -> Iterator[None]:
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def _reset_engine_state() -> Iterator[None]:
    """A test starts with no engine state (the process-wide AcceleratorState of an earlier test's Trainer)."""
    from engine.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield


@pytest.fixture(autouse=True)
def _reset_deterministic_algorithms() -> Iterator[None]:
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture(autouse=True)
def _restore_rank_zero() -> Iterator[None]:
    from trainer.utilities.rank_zero import rank_zero_only

    rank = getattr(rank_zero_only, "rank", None)
    yield
    if rank is not None:
        rank_zero_only.rank = rank


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger propagates to the root while the test runs (a logger that does not would hide its lines)."""
    names = [name for name in logging.root.manager.loggerDict if not logging.getLogger(name).propagate]
    for name in names:
        logging.getLogger(name).propagate = True
    yield caplog
    for name in names:
        logging.getLogger(name).propagate = False


@pytest.fixture
def tmpdir_server(tmp_path: Path) -> Iterator[Any]:
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    with ThreadingHTTPServer(("localhost", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server.server_address
        server.shutdown()


@pytest.fixture
def single_process_pg() -> Iterator[None]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    saved = os.environ.copy()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo")
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)
