"""File checksums for checkpoint manifests: chunked xxh3-64 when the ``xxhash`` package is installed, else CRC-32.

Verifying a checkpoint means hashing every byte of it again, so the hash's speed bounds ``load_state``'s:
``zlib.crc32`` runs at about 2 GB/s on one core, xxh3 at 5-10 GB/s. Each file's record names the algorithm it
was hashed with, so a checkpoint written on a machine with ``xxhash`` states what its reader needs.

``xxh3_64x16m`` (the default) hashes each 16 MiB chunk of the file (at offsets ``k * 16 MiB``) with xxh3-64 and
the chunks' 8-byte digests, in order, once more. Unlike one hash over the whole file it can be checked by several
threads at once, and each chunk right after it is read into memory, while it is still in the CPU cache
(``engine.checkpoint.direct.read_torch_file``): checking then costs no second trip through memory. Files
recorded with plain ``xxh3_64`` (Ember 0.1) or ``crc32`` are still verified.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, wait
from dataclasses import dataclass
from typing import Any, Protocol

CHUNK_BYTES = 16 << 20  # hashing granularity: large enough to amortise calls, small enough to stay cache-warm
CHUNKED = "xxh3_64x16m"
ALGORITHMS = (CHUNKED, "xxh3_64", "crc32")


class Hasher(Protocol):
    def update(self, data: Any) -> None: ...

    def hexdigest(self) -> str: ...


class _Crc32:
    """``zlib.crc32`` behind the ``hashlib`` interface (releases the GIL on large buffers)."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: Any) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


class ChunkedXxh3:
    """The ``xxh3_64x16m`` checksum, streamed: xxh3-64 over the xxh3-64 digests of each 16 MiB chunk.

    >>> data = bytes(range(256)) * 100
    >>> hasher = ChunkedXxh3()
    >>> hasher.update(data[:1000]); hasher.update(data[1000:])
    >>> hasher.hexdigest() == combine_chunks([chunk_digest(data)])
    True
    """

    def __init__(self) -> None:
        self._chunk = _xxhash().xxh3_64()
        self._filled = 0
        self._digests = bytearray()

    def update(self, data: Any) -> None:
        view = memoryview(data)
        view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        while view.nbytes:
            take = min(view.nbytes, CHUNK_BYTES - self._filled)
            self._chunk.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == CHUNK_BYTES:
                self._digests += self._chunk.digest()
                self._chunk.reset()
                self._filled = 0

    def hexdigest(self) -> str:
        return combine_chunks([bytes(self._digests), self._chunk.digest() if self._filled else b""])


def chunk_hasher() -> Any:
    """A streaming hasher for one chunk (``.update``, ``.digest()``: what ``chunk_digest`` returns)."""
    return _xxhash().xxh3_64()


def chunk_digest(data: Any) -> bytes:
    """The 8-byte xxh3-64 digest of one chunk (at most ``CHUNK_BYTES``) of a file."""
    return _xxhash().xxh3_64_digest(data)


def combine_chunks(digests: list[bytes]) -> str:
    """The ``xxh3_64x16m`` hex digest of a file from its chunks' digests, in order."""
    return _xxhash().xxh3_64_hexdigest(b"".join(digests))


def _xxhash() -> Any:
    try:
        import xxhash
    except ImportError:
        raise RuntimeError("This checkpoint's files were checksummed with xxh3, which needs the xxhash package to "
                           "verify: pip install xxhash.") from None
    return xxhash


def default_algorithm() -> str:
    """``"xxh3_64x16m"`` if ``xxhash`` can be imported, else ``"crc32"``."""
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return "crc32"
    return CHUNKED


def new_hasher(algorithm: str) -> Hasher:
    """A fresh streaming hasher for ``algorithm`` (one of ``ALGORITHMS``)."""
    if algorithm == "crc32":
        return _Crc32()
    if algorithm == CHUNKED:
        return ChunkedXxh3()
    if algorithm == "xxh3_64":
        return _xxhash().xxh3_64()
    raise ValueError(f"Unknown checksum algorithm {algorithm!r}: expected one of {ALGORITHMS}.")


@dataclass(frozen=True)
class FileRecord:
    """Size and checksum of one file, as stored in the manifest (``{"size": n, "<algorithm>": "<hex>"}``)."""

    size: int
    algorithm: str
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, self.algorithm: self.digest}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> FileRecord:
        algorithm = next((name for name in ALGORITHMS if name in entry), None)
        if algorithm is None:
            raise ValueError(f"manifest entry {dict(entry)!r} has no checksum of a known algorithm {ALGORITHMS}")
        return cls(size=int(entry["size"]), algorithm=algorithm, digest=str(entry[algorithm]))


def hash_file(path: str, algorithm: str, pool: Executor | None = None) -> FileRecord:
    """Size and checksum of an existing file, read through mmap (no copy into Python).

    A ``xxh3_64x16m`` file's chunks are hashed by ``pool``'s threads side by side when one is given (call this
    from outside the pool: it waits for them).
    """
    return start_hashing(path, algorithm, pool)()


def start_hashing(path: str, algorithm: str, pool: Executor | None = None) -> Callable[[], FileRecord]:
    """Start hashing ``path`` on ``pool`` (each chunk a task, for ``xxh3_64x16m``); call the result for the record.

    Raises ``FileNotFoundError`` at once for a missing file. Without ``pool`` the file is hashed before this
    returns.
    """
    handle = open(path, "rb")  # noqa: SIM115 - closed by finish(), possibly on another call
    try:
        size = os.fstat(handle.fileno()).st_size
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None
    except BaseException:
        handle.close()
        raise
    view = memoryview(mapped) if mapped is not None else memoryview(b"")
    chunks = [view[start:start + CHUNK_BYTES] for start in range(0, size, CHUNK_BYTES)]

    def whole() -> str:
        hasher = new_hasher(algorithm)
        for chunk in chunks:
            hasher.update(chunk)
        return hasher.hexdigest()

    if pool is None:
        pending: Any = None
    elif algorithm == CHUNKED:
        pending = [pool.submit(chunk_digest, chunk) for chunk in chunks]
    else:
        pending = [pool.submit(whole)]

    def finish() -> FileRecord:
        try:
            if pending is None:
                digest = whole()
            else:
                wait(pending)  # all of them, even after a failure: the memory map is closed below
                results = [done.result() for done in pending]
                digest = combine_chunks(results) if algorithm == CHUNKED else results[0]
            return FileRecord(size, algorithm, digest)
        finally:
            for chunk in chunks:
                chunk.release()
            view.release()
            if mapped is not None:
                mapped.close()
            handle.close()

    if pool is not None:
        return finish
    record = finish()
    return lambda: record
