"""The background writer of ``save_state(async_save=True)``: at most one checkpoint in flight per process.

``save_state`` snapshots the state into ``AsyncCheckpointer.buffers`` (reused from save to save) and hands a
``SaveJob`` to ``start``; a writer thread then writes, fsyncs, checksums and commits it with the same protocol as a
synchronous save (``engine.checkpoint.save``), so nothing is visible to resume before the commit. ``wait`` blocks
until the job is done and raises its failure, naming the checkpoint; ``save_state``, ``load_state``,
``wait_for_checkpoint`` and ``end_training`` call it, so a failed background write is never lost and two saves
never overlap.

Ranks exchange results over a gloo process group of their own, created once (collectively, by the first
asynchronous save): the training thread keeps using the default group meanwhile, and two threads sharing one
group could issue their collectives in a different order on different ranks.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

import torch.distributed as dist

from engine.checkpoint.io import CheckpointError
from engine.checkpoint.save import SaveJob
from engine.checkpoint.snapshot import SnapshotBuffers
from engine.state import PartialState

logger = logging.getLogger(__name__)


def yield_to_training() -> None:
    """Run the calling thread, and the threads it starts, only on CPU time that training leaves idle.

    A background write costs CPU (copying into the page cache, checksums, the filesystem's work: 0.3-0.6 s for a
    200 MB state on the 2-core benchmark machine). At normal priority it preempts training threads, and an
    OpenMP team with one member preempted waits at every barrier for a whole time slice; at ``SCHED_IDLE`` it runs
    only when a core is free, which a training thread that waits for the write (the next save, the end of
    training) also frees. Linux only (elsewhere priorities are per process: nothing changes); threads started by
    the calling thread inherit it.
    """
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None or not sys.platform.startswith("linux"):
        return
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))  # 0: the calling thread (a task of its own on Linux)
    except OSError:  # a sandbox that forbids it: the write competes with training as before
        pass


class AsyncCheckpointer:
    """One process's background checkpoint writer: snapshot buffers, the writer thread, its process group.

    >>> checkpointer = AsyncCheckpointer()
    >>> checkpointer.in_flight, checkpointer.wait()
    (False, None)
    """

    def __init__(self) -> None:
        self.buffers = SnapshotBuffers()
        self._group: Any = None
        self._thread: threading.Thread | None = None
        self._job: SaveJob | None = None
        self._error: BaseException | None = None
        self._committed: str | None = None
        self._reported_bytes = 0
        self._shard_channels: dict[str, tuple[Any, Any]] = {}
        self._finishes_at_exit = False

    @property
    def in_flight(self) -> bool:
        """Whether a background save has been started and not yet waited for."""
        return self._job is not None

    def group(self, distributed: bool) -> Any:
        """The process group the writer thread exchanges results over (created on first use: a collective)."""
        if distributed and self._group is None:
            self._group = dist.new_group(backend="gloo")
            PartialState.register_teardown(self._release_groups)
        return self._group if distributed else None

    def shard_channel(self, name: str, distributed: bool) -> tuple[Any, Any]:
        """(process group, DCP stager) for the sharded object ``name`` (created on first use: a collective).

        DCP runs each ``async_save`` upload on a thread of its own, so each sharded object gets its own group; its
        stager keeps the host copies of its shards from one save to the next.
        """
        if name not in self._shard_channels:
            import torch
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                  use_async_staging=False, use_non_blocking_copy=False))
            self._shard_channels[name] = (dist.new_group(backend="gloo") if distributed else None, stager)
            if distributed:
                PartialState.register_teardown(self._release_groups)
        return self._shard_channels[name]

    def _release_groups(self) -> None:
        """Let go of this writer's groups once they are destroyed: a destroyed group that is still referenced is
        not freed, and its gloo threads then run on through interpreter shutdown (issue 39)."""
        self._group = None
        self._shard_channels.clear()

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` from every rank, over the writer's own group (the writer thread calls it)."""
        if self._group is None:
            return [obj]
        everyone: list[Any] = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(everyone, obj, group=self._group)
        return everyone

    def start(self, job: SaveJob) -> None:
        """Write and commit ``job`` on a new writer thread (call ``wait`` first: one save at a time)."""
        if self._job is not None:
            raise RuntimeError("A background checkpoint save is already in flight: call wait() first.")
        if self.buffers.nbytes != self._reported_bytes:
            self._reported_bytes = self.buffers.nbytes
            logger.info("Asynchronous checkpoints hold a %.1f MB host snapshot of the state (reused by every save).",
                        self._reported_bytes / 2**20)
        self._job, self._error, self._committed = job, None, None
        # Not a daemon: an interpreter that exits with a save in flight finishes writing it first. And joined before
        # concurrent.futures shuts its pools at exit: a write still running then could not start the thread pools
        # it writes with ("cannot schedule new futures after interpreter shutdown") and the checkpoint was lost.
        # threading's exit hooks run in reverse order of registration, concurrent.futures' was registered first.
        if not self._finishes_at_exit:
            threading._register_atexit(self._finish_at_exit)  # type: ignore[attr-defined]  # private: no stub
            self._finishes_at_exit = True
        self._thread = threading.Thread(target=self._run, args=(job,), name="ember-checkpoint-writer")
        self._thread.start()

    def _finish_at_exit(self) -> None:
        """At interpreter exit: let the save in flight finish (its failure, if any, was logged by the writer)."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self, job: SaveJob) -> None:
        yield_to_training()
        try:
            self._committed = job.run(self.gather)
        except BaseException as err:  # noqa: BLE001 - kept for wait(), which raises it in the training thread
            self._error = err
            logger.error("The asynchronous save of checkpoint %s failed: %s: %s", job.final, type(err).__name__,
                         err)

    def wait(self) -> str | None:
        """Block until the save in flight is done; returns its committed folder (None if there was none).

        Raises ``CheckpointError`` naming the checkpoint if the background write failed (nothing of it is
        visible: its temporary folder was removed).
        """
        job, thread = self._job, self._thread
        if job is None or thread is None:
            return None
        thread.join()
        self._job, self._thread = None, None
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointError(f"The asynchronous save of checkpoint {job.final} failed, so that checkpoint "
                                  f"does not exist (the previous ones are intact): {type(error).__name__}: "
                                  f"{error}") from error
        return self._committed
