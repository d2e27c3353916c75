"""The worker library's cache of QUIC connections to the proxy, one per host (worker/proxy/h3.go, h3ConnectionCache).

Each gRPC callback is a `POST /v1/proxy` stream on the worker's connection to the connect URL's
`host:port`, `<dashed-pod-ip>.<workerDomain>:443`: one connection per grpc-proxy pod, dialed (DNS lookup and
QUIC handshake) by the first callback that needs it, while callbacks arriving during the dial wait for it.
quic-go keeps it alive with a PING every 3 s (KeepAlivePeriod) and gives it up after 8 s without a packet
from the proxy (MaxIdleTimeout); a connection that closed leaves the cache at once, and the next callback
dials again.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sim.protocols.h3 import H3Endpoint, close_client

KEEP_ALIVE = 3.0  # quic.Config.KeepAlivePeriod in createH3RoundTripper
IDLE_TIMEOUT = 8.0  # quic.Config.MaxIdleTimeout in createH3RoundTripper
_ping_ids = itertools.count(1)


def _endpoint(entry: asyncio.Task[H3Endpoint]) -> H3Endpoint | None:
    """The connection a finished dial gave; None while it dials, or when it failed or was cancelled."""
    if entry.done() and not entry.cancelled() and entry.exception() is None:
        return entry.result()
    return None


def _open(entry: asyncio.Task[H3Endpoint]) -> bool:
    """A dial still under way, or one that gave a connection not closed since."""
    endpoint = _endpoint(entry)
    return not entry.done() or (endpoint is not None and not endpoint.closed)


@dataclass
class QuicCache:
    keep_alive: float = KEEP_ALIVE
    _entries: dict[str, asyncio.Task[H3Endpoint]] = field(default_factory=dict)
    _pings: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def get(self, host: str, dial: Callable[[], Awaitable[H3Endpoint]]) -> tuple[H3Endpoint, bool]:
        """The open connection to `host` and True, else one from `dial()` and False. A dial already under way
        is shared by the callbacks that arrive meanwhile; a failed one leaves nothing (each waiter gets its
        error)."""
        entry = self._entries.get(host)
        if entry is not None and not _open(entry):
            self.forget(host)
            entry = None
        reused = entry is not None and entry.done()
        if entry is None:
            entry = self._entries[host] = asyncio.create_task(
                self._dial(host, dial), name=f"quic-dial:{host}"
            )
        try:
            endpoint = await asyncio.shield(entry)
        except BaseException:
            if self._entries.get(host) is entry and entry.done():
                self.forget(host)
            raise
        return endpoint, reused

    async def _dial(self, host: str, dial: Callable[[], Awaitable[H3Endpoint]]) -> H3Endpoint:
        endpoint = await dial()
        self._pings[host] = asyncio.create_task(self._keep(host, endpoint), name=f"quic-keepalive:{host}")
        return endpoint

    async def _keep(self, host: str, endpoint: H3Endpoint) -> None:
        """A PING every `keep_alive` seconds while the connection lasts; then it leaves the cache."""
        while not endpoint.closed:
            await asyncio.sleep(self.keep_alive)  # quic-go's keep-alive timer, not a wait for readiness
            if not endpoint.closed:
                endpoint.quic.send_ping(next(_ping_ids))
                endpoint.transmit()
        entry = self._entries.get(host)
        if entry is not None and _endpoint(entry) is endpoint:
            del self._entries[host]
            self._pings.pop(host, None)
        close_client(endpoint)

    def forget(self, host: str) -> None:
        """Drop `host`'s connection, closing it (a failure on it, or a dial that failed)."""
        entry, ping = self._entries.pop(host, None), self._pings.pop(host, None)
        if ping is not None:
            ping.cancel()
        endpoint = _endpoint(entry) if entry is not None else None
        if endpoint is not None:
            close_client(endpoint)

    async def close(self) -> None:
        dials = [entry for entry in self._entries.values() if not entry.done()]
        for entry in dials:
            entry.cancel()
        await asyncio.gather(*dials, return_exceptions=True)
        pings = list(self._pings.values())
        for host in list(self._entries):
            self.forget(host)
        await asyncio.gather(*pings, return_exceptions=True)
