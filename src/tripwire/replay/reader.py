"""OTLP trace files → :class:`~tripwire.spans.SpanView` objects.

Reads what OpenTelemetry exporters and the Collector write:

- OTLP/JSON: one ``ExportTraceServiceRequest`` per file, in the protobuf JSON mapping. Ids are
  hex strings (the OTLP file exporter) or base64 (protobuf's ``MessageToJson``); integers
  may be JSON strings; attribute values are ``{"stringValue": …}``, ``intValue``,
  ``doubleValue``, ``boolValue``, ``bytesValue``, ``arrayValue``, ``kvlistValue``;
- JSON Lines of those requests (one per line, as the Collector's file exporter appends them);
- OTLP protobuf files (a serialized ``ExportTraceServiceRequest``);
- gzip-compressed variants of each, detected by their magic bytes, not by their name;
- directories, walked recursively (files with a trace extension only, see
  :data:`TRACE_SUFFIXES`), and ``-`` for standard input.

Bad input never stops the read: a file that is not OTLP, truncated JSON, a bad JSON Lines
line or a span without a trace id becomes a :class:`Problem` naming the file (and the line),
and everything else is still read. A span that cannot be decoded (invalid UTF-8, a lone
surrogate escape, nesting too deep) is reported and skipped, and the file's other spans are
kept; a time that is not a Unix time in nanoseconds is reported and read as missing; an
attribute nested deeper than :data:`MAX_ATTRIBUTE_DEPTH` levels is cut there. A UTF-8
byte-order mark is accepted.

Bounds: what is not a regular file (a FIFO, a device such as a symlink to ``/dev/zero``, a
socket) is reported and never opened for reading, and no input may take more than
``max_file_bytes`` (default :data:`DEFAULT_MAX_FILE_BYTES`), read from disk or once
decompressed: a gzip bomb is stopped at the cap and reported as a bad file.

Decoding is :mod:`tripwire.spans.otlp`'s, the decoder ``tripwire serve`` runs on every export
request: the same spans, the same attribute values, and only the attributes the span mapping
reads (:data:`~tripwire.spans.otlp.WANTED_PREFIXES`, :data:`~tripwire.spans.otlp.WANTED_KEYS`).
This module turns its counts into :class:`Problem` objects and handles files, JSON Lines and
gzip.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from tripwire.errors import InputError
from tripwire.spans import SpanView
from tripwire.spans.otlp import (
    MAX_DEPTH,
    BodyTooLarge,
    Decoded,
    decode_json,
    decode_protobuf,
    decompress,
)

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "MAX_ATTRIBUTE_DEPTH",
    "STDIN",
    "TRACE_SUFFIXES",
    "FileBatch",
    "Problem",
    "expand_paths",
    "read_batches",
    "read_bytes",
    "read_files",
    "read_spans",
]

STDIN: Final = "-"
"""The path that means standard input."""

TRACE_SUFFIXES: Final = (".json", ".jsonl", ".ndjson", ".pb", ".protobuf", ".otlp", ".bin")
"""File name endings a directory walk picks up (each also with ``.gz``). Files named
explicitly are read whatever their name."""

DEFAULT_MAX_FILE_BYTES: Final = 1 << 30
"""The most one input may take (1 GiB), on disk and once decompressed; the CLI's
``--max-file-size`` raises it. Reading holds a file in memory, about twice over while decoding."""
MAX_ATTRIBUTE_DEPTH: Final = MAX_DEPTH
"""Attribute values nested deeper than this (arrays in arrays…) are cut: no emitter writes them,
and walking them would exhaust the stack."""

_GZIP_MAGIC: Final = b"\x1f\x8b"
_BOM: Final = b"\xef\xbb\xbf"
_JSONL_SUFFIXES: Final = (".jsonl", ".ndjson")


# -- problems ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """Something in the input that could not be read; the rest of the input still is."""

    source: str
    """The file (``<stdin>`` for standard input)."""
    detail: str
    """What is wrong, in a few words (never span content)."""
    line: int | None = None
    """The 1-based line, for JSON Lines input."""
    skipped: bool = False
    """True for a file a directory walk found that is not OTLP (a note, not an error)."""

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.detail}"

    def to_error(self) -> InputError:
        """The same problem as an :class:`~tripwire.errors.InputError` (to raise it)."""
        return InputError(self.source, self.detail, self.line)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"source": self.source, "line": self.line, "detail": self.detail, "skipped": self.skipped}


@dataclass(slots=True)
class FileBatch:
    """What one input file gave: its spans and its problems."""

    source: str
    """The file, as given or found (``<stdin>`` for standard input)."""
    spans: list[SpanView] = field(default_factory=list)
    """The spans read, in file order."""
    problems: list[Problem] = field(default_factory=list)
    """What could not be read."""
    nbytes: int = 0
    """The file's size on disk (compressed), for progress bars."""


# -- decoding: the one OTLP decoder (tripwire.spans.otlp), its counts as problems ---------------


