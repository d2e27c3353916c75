"""worker-utils' shared proxy client: one pool of kept-alive connections per worker, as Go's http.Transport.

worker-utils builds one http.Client per worker (worker.go: ``sharedProxyClient: httpstream.NewProxiedClient()``)
and sends every callback leg through it, so a worker dials (a DNS lookup and a TLS handshake) only when it
has no idle connection to reuse. Go's Transport keys idle connections by where they lead: for an http://
target through a proxy by the proxy alone (every pod target shares the connections to
``https://invocation.<workerDomain>:10084``), without a proxy by the target's host and port. It keeps up to
256 idle connections a key (MaxIdleConnsPerHost) for 5 minutes (IdleConnTimeout: under Envoy's 1 h, so the
worker never sends on a connection the proxy is about to close), hands out the one returned last, and drops
one whose server hung up (its read loop sees EOF while the connection is idle).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sim.protocols.http1 import H11Stream

IDLE_TIMEOUT = 300.0  # IdleConnTimeout in httpstream.NewProxiedClient
MAX_IDLE_PER_KEY = 256  # MaxIdleConnsPerHost in httpstream.NewProxiedClient


@dataclass(eq=False)
class Idle:
    stream: H11Stream
    ip: str  # the virtual address it was dialed to: a link fault there applies to every request over it
    expiry: asyncio.TimerHandle | None = None

    def alive(self) -> bool:
        return not (self.stream.reader.at_eof() or self.stream.writer.is_closing())


@dataclass
class KeepAlivePool:
    idle_timeout: float = IDLE_TIMEOUT
    max_idle: int = MAX_IDLE_PER_KEY
    _idle: dict[str, list[Idle]] = field(default_factory=dict)

    def take(self, key: str) -> Idle | None:
        """The connection returned last under `key` that is still open, if any."""
        idle = self._idle.get(key) or []
        while idle:
            conn = idle.pop()
            if conn.expiry:
                conn.expiry.cancel()
            if conn.alive():
                return conn
            conn.stream.close()
        return None

    def give(self, key: str, stream: H11Stream, ip: str) -> None:
        """Park a connection whose exchange is complete; one that cannot take another request is closed."""
        idle = self._idle.setdefault(key, [])
        if not stream.reusable() or stream.writer.is_closing() or len(idle) >= self.max_idle:
            stream.close()
            return
        stream.next_cycle()
        conn = Idle(stream, ip)
        conn.expiry = asyncio.get_running_loop().call_later(self.idle_timeout, self._expire, key, conn)
        idle.append(conn)

    def _expire(self, key: str, conn: Idle) -> None:
        idle = self._idle.get(key) or []
        if conn in idle:
            idle.remove(conn)
        conn.stream.close()

    def idle_count(self, key: str) -> int:
        return len(self._idle.get(key) or [])

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.expiry:
                    conn.expiry.cancel()
                conn.stream.close()
        self._idle.clear()
