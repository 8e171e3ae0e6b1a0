"""The second half of ``save_state``: write a captured state, agree across ranks, commit, prune.

``save_state`` decides the folder names and captures the state (``engine.checkpoint.state.capture_state``) in the
caller; ``SaveJob.run`` does the rest, either right away (a synchronous save) or on the background writer thread
(``engine.checkpoint.async_save``). Both follow one protocol: every rank writes its files into the temporary folder;
every rank learns whether any rank failed (so none hangs and none commits a partial checkpoint); the checkpoint
writer writes the manifest and commits with one atomic rename; the rank's agree again on the commit; only then
are old checkpoints pruned. A failure anywhere removes the temporary folder and raises on every rank.

The cross-rank exchange is a ``gather`` callable: the default process group for a synchronous save, a separate
gloo group for a background one (collectives of two threads must never share a group: their order would differ
between ranks).
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from engine.checkpoint import folders
from engine.checkpoint.checksum import FileRecord, default_algorithm, hash_file
from engine.checkpoint.io import CheckpointError, CorruptCheckpointError, UnsafeCheckpointError
from engine.checkpoint.state import CapturedState, write_state

_PARALLEL_FILES = 3  # model, optimizer and the small files: more streams gain nothing on one disk
Gather = Callable[[Any], list[Any]]
Failure = tuple[str, str, int]  # (exception class name, message, rank)

# Exceptions that keep their class when one rank reports them to the others.
SHARED_ERRORS: dict[str, type[Exception]] = {cls.__name__: cls for cls in (
    CorruptCheckpointError, UnsafeCheckpointError, CheckpointError, RuntimeError, ValueError, TypeError, OSError)}


def describe(error: BaseException | None) -> tuple[str, str] | None:
    """What the other ranks are told about ``error``: its class name and message."""
    if error is None:
        return None
    return type(error).__name__, str(error) or traceback.format_exc(limit=3)


def first_failure(reports: Sequence[tuple[int, tuple[str, str] | None]]) -> Failure | None:
    """The lowest rank's failure among ``(rank, describe(...))`` reports, or None."""
    for rank, failure in sorted(reports, key=lambda report: report[0]):
        if failure is not None:
            return (*failure, rank)
    return None


def raise_agreed(failure: Failure, local: BaseException | None, my_rank: int) -> None:
    """Raise the agreed failure: the original exception on the rank it happened on, a copy elsewhere."""
    kind, message, rank = failure
    if local is not None and rank == my_rank:
        raise local
    cls = SHARED_ERRORS.get(kind, CheckpointError)
    raise cls(f"{message} (on rank {rank})" if kind in SHARED_ERRORS else f"{kind} on rank {rank}: {message}")


@dataclass
class PrunePlan:
    """After the commit: keep at most ``total_limit`` committed checkpoints in ``base`` (never ``protect``)."""

    base: str
    total_limit: int
    protect: list[str] = field(default_factory=list)


@dataclass
class SaveJob:
    """One checkpoint to write from a captured state and commit (see the module docstring)."""

    final: str
    temp: str
    number: int | None
    rank: int
    world_size: int
    writer: bool  # writes the manifest, commits, prunes (the main process, or each node's with save_on_each_node)
    state: CapturedState
    records: dict[str, FileRecord] = field(default_factory=dict)  # files already written (synchronous shards)
    shard_files: Callable[[], list[str]] | None = None  # waits for background DCP writes; this rank's files
    prune: PrunePlan | None = None
    before_write: Callable[[], None] | None = None  # e.g. wait for a snapshot's device copies
    # Every rank writes into its own folder on its own disk (``save_state(local_parts=True)``): each commits its
    # part by a rename, and the writer's manifest lists every rank's files, so only the parts put together in one
    # folder verify (what Ray Train makes of the folders its workers report).
    local_parts: bool = False

    def run(self, gather: Gather, error: BaseException | None = None) -> str:
        """Write, agree, commit and prune; returns the committed folder or raises the agreed failure.

        ``error``: a failure of this rank before the write (the write is skipped, the others are told).
        """
        records = dict(self.records)
        if error is None:
            try:
                records.update(self._write())
            except Exception as err:  # noqa: BLE001 - shared with every rank below
                error = err
        reports = gather((self.rank, records, describe(error)))
        failure = first_failure([(rank, report) for rank, _, report in reports])
        if failure is None:
            try:
                if self.writer:
                    self._commit([rank_records for _, rank_records, _ in reports])
                elif self.local_parts:
                    folders.commit(self.temp, self.final)  # no manifest: a part alone is never loaded
            except Exception as err:  # noqa: BLE001 - shared with every rank below
                error = err
            failure = first_failure(gather((self.rank, describe(error))))
        if failure is not None:
            if (self.writer or self.local_parts) and os.path.isdir(self.temp):
                folders.remove_folder(self.temp)
            raise_agreed(failure, error, self.rank)
        if self.prune is not None and self.writer:
            folders.prune(self.prune.base, self.prune.total_limit, self.prune.protect)
        return self.final

    def _write(self) -> dict[str, FileRecord]:
        if self.before_write is not None:
            self.before_write()
        records: dict[str, FileRecord] = {}
        if self.shard_files is not None:
            for name in self.shard_files():
                records[name] = hash_file(os.path.join(self.temp, name), default_algorithm())
        # Files written side by side; each one's checksum and write-back on the second pool (see DurableWriter).
        # Named after the calling thread, so the background writer's helpers are recognisable as such.
        name = f"{threading.current_thread().name}-files"
        with ThreadPoolExecutor(max_workers=_PARALLEL_FILES, thread_name_prefix=name) as files, \
                ThreadPoolExecutor(max_workers=2 * _PARALLEL_FILES) as pool:
            records.update(write_state(self.temp, pool, self.state, self.rank, files))
        return records

    def _commit(self, all_records: list[dict[str, FileRecord]]) -> None:
        records: dict[str, FileRecord] = {}
        for rank_records in all_records:
            records.update(rank_records)
        present = set(folders.list_files(self.temp))
        # Files a pre-hook wrote are part of the checkpoint too; with save_on_each_node, files other nodes
        # wrote to their own disks are not on this one (with local parts they are listed all the same: the
        # checkpoint is the union of the parts, and it verifies only once every part is in it).
        files = {name: record for name, record in records.items() if self.local_parts or name in present}
        files.update({name: hash_file(os.path.join(self.temp, name), default_algorithm())
                      for name in present - set(records)})
        folders.write_manifest(self.temp, files, step=self.state.step, iteration=self.number,
                               world_size=self.world_size)
        folders.commit(self.temp, self.final)
