"""A datagram transport whose sends cross a faulty link: each datagram goes now, later, or never.

QUIC parties send through it (sim.protocols.h3.connect) when a link fault may apply, so a firewall or a
TCP-only load balancer drops HTTP/3 as it would in the field: datagram by datagram, with QUIC's own
loss recovery and timeouts finding out, a kept-alive connection included. The link's decision is asked
for each datagram (`fate`), so a fault written after the connection opened reaches it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

# Seconds to hold one datagram back, or None: it is lost on the link.
Fate = Callable[[], float | None]


class LossyTransport(asyncio.DatagramTransport):
    """Wraps a connected datagram transport; everything but sendto passes through unchanged."""

    def __init__(self, inner: asyncio.DatagramTransport, fate: Fate):
        super().__init__()
        self.inner, self.fate = inner, fate
        self._held: set[asyncio.TimerHandle] = set()

    def sendto(self, data: Any, addr: Any = None) -> None:
        delay = self.fate()
        if delay is None:
            return  # lost on the link
        if delay <= 0:
            self.inner.sendto(data, addr)
            return
        handle: asyncio.TimerHandle

        def deliver() -> None:
            self._held.discard(handle)
            if not self.inner.is_closing():
                self.inner.sendto(data, addr)

        handle = asyncio.get_running_loop().call_later(delay, deliver)  # the link's latency
        self._held.add(handle)

    def close(self) -> None:
        self._drop_held()
        self.inner.close()

    def abort(self) -> None:
        self._drop_held()
        self.inner.abort()

    def _drop_held(self) -> None:
        for handle in self._held:  # datagrams still on the link die with the socket
            handle.cancel()
        self._held.clear()

    def is_closing(self) -> bool:
        return self.inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)
