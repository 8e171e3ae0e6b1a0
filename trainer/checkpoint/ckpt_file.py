"""One-file ``.ckpt`` checkpoints on disk: written atomically with digests, read back only once they verify.

The file is a ``torch.save`` of plain containers and tensors, so ``torch.load(path)`` reads it with torch's
default ``weights_only=True``. It is written to a hidden temporary sibling (``.{name}.tmp-{nonce}``), fsynced and
renamed over ``path`` in one step: a kill at any instant leaves the previous file (or none), never half of one.

Integrity: ``EMBER_KEY`` holds, under ``"digests"``, one digest per top-level key of the file (xxh3-128 where
``xxhash`` is installed, else BLAKE2b-128), over its content (keys, plain values, each tensor's dtype, shape and
bytes). Reading recomputes them before anything is trusted; a
flipped byte in tensor data changes a digest, one in the file's structure fails ``torch.load`` itself, and both
raise ``CorruptCheckpointError`` naming the file. One digest per key lets the run identity (a few hundred bytes)
be verified without hashing the weights: ``ckpt_path="last"`` reads the identities of many files.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import secrets
import shutil
import struct
import zipfile
from collections.abc import Callable, Iterable
from typing import Any

import torch

from engine.checkpoint.io import (
    CorruptCheckpointError,
    UnsafeCheckpointError,
    atomic_write,
    byte_view,
    fsync_dir,
    save_torch,
)

EMBER_KEY = "ember"  # Ember's own part of a .ckpt file (exact-resume state, identity, digests)
FORMAT = "ember-ckpt"
VERSION = 1
_TEMP_MARK = ".tmp-"
# A file changed on purpose (loaded, edited, saved again with torch.save) fails its digests like a damaged one: the
# way out the errors name. Without "ember" it is read as Lightning's own files are (no digests, no exact resume).
EDITED_HINT = ("If you changed this file on purpose, delete its 'ember' entry before saving it again: it then loads "
               "as a Lightning checkpoint (weights, optimizer, counters; no exact-resume state).")


def _xxh3_128() -> Any:
    import xxhash  # optional (as for the engine's checksums): ~20x faster than blake2b here

    return xxhash.xxh3_128()


_HASHERS: dict[str, Callable[[], Any]] = {"xxh3-128": _xxh3_128, "blake2b-128": lambda: hashlib.blake2b(digest_size=16)}


def default_digest() -> str:
    """``"xxh3-128"`` where ``xxhash`` is installed, else ``"blake2b-128"`` (the standard library's)."""
    try:
        _xxh3_128()
    except ImportError:
        return "blake2b-128"
    return "xxh3-128"


def _hasher(algorithm: str) -> Any:
    if algorithm not in _HASHERS:
        raise CorruptCheckpointError(f"Unknown checkpoint digest {algorithm!r}: expected one of {sorted(_HASHERS)}.")
    try:
        return _HASHERS[algorithm]()
    except ImportError:
        raise CorruptCheckpointError(f"This checkpoint's digests are {algorithm}, which needs the xxhash package to "
                                     "verify: pip install xxhash.") from None


def _feed(hasher: Any, value: Any) -> None:
    """Hash ``value``'s type, structure and content (tensors by dtype, shape and bytes)."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        hasher.update(f"T{value.dtype}{tuple(value.shape)};".encode())
        if flat.numel():
            hasher.update(byte_view(flat))
    elif isinstance(value, dict):
        hasher.update(f"D{len(value)};".encode())
        for key, item in value.items():
            _feed(hasher, key)
            _feed(hasher, item)
    elif isinstance(value, (list, tuple)):
        hasher.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)};".encode())
        for item in value:
            _feed(hasher, item)
    elif isinstance(value, float):
        hasher.update(b"F" + struct.pack("<d", value))
    else:  # str, int, bool, None, and anything a caller opted in to (hashed by its repr)
        text = repr(value).encode()
        hasher.update(f"{type(value).__name__}{len(text)};".encode() + text)


def digest_of(value: Any, algorithm: str = "blake2b-128") -> str:
    """The digest of one top-level value of a checkpoint.

    Example:
        >>> digest_of({"epoch": 1}) == digest_of({"epoch": 1}), digest_of(1) == digest_of(1.0)
        (True, False)
    """
    hasher = _hasher(algorithm)
    _feed(hasher, value)
    return hasher.hexdigest()


def seal(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with the digests of all its top-level keys recorded under ``EMBER_KEY``."""
    ember = dict(checkpoint[EMBER_KEY])
    ember.pop("digests", None)
    sealed = {**checkpoint, EMBER_KEY: ember}
    algorithm = default_digest()
    ember["digests"] = {"algorithm": algorithm,
                        "keys": {key: digest_of(value, algorithm) for key, value in sealed.items()}}
    return sealed


def write(path: str, checkpoint: dict[str, Any]) -> None:
    """Seal ``checkpoint`` and write it to ``path`` atomically (replacing a previous file there only at the end).

    A checkpoint folder at ``path`` (an asynchronous save's, or one from before checkpoints were files) is
    replaced too: moved aside only once the new file is complete, deleted once it is in place.
    """
    sealed = seal(checkpoint)
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    clean_leftovers(parent, name)
    if not os.path.isdir(path) or os.path.islink(path):
        atomic_write(path, lambda temp: save_torch(sealed, temp))
        return
    temp = os.path.join(parent, f".{name}{_TEMP_MARK}{secrets.token_hex(6)}")
    try:
        save_torch(sealed, temp)
        aside = os.path.join(parent, f".{name}{_TEMP_MARK}replaced-{secrets.token_hex(6)}")
        os.rename(path, aside)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    fsync_dir(parent)
    shutil.rmtree(aside, ignore_errors=True)


def clean_leftovers(parent: str, name: str) -> None:
    """Remove temporary files a killed write of ``name`` left in ``parent`` (never loaded: hidden names)."""
    prefix = f".{name}{_TEMP_MARK}"
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for entry in names:
        if entry.startswith(prefix):
            leftover = os.path.join(parent, entry)
            try:
                if os.path.isdir(leftover):
                    shutil.rmtree(leftover)
                else:
                    os.unlink(leftover)
            except OSError:
                pass  # another process's write in progress, or already gone: the next save retries


def is_file_checkpoint(path: str) -> bool:
    """Whether ``path`` is a regular file (a ``.ckpt`` file: Ember's or Lightning's), not a checkpoint folder."""
    return os.path.isfile(path)


def load(path: str, *, unpickle: bool = False, mmap: bool = False) -> dict[str, Any]:
    """``torch.load`` the file (``weights_only=True`` unless ``unpickle``), reporting a damaged file as such.

    Raises:
        CorruptCheckpointError: the file does not parse (truncated, flipped bytes in its structure).
        UnsafeCheckpointError: it holds objects only a full unpickle rebuilds, and ``unpickle`` is False.
    """
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=not unpickle, mmap=mmap)
    except pickle.UnpicklingError as error:
        # A class torch does not allow is named as a GLOBAL; anything else the restricted unpickler refuses (an
        # unknown opcode, a truncated stream) is damage, not a pickled object.
        if "Unsupported global" in str(error) or "GLOBAL " in str(error):
            raise UnsafeCheckpointError(
                f"{path} holds Python objects that only a full unpickle can rebuild (a Lightning checkpoint with "
                "non-plain hyper-parameters or callback states, for example), and unpickling can run code stored "
                "in the file. If you trust this checkpoint, pass weights_only=False (load_from_checkpoint(..., "
                "weights_only=False), or trainer.fit(..., ckpt_path=..., weights_only=False))."
            ) from None
        raise _damaged(path, error) from error
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, KeyError) as error:
        raise _damaged(path, error) from error
    if not isinstance(loaded, dict):
        raise CorruptCheckpointError(f"{path} is not a checkpoint: it holds a {type(loaded).__name__}, not a dict.")
    return loaded


