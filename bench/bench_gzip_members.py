"""Decompressing a body of many gzip members: CPU time against the body's size.

A hostile exporter (or a ``.gz`` file handed to ``tripwire replay``) can pack a body with
thousands of empty gzip members. The naive reading, each member fed the whole rest of the
body, copies that rest once per member: quadratic. ``tripwire.spans.otlp.decompress`` feeds
each member a window that starts small and doubles, so the work is linear, and it refuses a
body of more than ``MAX_GZIP_MEMBERS`` members outright. Both are run here on the same bodies
(the cap lifted, to see the work itself). CPU seconds (``time.process_time``), median of 3.

    python bench/bench_gzip_members.py            # 0.25, 0.5, 1 and 2 MB of empty members
"""

from __future__ import annotations

import gzip
import statistics
import time
import zlib

from tripwire.spans.otlp import MAX_GZIP_MEMBERS, decompress


def naive(body: bytes, max_bytes: int) -> bytes:
    """Each member read from the whole rest of the body (what the receiver did until this)."""
    parts: list[bytes] = []
    data = body
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        parts.append(inflater.decompress(data, max_bytes))
        data = inflater.unused_data.lstrip(b"\0")
        if not data:
            return b"".join(parts)


def cpu(fn: object, *args: object, **kwargs: object) -> float:
    times = []
    for _ in range(3):
        started = time.process_time()
        fn(*args, **kwargs)  # type: ignore[operator]
        times.append(time.process_time() - started)
    return statistics.median(times)


def main() -> None:
    empty = gzip.compress(b"", mtime=0)
    payload = gzip.compress(b"x" * 1000, mtime=0)
    print(f"cap: {MAX_GZIP_MEMBERS} members a body (lifted below to time the work itself)")
    print(f"{'body':>8} {'members':>9} {'naive s':>9} {'tripwire s':>11} {'ratio':>7}")
    for mb in (0.25, 0.5, 1.0, 2.0):
        n = int(mb * 1024 * 1024 / len(empty))
        body = empty * n + payload
        slow = cpu(naive, body, 16 << 20)
        fast = cpu(decompress, body, "gzip", max_bytes=16 << 20, max_members=n + 1)
        assert decompress(body, "gzip", max_bytes=16 << 20, max_members=n + 1) == naive(body, 16 << 20)
        print(f"{mb:>6} MB {n:>9,} {slow:>9.3f} {fast:>11.3f} {slow / fast:>6.1f}x")


if __name__ == "__main__":
    main()