def _problems(decoded: Decoded, source: str, line: int | None, problems: list[Problem]) -> list[SpanView]:
    if decoded.missing_ids:
        problems.append(
            Problem(source, f"{decoded.missing_ids} span(s) without a trace id (skipped)", line)
        )
    if decoded.bad_ids:
        problems.append(
            Problem(source, f"{decoded.bad_ids} span(s) whose trace or span id is neither hex nor base64 of the right length (skipped)", line)
        )
    if decoded.undecodable:
        bad = decoded.undecodable
        reasons = ", ".join(sorted(set(bad))[:3])
        problems.append(
            Problem(source, f"{len(bad)} span(s) could not be decoded ({reasons}); skipped, the rest was read", line)
        )
    if decoded.bad_times:
        problems.append(
            Problem(source, f"{decoded.bad_times} span time(s) that are not Unix times in nanoseconds (read as missing)", line)
        )
    if decoded.deep:
        problems.append(
            Problem(source, f"{decoded.deep} attribute value(s) nested deeper than {MAX_ATTRIBUTE_DEPTH} levels (cut there)", line)
        )
    return decoded.views


def _read_protobuf(data: bytes, source: str, problems: list[Problem]) -> list[SpanView]:
    # A serialized ExportTraceServiceRequest starts with field 1, wire type 2 (0x0a). The wire
    # format is lenient enough to accept many random byte strings, so check that first.
    if data[:1] != b"\x0a":
        problems.append(Problem(source, "not OTLP: neither JSON nor a protobuf ExportTraceServiceRequest"))
        return []
    try:
        decoded = decode_protobuf(data)
    except InputError as exc:
        problems.append(Problem(source, f"not OTLP: neither JSON nor a valid protobuf ExportTraceServiceRequest ({exc.detail})"))
        return []
    return _problems(decoded, source, None, problems)


