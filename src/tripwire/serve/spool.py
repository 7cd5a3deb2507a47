"""The receiver's write-ahead spool: every accepted export request, on local disk, before 200.

An OTLP request is acknowledged once it is judged and what must not be lost is in the store;
but its spans may still wait in the reorder buffer, and counters and timelines are written
behind. A crash of the process (SIGKILL, OOM kill) would lose those. So the receiver appends
each accepted request, as it came (its body, content type and encoding), to a segment file of
this spool with one ``write()`` before it answers 200: the kernel holds it from then on, so it
survives the death of the process (not of the machine: there is no ``fsync``, which would cost
milliseconds per request). At start-up the receiver replays the segments that are still there,
and a segment is deleted once everything accepted up to its last entry has been judged and
written to the store (the receiver's *watermark*).

Format of a segment (``seg-<12 digits>.log``): records of a 20-byte header (body length, CRC-32
of the body, accepted-at Unix seconds as a double, content-type code, encoding code, two
reserved bytes) and the body. A torn or corrupt record (the process died mid-write: that
request was not acknowledged) ends the segment's replay.

The directory is locked (``flock``) by the receiver that uses it: two receivers never share one.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["Entry", "Spool", "SpoolBusy"]

logger = logging.getLogger("tripwire.serve")

_HEADER: Final = struct.Struct("<IIdBBxx")
_KINDS: Final = ("application/x-protobuf", "application/json")
_ENCODINGS: Final = ("", "gzip", "deflate")


class SpoolBusy(RuntimeError):
    """Another receiver holds the spool directory."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One accepted request, as spooled."""

    at: float
    kind: str
    encoding: str | None
    body: bytes


class Spool:
    """Segment files of accepted requests in one directory (see the module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = 32 * 1024 * 1024,
        segment_s: float = 1.0,
        max_bytes: int = 1024 * 1024 * 1024,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # it holds raw request bodies: the service's user only
        self.segment_bytes = segment_bytes
        self.segment_s = segment_s
        self.max_bytes = max_bytes
        self._lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise SpoolBusy(f"the spool {self.directory} is in use by another receiver") from None
        self._closed: list[tuple[Path, float, int]] = []
        """Closed segments: path, newest entry's time, size."""
        self._existing = sorted(self.directory.glob("seg-*.log"))
        last = int(self._existing[-1].stem[4:]) if self._existing else 0
        self._seq = last
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._opened_at = 0.0
        self._newest = 0.0
        self.bytes = sum(p.stat().st_size for p in self._existing)
        """Bytes in the spool (every segment)."""

    # -- start-up -------------------------------------------------------------------------------

    def pending(self) -> Iterator[Entry]:
        """The entries of the segments a previous receiver left (a crash), oldest first."""
        for path in self._existing:
            yield from _read(path)

    def adopt_pending(self, at: float) -> None:
        """Treat the segments :meth:`pending` read as closed segments whose newest entry is of
        ``at``: they are deleted once the watermark passes it (their spans are written)."""
        for path in self._existing:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            self._closed.append((path, at, size))
        self._existing = []

    # -- appending ------------------------------------------------------------------------------

    def append(self, at: float, kind: str, encoding: str | None, body: bytes) -> None:
        """One ``write()`` of the record (raises ``OSError`` when the disk refuses it)."""
        if self._fd is None or self._size >= self.segment_bytes:
            self._rotate()
        assert self._fd is not None
        header = _HEADER.pack(
            len(body), zlib.crc32(body), at, _KINDS.index(kind), _ENCODINGS.index(_encoding(encoding))
        )
        n = os.writev(self._fd, (header, body))
        if n != len(header) + len(body):  # pragma: no cover - a full disk mid-record
            raise OSError(f"short write to the spool ({n} of {len(header) + len(body)} bytes)")
        self._size += n
        self.bytes += n
        self._newest = max(self._newest, at)

    @property
    def full(self) -> bool:
        """Over ``max_bytes``: the store is behind; new requests get 503 until it catches up."""
        return self.bytes >= self.max_bytes

    def _rotate(self) -> None:
        if self._fd is not None and self._path is not None:
            os.close(self._fd)
            self._closed.append((self._path, self._newest, self._size))
        self._seq += 1
        self._path = self.directory / f"seg-{self._seq:012d}.log"
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = 0
        self._newest = 0.0
        self._opened_at = time.monotonic()

    # -- truncating -----------------------------------------------------------------------------

    def release(self, watermark: float) -> int:
        """Delete the segments whose every entry is older than ``watermark``; rotate the open
        segment when it is old enough, so that it can go next time. Returns segments deleted."""
        if self._fd is not None and self._size and time.monotonic() - self._opened_at >= self.segment_s:
            self._rotate()
        kept: list[tuple[Path, float, int]] = []
        deleted = 0
        for path, newest, size in self._closed:
            if newest < watermark:
                path.unlink(missing_ok=True)
                self.bytes -= size
                deleted += 1
            else:
                kept.append((path, newest, size))
        self._closed = kept
        return deleted

    def close(self, *, empty: bool = False) -> None:
        """Close the open segment; with ``empty`` (everything written) delete every segment."""
        if self._fd is not None:
            os.close(self._fd)
            if self._path is not None:
                self._closed.append((self._path, self._newest, self._size))
            self._fd = None
        if empty:
            for path, _, size in self._closed:
                path.unlink(missing_ok=True)
                self.bytes -= size
            self._closed = []
            if not any(self.directory.glob("seg-*.log")):
                # Nothing left to replay: leave no directory behind (one per port otherwise).
                (self.directory / "lock").unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    self.directory.rmdir()
        os.close(self._lock_fd)


def _encoding(encoding: str | None) -> str:
    value = (encoding or "").strip().lower()
    return value if value in _ENCODINGS else ""


def _read(path: Path) -> Iterator[Entry]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        logger.warning("spool segment %s unreadable (%s); skipped", path, exc)
        return
    i = 0
    size = _HEADER.size
    while i + size <= len(data):
        length, crc, at, kind, encoding = _HEADER.unpack_from(data, i)
        body = data[i + size : i + size + length]
        if len(body) < length or zlib.crc32(body) != crc or kind >= len(_KINDS) or encoding >= len(_ENCODINGS):
            logger.warning("spool segment %s: torn record at byte %d (not acknowledged); the rest is skipped", path, i)
            return
        yield Entry(at=at, kind=_KINDS[kind], encoding=_ENCODINGS[encoding] or None, body=body)
        i += size + length
