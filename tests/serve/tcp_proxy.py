"""A TCP proxy of the tests' own (asyncio, in a thread) that can be cut: it drops every
connection and refuses new ones until restored. It stands between a service and a real
PostgreSQL, so that tests can make the real database unreachable."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any


class TcpProxy:
    def __init__(self, target_port: int, port: int) -> None:
        self.target_port = target_port
        self.port = port
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.base_events.Server | None = None
        self.conns: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._call(self._listen())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port, reuse_address=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.conns.update((writer, up_w))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        self.conns.discard(writer)
        self.conns.discard(up_w)

    async def _cut(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()
        for w in list(self.conns):
            w.transport.abort()
        self.conns.clear()

    def cut(self) -> None:
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._cut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