# -- files ----------------------------------------------------------------------------------------


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def read_bytes(
    data: bytes,
    source: str,
    *,
    found_in_walk: bool = False,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> FileBatch:
    """Decode one input (already read into memory) whatever its format.

    Args:
        data: the file's bytes (gzip is detected and undone here).
        source: the name to put in problems.
        found_in_walk: True when a directory walk found the file: a JSON file that is not OTLP
            (a labels file, a config) is then skipped with a note instead of an error.
        max_file_bytes: the most the data may decompress to; past it the file is a problem.

    Returns:
        The spans and the problems; never raises for any content.
    """
    batch = FileBatch(source, nbytes=len(data))
    try:
        _decode_into(batch, data, source, found_in_walk, max_file_bytes)
    except (RecursionError, OverflowError) as exc:
        # A safety net for hostile input the checks above did not foresee: the file is
        # reported like any other bad file, and the other files are still read.
        batch.spans = []
        batch.problems.append(Problem(source, f"cannot be decoded ({type(exc).__name__})"))
    return batch


def _decode_into(
    batch: FileBatch, data: bytes, source: str, found_in_walk: bool, max_file_bytes: int
) -> None:
    name = source.lower()
    if data[:2] == _GZIP_MAGIC:
        try:
            data = decompress(data, "gzip", max_bytes=max_file_bytes)
        except BodyTooLarge:
            batch.problems.append(Problem(
                source,
                f"decompresses to more than {_size(max_file_bytes)}, the cap per file; skipped "
                "(raise it with --max-file-size if the file is genuine)",
            ))
            return
        except InputError as exc:  # truncated, corrupt, or too many members
            batch.problems.append(Problem(source, f"gzip data is not readable ({exc.detail})"))
            return
        name = name.removesuffix(".gz")
    if data[:3] == _BOM:
        data = data[3:]
    head = data.lstrip()[:1]
    if not head:
        batch.problems.append(Problem(source, "empty input (no OTLP data)"))
        return
    if head not in (b"{", b"["):
        batch.spans = _read_protobuf(data, source, batch.problems)
        return

    if name.endswith(_JSONL_SUFFIXES):
        _read_jsonl(data, source, batch, found_in_walk)
        return
    try:
        decoded = decode_json(data)
    except InputError as exc:
        # JSON Lines under another name: the first line is a complete JSON document by itself
        # (a pretty-printed file's first line is just "{").
        first, _, rest = data.partition(b"\n")
        if rest.strip() and _is_json(first):
            _read_jsonl(data, source, batch, found_in_walk)
            return
        batch.problems.append(Problem(source, exc.detail))
        return
    if not decoded.envelope:
        batch.problems.append(_not_otlp(source, None, found_in_walk))
        return
    batch.spans = _problems(decoded, source, None, batch.problems)


def _is_json(line: bytes) -> bool:
    try:
        msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def _not_otlp(source: str, line: int | None, found_in_walk: bool) -> Problem:
    if found_in_walk:
        return Problem(source, "not OTLP (JSON without resourceSpans); skipped", line, skipped=True)
    return Problem(source, "not an OTLP ExportTraceServiceRequest (no resourceSpans)", line)


def _read_jsonl(data: bytes, source: str, batch: FileBatch, found_in_walk: bool) -> None:
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            decoded = decode_json(raw)
        except InputError as exc:
            batch.problems.append(Problem(source, exc.detail, number))
            continue
        if not decoded.envelope:
            if found_in_walk and not batch.spans and number == 1:
                batch.problems.append(_not_otlp(source, None, True))
                return
            batch.problems.append(_not_otlp(source, number, False))
            continue
        batch.spans.extend(_problems(decoded, source, number, batch.problems))


def expand_paths(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[str, bool]]:
    """``(path, found_in_walk)`` for every input file: directories are walked recursively.

    Files inside directories are taken in sorted order (deterministic replay), hidden files
    and folders are skipped, and only names ending in :data:`TRACE_SUFFIXES` (or those
    plus ``.gz``) are kept. ``-`` is passed through for standard input. A path that does not
    exist is passed through too: reading it reports the problem.
    """
    for p in paths:
        text = os.fspath(p)
        if text == STDIN or not os.path.isdir(text):
            yield text, False
            continue
        for root, dirs, files in os.walk(text):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if name.startswith("."):
                    continue
                lower = name.lower().removesuffix(".gz")
                if lower.endswith(TRACE_SUFFIXES):
                    yield os.path.join(root, name), True


def _read_file(path: str, limit: int) -> bytes | Problem:
    """The file's bytes, or the problem: never opens a FIFO or a device for a blocking read."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return Problem(path, "no such file or directory")
    except OSError as exc:
        return Problem(path, f"cannot be read ({exc.strerror or exc})")
    with os.fdopen(fd, "rb", buffering=0) as fh:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = (
                    "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode)
                    else "not a file"
                )
                return Problem(path, f"not a regular file ({kind}); skipped")
            if info.st_size > limit:
                return Problem(path, f"{_size(info.st_size)}, over the cap of {_size(limit)} per "
                               "file; skipped (raise it with --max-file-size)")
            data = _read_capped(fh.read, limit + 1, first=info.st_size + 1)
        except OSError as exc:
            return Problem(path, f"cannot be read ({exc.strerror or exc})")
    if len(data) > limit:
        return Problem(path, f"over the cap of {_size(limit)} per file; skipped (raise it with --max-file-size)")
    return data


def _read_capped(read: Callable[[int], bytes], cap: int, *, first: int = 1 << 20) -> bytes:
    """At most ``cap`` bytes from ``read``, to its end, in growing chunks from ``first``: a cap
    of 64 GiB must not ask for 64 GiB of memory up front (``read(cap)`` does)."""
    chunks: list[bytes] = []
    size = 0
    want = max(first, 1)
    while size < cap:
        chunk = read(min(want, cap - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        want = min(want * 2, 64 << 20)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_batches(
    paths: Iterable[str | os.PathLike[str]],
    *,
    on_file: Callable[[str, int], None] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Iterator[FileBatch]:
    """Read every input, one :class:`FileBatch` per file, in order.

    Args:
        paths: files, directories (walked recursively), or ``-`` for standard input.
        on_file: called with ``(path, size in bytes)`` before each file is read (progress).
        max_file_bytes: the most one input may take, on disk and once decompressed; a larger
            one is a problem, and nothing past the cap is read.
    """
    return read_files(expand_paths(paths), on_file=on_file, max_file_bytes=max_file_bytes)


def read_files(
    files: Iterable[tuple[str, bool]],
    *,
    on_file: Callable[[str, int], None] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Iterator[FileBatch]:
    """:func:`read_batches` of what :func:`expand_paths` gave: ``(path, found_in_walk)``."""
    for path, walked in files:
        if path == STDIN:
            data = _read_capped(sys.stdin.buffer.read, max_file_bytes + 1)
            if on_file is not None:
                on_file(path, len(data))
            if len(data) > max_file_bytes:
                yield FileBatch("<stdin>", problems=[Problem(
                    "<stdin>", f"over the cap of {_size(max_file_bytes)}; skipped (raise it with --max-file-size)")])
                continue
            yield read_bytes(data, "<stdin>", max_file_bytes=max_file_bytes)
            continue
        read = _read_file(path, max_file_bytes)
        if isinstance(read, Problem):
            yield FileBatch(path, problems=[read])
            continue
        if on_file is not None:
            on_file(path, len(read))
        yield read_bytes(read, path, found_in_walk=walked, max_file_bytes=max_file_bytes)


def read_spans(
    paths: Iterable[str | os.PathLike[str]],
    problems: list[Problem] | None = None,
) -> Iterator[SpanView]:
    """Every span of every input, in file order; problems are appended to ``problems``.

    Args:
        paths: files, directories (walked recursively), or ``-`` for standard input.
        problems: a list to collect problems in (``None``: they are dropped).
    """
    for batch in read_batches(paths):
        if problems is not None:
            problems.extend(batch.problems)
        yield from batch.spans

