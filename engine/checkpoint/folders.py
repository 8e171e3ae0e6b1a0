"""Checkpoint folders: temporary folder, manifest, atomic commit, discovery, pruning and verification.

A checkpoint is committed in one step. Its files are written (and fsynced) into a hidden temporary sibling,
``.tmp-{name}-{nonce}``; then ``manifest.json`` (every file's size and checksum, the step, the iteration, the
world size) is written and fsynced, and the folder is renamed to its final name with one ``os.rename``. A crash
at any instant therefore leaves either the old set of checkpoints or the old set plus the complete new one.
Only folders holding a valid manifest are ever loaded, counted or pruned; temporary folders are ignored and
removed by the next save.

Layout of ``{project_dir}/checkpoints`` with automatic naming::

    checkpoint_3/  manifest.json  model.safetensors  optimizer.bin  scheduler.bin  scaler.pt
                   random_states_0.pkl  random_states_1.pkl  dataloader_0_0.bin  custom_checkpoint_0.pkl ...
    checkpoint_4/  ...
    .tmp-checkpoint_5-3f9a0c1b2d4e/   (a save in progress, or left by a crash: never loaded)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

from engine.checkpoint.checksum import FileRecord, start_hashing
from engine.checkpoint.io import CorruptCheckpointError, fsync_dir, mismatch, save_bytes
from engine.version import __version__

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "ember-checkpoint"
FORMAT_VERSION = 1
TEMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"  # an explicit output_dir being replaced: moved aside, removed after the commit
AUTO_PREFIX = "checkpoint_"
_AUTO_NAME = re.compile(r"^checkpoint_(\d+)$")


# -- the manifest -------------------------------------------------------------------------------------------
def write_manifest(folder: str, files: Mapping[str, FileRecord], **info: Any) -> None:
    """Write and fsync ``manifest.json`` describing ``files`` (paths relative to ``folder``) and ``info``."""
    manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "ember_version": __version__,
                "created": time.time(), **info,
                "files": {name: files[name].to_json() for name in sorted(files)}}
    save_bytes(json.dumps(manifest, indent=1).encode(), os.path.join(folder, MANIFEST_NAME))


def read_manifest(folder: str) -> dict[str, Any] | None:
    """The folder's manifest, or None when it has none or it is not a valid Ember manifest."""
    try:
        with open(os.path.join(folder, MANIFEST_NAME), encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or manifest.get("format_version", 0) > FORMAT_VERSION:
        return None
    try:
        manifest["files"] = {str(name): FileRecord.from_json(entry) for name, entry in files.items()}
    except (KeyError, TypeError, ValueError):
        return None
    return manifest


def is_committed(folder: str) -> bool:
    """Whether ``folder`` is a committed checkpoint (a directory with a valid manifest)."""
    return os.path.isdir(folder) and read_manifest(folder) is not None


def list_files(folder: str) -> list[str]:
    """Every regular file under ``folder`` as a relative POSIX path, the manifest excepted."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if relative != MANIFEST_NAME and os.path.isfile(os.path.join(root, name)):
                found.append(relative)
    return sorted(found)


# -- verification -------------------------------------------------------------------------------------------
def check_sizes(folder: str, manifest: Mapping[str, Any]) -> None:
    """Raise ``CorruptCheckpointError`` naming the first listed file that is missing or has the wrong size."""
    for name, record in manifest["files"].items():
        path = os.path.join(folder, name)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise CorruptCheckpointError(f"Checkpoint {folder} is incomplete: {path} is listed in its manifest "
                                         "but missing.") from None
        if size != record.size:
            raise CorruptCheckpointError(f"Checkpoint {folder} is corrupted: {path} has {size} bytes, its "
                                         f"manifest says {record.size} (truncated or overwritten).")


def check_file(folder: str, name: str, expected: FileRecord, pool: Executor | None = None) -> Callable[[], None]:
    """Start checking one file (on ``pool``, or at once); the returned function raises if it differs."""
    path = os.path.join(folder, name)
    try:
        hashing = start_hashing(path, expected.algorithm, pool)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"Checkpoint {folder} is incomplete: {path} is missing.") from None

    def finish() -> None:
        actual = hashing()
        if actual != expected:
            raise mismatch(folder, path, actual, expected)

    return finish


def start_checksums(folder: str, manifest: Mapping[str, Any], pool: Executor | None = None,
                    skip: Iterable[str] = ()) -> Callable[[], None]:
    """Start checking every file's checksum on ``pool``; the returned function waits and raises the first failure.

    ``load_state`` reads the files meanwhile, into memory nothing live refers to yet, and applies them only once
    this has passed: the hashing (memory-bound, ~40 ms for 600 MB here) then hides behind the reading instead of
    adding to it. The largest files are started first, so the longest hash never starts last. Files in ``skip``
    are left to the caller (``read_torch_file`` checks what it reads). Without ``pool`` every file is checked
    before this returns.
    """
    skipped = set(skip)
    names = sorted((n for n in manifest["files"] if n not in skipped), key=lambda n: -manifest["files"][n].size)
    checks: dict[str, Callable[[], None]] = {}
    try:
        for name in names:
            checks[name] = check_file(folder, name, manifest["files"][name], pool)
            if pool is None:
                checks[name]()
    except BaseException:
        _finish_all(checks)
        raise

    def finish() -> None:
        failures = _finish_all(checks)
        for name in manifest["files"]:  # the manifest's order: the same file is named whatever the timing
            if name in failures:
                raise failures[name]

    return finish


def _finish_all(checks: Mapping[str, Callable[[], None]]) -> dict[str, BaseException]:
    failures: dict[str, BaseException] = {}
    for name, check in checks.items():
        try:
            check()
        except Exception as err:  # noqa: BLE001 - reported by the caller, in the manifest's order
            failures[name] = err
    return failures


def verify_checksums(folder: str, manifest: Mapping[str, Any]) -> None:
    """Check every file's checksum; raises ``CorruptCheckpointError`` naming the first file that differs."""
    start_checksums(folder, manifest)()


# -- naming, discovery, pruning -----------------------------------------------------------------------------
def checkpoint_number(folder: str) -> int | None:
    """``N`` for a folder named ``checkpoint_N``, else None."""
    match = _AUTO_NAME.match(os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def committed_checkpoints(*directories: str, auto_named: bool = True) -> list[tuple[int | None, str]]:
    """``(N, path)`` of every committed checkpoint directly inside ``directories``, oldest first.

    With ``auto_named`` (the engine's automatic naming) only ``checkpoint_N`` folders count, ordered by ``N``;
    otherwise every committed folder counts (``N`` is None for other names), ordered by the time its manifest was
    written. Folders whose names start with a dot (a save in progress, one being deleted) are never listed.

    Example:
        >>> committed_checkpoints("/no/such/folder")
        []
    """
    found: list[tuple[float, int | None, str]] = []
    for base in directories:
        try:
            names = os.listdir(base)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            match = _AUTO_NAME.match(name)
            if name.startswith(".") or (auto_named and not match):
                continue
            path = os.path.join(base, name)
            manifest = read_manifest(path) if os.path.isdir(path) else None
            if manifest is not None:
                number = int(match.group(1)) if match else None
                created = number if auto_named and number is not None else manifest.get("created", 0.0)
                found.append((float(created), number, path))
    return [(number, path) for _, number, path in sorted(found, key=lambda item: (item[0], item[2]))]


def holds_shards(manifest: Mapping[str, Any]) -> bool:
    """Whether a checkpoint stores its models / optimizers in sub-folders a backend wrote (shards such as
    ``pytorch_model_fsdp_{i}/`` and ``optimizer_{i}/``, or ``pytorch_model/``) instead of full files."""
    return any(name.startswith(("pytorch_model", "optimizer_")) and "/" in name for name in manifest["files"])


def load_first_intact(load: Callable[[str], object], candidates: Sequence[str], *, context: str,
                      advice: str, warn: bool = True) -> str:
    """``load`` the first of ``candidates`` (newest first) that verifies; returns it.

    A candidate that fails with ``CorruptCheckpointError`` (flipped bits, a truncated copy) is reported with a
    warning naming it and the next one is tried, as ``Accelerator.load_state()`` does with automatic naming and
    the trainer's ``ckpt_path="last"``. Any other error is raised at once: it is not about the files.

    Args:
        load: reads and applies one checkpoint folder (on every rank alike: its failures are agreed).
        candidates: committed folders, newest first.
        context: what is loading, for the messages (``"load_state()"``, ``"fit(ckpt_path='last')"``).
        advice: the last sentence of the error when no candidate verifies (how to start afresh).
        warn: emit the fall-back warnings (the main process only, in the trainer).

    Raises:
        CorruptCheckpointError: every candidate is damaged; the message lists each one with its error.
    """
    tried: list[str] = []
    for position, folder in enumerate(candidates):
        try:
            load(folder)
            return folder
        except CorruptCheckpointError as error:
            tried.append(f"  {folder}: {error}")
            if position + 1 < len(candidates) and warn:
                warnings.warn(f"{context}: {error} Falling back to the previous committed checkpoint "
                              f"{candidates[position + 1]}.", UserWarning, stacklevel=3)
    listed = "\n".join(tried)
    raise CorruptCheckpointError(f"{context}: none of the {len(candidates)} committed checkpoint(s) verifies:\n"
                                 f"{listed}\n{advice}")


def next_checkpoint_number(base: str, iteration: int) -> int:
    """The number of the next automatic checkpoint: ``iteration``, or one past the highest existing name.

    Every ``checkpoint_N`` entry counts here, committed or not, so the new folder can never land on an
    existing one.
    """
    try:
        taken = [int(m.group(1)) for m in map(_AUTO_NAME.match, os.listdir(base)) if m]
    except FileNotFoundError:
        taken = []
    return max([iteration, *(n + 1 for n in taken)])


def new_temp_folder(final: str) -> str:
    """Create and return the hidden temporary sibling a save into ``final`` writes to."""
    parent, name = os.path.split(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    temp = os.path.join(parent, f"{TEMP_PREFIX}{name}-{secrets.token_hex(6)}")
    os.mkdir(temp)
    return temp


def remove_folder(folder: str) -> None:
    """Delete a folder so that no crash leaves a half-deleted checkpoint: rename it out of sight, then remove."""
    parent, name = os.path.split(os.path.abspath(folder))
    doomed = os.path.join(parent, f"{TEMP_PREFIX}{name}-deleting-{secrets.token_hex(6)}")
    os.rename(folder, doomed)
    fsync_dir(parent)
    # Another rank may still be closing a file in it (a failed save): retry briefly instead of leaving it behind.
    for attempt in range(5):
        shutil.rmtree(doomed, ignore_errors=True)
        if not os.path.lexists(doomed):
            return
        time.sleep(0.05 * (attempt + 1))


def clean_leftovers(parent: str, name_prefix: str) -> None:
    """Remove temporary folders (``.tmp-{name_prefix}...``) left in ``parent`` by crashed saves or deletes.

    A moved-aside ``.old-`` copy of a replaced folder is renamed back if the crash happened before its
    replacement was in place, and removed otherwise.
    """
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(parent, name)
        if name.startswith(TEMP_PREFIX + name_prefix):
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(OLD_PREFIX + name_prefix):
            final = os.path.join(parent, name[len(OLD_PREFIX):].rsplit("-", 1)[0])
            if not os.path.lexists(final) and is_committed(path):
                os.rename(path, final)
            else:
                shutil.rmtree(path, ignore_errors=True)


def check_replaceable(final: str) -> None:
    """Raise unless ``final`` is absent, an empty directory, or a committed checkpoint (safe to replace)."""
    if not os.path.lexists(final):
        return
    if not os.path.isdir(final):
        raise ValueError(f"save_state(output_dir={final!r}): that path is a file. Choose a directory path.")
    if os.listdir(final) and not is_committed(final):
        raise ValueError(f"save_state(output_dir={final!r}): the directory exists and is not an Ember checkpoint; "
                         "replacing it would delete its files. Choose a new or empty directory.")


def commit(temp: str, final: str) -> None:
    """Make the fully written ``temp`` folder visible as ``final`` in one atomic rename.

    An existing ``final`` (a previous checkpoint saved to the same explicit directory) is moved aside first and
    deleted only once the new one is in place.
    """
    for root, dirs, _ in os.walk(temp):  # files are fsynced by their writers; make their entries durable too
        for name in dirs:
            fsync_dir(os.path.join(root, name))
    fsync_dir(temp)
    parent, name = os.path.split(os.path.abspath(final))
    old = None
    if os.path.lexists(final):
        old = os.path.join(parent, f"{OLD_PREFIX}{name}-{secrets.token_hex(6)}")
        os.rename(final, old)
    os.rename(temp, final)
    fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prune(base: str, total_limit: int, protect: Iterable[str] = ()) -> list[str]:
    """Delete the oldest committed checkpoints in ``base`` beyond ``total_limit``; returns the deleted paths.

    The newest committed checkpoint and every path in ``protect`` (the one the run resumed from) are never
    deleted, even if that leaves more than ``total_limit``.
    """
    committed = committed_checkpoints(base)
    if len(committed) <= total_limit:
        return []
    keep = {os.path.realpath(p) for p in protect} | {os.path.realpath(committed[-1][1])}
    deleted = []
    excess = len(committed) - total_limit
    for _, path in committed:
        if excess == 0:
            break
        if os.path.realpath(path) in keep:
            continue
        remove_folder(path)
        deleted.append(path)
        excess -= 1
    return deleted
