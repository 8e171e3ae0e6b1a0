"""Read a wandb offline run file (``run-<id>.wandb``) back: wandb 0.2x/0.3x ships no Python reader for it.

Format: a 7-byte header (``:W&B``, 2 magic bytes, 1 version byte), then 32 KiB blocks of records framed like
LevelDB's log (4-byte checksum, 2-byte little-endian length, 1-byte type: 1 full, 2 first, 3 middle, 4 last;
a block tail shorter than a 7-byte frame header is padding). Each record is a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

BLOCK = 32 * 1024
FRAME = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: str) -> list[Any]:
    """Every ``Record`` protobuf in the file, in order."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} does not start with the ':W&B' header: {data[:7]!r}")
    payloads: list[bytes] = []
    pending = b""
    pos = FRAME
    while pos + FRAME <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < FRAME:
            pos += left_in_block  # padding at the end of a block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + FRAME])
        chunk = data[pos + FRAME:pos + FRAME + length]
        pos += FRAME + length
        if kind == FULL:
            payloads.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            payloads.append(pending + chunk)
            pending = b""
        elif kind == 0 and length == 0:
            pos += left_in_block - FRAME  # zero-filled rest of a block
        else:
            raise ValueError(f"{path}: unknown record type {kind} at byte {pos - FRAME - length}")
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


@dataclass
class OfflineRun:
    """What one offline run file holds: its id, project, config and history rows (user keys only)."""

    run_id: str = ""
    project: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return [row["_step"] for row in self.history]


def read_finished_records(path: str, timeout_s: float = 20.0) -> list[Any]:
    """The records of a finished run, waiting until its ``exit`` record is on disk.

    wandb's core process writes the file asynchronously: ``run.finish()`` can return while the file still
    holds only its header, so reading right after it races with the writer.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_records(path)
        if any(record.WhichOneof("record_type") == "exit" for record in records):
            return records
        if time.monotonic() > deadline:
            kinds = [record.WhichOneof("record_type") for record in records]
            raise TimeoutError(f"{path} has no exit record after {timeout_s} s (records: {kinds})")
        time.sleep(0.05)


def read_run(path: str) -> OfflineRun:
    """Parse a finished ``run-<id>.wandb`` into an ``OfflineRun`` (history values decoded from JSON)."""
    run = OfflineRun()
    for record in read_finished_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.project = record.run.run_id, record.run.project
        elif kind == "config":
            for item in record.config.update:
                if item.key != "_wandb":
                    run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            row = {_key(item): json.loads(item.value_json) for item in record.history.item}
            row = {k: v for k, v in row.items() if k not in ("_timestamp", "_runtime")}
            run.history.append(row)
    return run


def find_run_files(root: str, run_id: str) -> list[str]:
    """Every ``run-<id>.wandb`` under ``root/wandb`` (a resumed offline run adds one), oldest first."""
    paths = glob.glob(os.path.join(root, "wandb", "offline-run-*", f"run-{run_id}.wandb"))
    # Folders are offline-run-<start second>-<id>, and a resume within the same second adds "-1": sorting the
    # folder names (not the full paths, where "/" sorts after "-") gives start order.
    return sorted(paths, key=os.path.dirname)


def _key(item: Any) -> str:
    # wandb 0.31 fills `nested_key` (a path); older versions fill `key`.
    return item.key or "/".join(item.nested_key)