def _damaged(path: str, error: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"Checkpoint {path} is corrupted: it does not load ({type(error).__name__}: {str(error).strip()[:200]}). "
        "Resume from another checkpoint (ckpt_path='last' falls back to the previous one of the same run), or "
        "restore the file from a copy.")


def verify(path: str, checkpoint: dict[str, Any], keys: Iterable[str] | None = None) -> None:
    """Raise ``CorruptCheckpointError`` unless the digests of ``keys`` (default: every key) match the file's.

    A file without ``EMBER_KEY`` (Lightning's own) has no digests: nothing to check.
    """
    ember = checkpoint.get(EMBER_KEY)
    if not isinstance(ember, dict):
        return
    record = ember.get("digests")
    if not isinstance(record, dict) or not isinstance(record.get("keys"), dict):
        raise CorruptCheckpointError(f"Checkpoint {path} is corrupted: its digests are missing. Resume from "
                                     "another checkpoint, or restore the file from a copy.")
    expected: dict[str, str] = record["keys"]
    algorithm = str(record.get("algorithm"))
    wanted = list(expected) if keys is None else list(keys)
    if keys is None and set(checkpoint) != set(expected):
        raise CorruptCheckpointError(f"Checkpoint {path} is corrupted: it holds the keys {sorted(checkpoint)}, its "
                                     f"digests list {sorted(expected)}. Resume from another checkpoint, or restore "
                                     f"the file from a copy. {EDITED_HINT}")
    without = {key: value for key, value in ember.items() if key != "digests"}
    for key in wanted:
        value = without if key == EMBER_KEY else checkpoint.get(key)
        actual = digest_of(value, algorithm)
        if key not in expected or actual != expected[key]:
            raise CorruptCheckpointError(
                f"Checkpoint {path} is corrupted: its {key!r} has {algorithm} {actual}, the file's digest says "
                f"{expected.get(key)} (flipped bits on disk, or a damaged copy). Resume from another checkpoint "
                "(ckpt_path='last' falls back to the previous one of the same run), or restore the file from a copy. "
                f"{EDITED_HINT}")


def read(path: str, *, unpickle: bool = False) -> dict[str, Any]:
    """The checkpoint in file ``path``, every digest verified (Lightning's files, without digests, as they are)."""
    checkpoint = load(path, unpickle=unpickle)
    verify(path, checkpoint)
    return checkpoint
