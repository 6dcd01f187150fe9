"""A small loopback TCP proxy that the chaos tests put between clients and
Redis, and tell to misbehave at random moments.

It runs its own asyncio loop in a daemon thread, so that whatever the test's
loop does (waiting for a killed process, say) never delays the traffic, and
the test can call it from anywhere. It listens on any number of *links*
(one port each, all forwarding to the server), so a fault can hit every
client or a single consumer (a partition). The faults, after Toxiproxy's
toxics:

- :meth:`ChaosProxy.reset`: open connections are reset (``SO_LINGER 0``: the
  peers see ``ECONNRESET``), on both sides;
- :meth:`ChaosProxy.cut_next_reply`: the next reply from the server is cut
  after a few bytes and its connection reset (a reply lost mid-way: the
  command ran, the client cannot know it did);
- :meth:`ChaosProxy.pause`: nothing is forwarded for a while (a black hole);
  what was sent meanwhile arrives late, all at once, like TCP
  retransmissions after a partition heals.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

_CHUNK: Final = 65536
T = TypeVar("T")


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(
        self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    def reset(self) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in (self.client, self.upstream):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):  # close with RST, not FIN
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
            writer.transport.abort()


class _Link:
    """One listening port and the connections made through it."""

    def __init__(self, server: asyncio.Server) -> None:
        self.server = server
        self.port: int = server.sockets[0].getsockname()[1]
        self.pairs: set[_Pair] = set()
        self.resume: asyncio.Event | None = None
        self.cut_armed = False


class ChaosProxy:
    """Forwards each of its links to ``127.0.0.1:<upstream_port>``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.resets = 0
        self.cuts = 0
        self.pauses = 0
        self._links: dict[int, _Link] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="chaos-proxy", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def add_link(self) -> str:
        """Listen on a new free port; return its ``redis://`` URL."""
        port = self._call(self._add_link())
        return f"redis://127.0.0.1:{port}/0"

    def stop(self) -> None:
        """Reset every connection and stop listening."""
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def reset(self, url: str | None = None) -> int:
        """Reset the open connections of one link (all with None); return
        how many were reset."""
        return self._call(self._reset(url))

    def cut_next_reply(self, url: str | None = None) -> None:
        """Cut the next server reply on a link (any with None) after a few
        bytes, and reset its connection."""
        self._call(self._arm_cut(url))

    def pause(self, seconds: float, url: str | None = None) -> None:
        """Forward nothing on a link (all with None) for *seconds*; returns
        at once."""
        self._call(self._pause(seconds, url))

    # -- on the proxy's loop ------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _select(self, url: str | None) -> list[_Link]:
        if url is None:
            return list(self._links.values())
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        return [self._links[port]] if port in self._links else []

    async def _add_link(self) -> int:
        link: _Link | None = None

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            assert link is not None
            await self._handle(link, r, w)

        link = _Link(await asyncio.start_server(handle, "127.0.0.1", 0))
        self._links[link.port] = link
        return link.port

    async def _shutdown(self) -> None:
        await self._reset(None)
        for link in self._links.values():
            link.server.close()
            await link.server.wait_closed()

    async def _reset(self, url: str | None) -> int:
        count = 0
        for link in self._select(url):
            for pair in list(link.pairs):
                pair.reset()
                count += 1
            link.pairs.clear()
        self.resets += 1
        return count

    async def _arm_cut(self, url: str | None) -> None:
        for link in self._select(url):
            link.cut_armed = True

    async def _pause(self, seconds: float, url: str | None) -> None:
        self.pauses += 1
        for link in self._select(url):
            resume = link.resume = link.resume or asyncio.Event()
            self._loop.call_later(seconds, self._end_pause, link, resume)

    def _end_pause(self, link: _Link, resume: asyncio.Event) -> None:
        resume.set()
        if link.resume is resume:
            link.resume = None

    async def _handle(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port
            )
        except OSError:
            writer.transport.abort()  # the server is down: refuse, as it would
            return
        pair = _Pair(writer, up_writer)
        link.pairs.add(pair)
        try:
            await asyncio.gather(
                self._pipe(link, pair, reader, up_writer, from_server=False),
                self._pipe(link, pair, up_reader, writer, from_server=True),
            )
        finally:
            link.pairs.discard(pair)
            pair.reset()

    async def _pipe(
        self,
        link: _Link,
        pair: _Pair,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        from_server: bool,
    ) -> None:
        try:
            while not pair.is_closed():
                data = await reader.read(_CHUNK)
                if not data:
                    break
                while link.resume is not None and not pair.is_closed():
                    await link.resume.wait()
                if pair.is_closed():
                    break
                if from_server and link.cut_armed:
                    link.cut_armed = False
                    self.cuts += 1
                    writer.write(data[: max(1, len(data) // 2)])
                    await writer.drain()
                    pair.reset()
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            pair.reset()
