"""A small TCP proxy between the workers and PostgreSQL that can cut every connection on command.

A cut aborts both sockets of every proxied connection at once (no FIN handshake, buffers dropped):
what a NAT or load balancer that forgets its connections, or a failover of a virtual IP, does to
clients. The server sees its clients vanish mid-transaction; the clients see their sockets close
mid-statement (a commit may or may not have happened). New connections are accepted right after.

It runs an asyncio loop in a daemon thread of the calling process::

    with TcpProxy("127.0.0.1", pg_port) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/db"
        ...
        n = proxy.cut()      # connections cut
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``target_host:target_port``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections_total = 0
        self.cuts_total = 0
        #: While True, what either side sends is read and dropped: the sockets stay open and every byte is
        #: lost (a network that swallows everything; a broker blocked by a resource alarm looks the same).
        self.swallowing = False
        # Connections stranded by strand(): each loses every byte from then on, for good.
        self._stranded: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            # The server is down (a restart): the client sees its connection closed at once.
            client_w.transport.abort()
            return
        pair = (client_w, server_w)
        self._pairs.add(pair)
        self.connections_total += 1
        try:
            await asyncio.gather(self._pipe(client_r, server_w, pair), self._pipe(server_r, client_w, pair))
        finally:
            self._pairs.discard(pair)
            self._stranded.discard(pair)
            client_w.transport.abort()
            server_w.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while data := await reader.read(65536):
                if self.swallowing or pair in self._stranded:
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # One side closed: close the other, so that each end sees what the other saw.
            with contextlib.suppress(Exception):
                writer.transport.abort()

    def cut(self) -> int:
        """Abort every proxied connection now; return how many there were."""
        return asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(timeout=10)

    async def _cut(self) -> int:
        pairs = list(self._pairs)
        for client_w, server_w in pairs:
            client_w.transport.abort()
            server_w.transport.abort()
        self.cuts_total += len(pairs)
        return len(pairs)

    def strand(self) -> int:
        """From now on every byte of the connections open now is lost, for good, their sockets left open
        (their server gone without a word: a failover that moved its address to another host); new
        connections go through. How many were stranded."""

        async def strand() -> int:
            self._stranded.update(self._pairs)
            return len(self._pairs)

        return asyncio.run_coroutine_threadsafe(strand(), self._loop).result(timeout=10)

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    def close(self) -> None:
        """Stop listening, abort every connection and stop the loop's thread."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            await self._cut()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
