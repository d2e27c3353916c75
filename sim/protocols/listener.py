"""A TCP listener that accepts every pending connection each time the socket is readable, as Envoy does.

Envoy accepts all connections pending in the kernel per socket event unless a listener sets
``max_connections_to_accept_per_socket_event``; the rendered config sets none. asyncio.start_server on
uvloop accepts one connection per loop iteration (libuv 1.52; strace shows no accept ending in EAGAIN): a
busy proxy whose iterations take 100 ms let new connections wait in the kernel's queue for seconds, and
workers dialing while a fleet's kept-alive connections were busy timed out in their TLS handshake. This
listener drains the queue on each readiness event and hands each connection to the loop's TLS server side
with ``connect_accepted_socket``, on asyncio's loop and uvloop alike.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from sim.protocols.reads import STREAM_LIMIT

log = logging.getLogger("ncpsim.listener")
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
ProtocolFactory = Callable[[], asyncio.BaseProtocol]


def listener_backlog() -> int:
    """Envoy's listener backlog when `tcp_backlog_size` is unset, as in the rendered config: net.core.somaxconn
    on Linux, 128 elsewhere. (asyncio's default of 100 dropped SYNs when a fleet of workers called back at
    once, and their connects timed out.)"""
    try:
        return int(SOMAXCONN.read_text())
    except (OSError, ValueError):
        return 128


class TcpListener:
    """``await start()`` binds 127.0.0.1 on a free port and returns it; ``handler(reader, writer)`` runs for
    each connection once its TLS handshake (if `tls`) is done; ``close()`` stops accepting and ends the
    handshakes still under way (established connections stay with their handlers).

    `protocol`, when given, makes each connection's protocol instead of the handler's streams: for a server
    that takes its common case in the protocol's callbacks, with no task per connection."""

    def __init__(
        self,
        handler: Handler | None,
        tls: ssl.SSLContext | None,
        handshake_timeout: float = 10.0,
        protocol: ProtocolFactory | None = None,
    ):
        assert handler is not None or protocol is not None
        self.handler, self.tls, self.handshake_timeout = handler, tls, handshake_timeout
        self.protocol = protocol
        self.sock: socket.socket | None = None
        self.handshakes: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(listener_backlog())
        sock.setblocking(False)
        self.sock = sock
        loop.add_reader(sock.fileno(), self._accept_pending, loop)
        return int(sock.getsockname()[1])

    def _accept_pending(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.sock is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return  # the kernel's queue is empty
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue  # the client gave up while it waited
                log.warning("accept failed: %s; trying again on the next readiness event", exc)
                return  # EMFILE and the like: the connection stays queued
            conn.setblocking(False)
            task = loop.create_task(self._open(loop, conn), name=f"listener:handshake:{conn.fileno()}")
            self.handshakes.add(task)
            task.add_done_callback(self.handshakes.discard)

    async def _open(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        protocol = self.protocol() if self.protocol is not None else self._streams()
        try:
            await loop.connect_accepted_socket(
                lambda: protocol,
                conn,
                ssl=self.tls,
                ssl_handshake_timeout=self.handshake_timeout if self.tls else None,
            )
        except BaseException as exc:
            conn.close()  # the loop closed it already unless the handshake was cancelled
            if not isinstance(exc, (OSError, TimeoutError)):  # ssl.SSLError is an OSError
                raise
            log.debug("connection ended in its TLS handshake: %s: %s", type(exc).__name__, exc)

    def _streams(self) -> asyncio.BaseProtocol:
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        return asyncio.StreamReaderProtocol(reader, self.handler)  # runs the handler on connection_made

    def close(self) -> None:
        if self.sock is not None:
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        for task in list(self.handshakes):
            task.cancel()
