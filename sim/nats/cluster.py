"""The nats StatefulSet as its operators read it: quorum, and when a restarted server has caught up.

Why a restarted server is waited for beyond the chart's readiness probe: the probe
(``/healthz?js-server-only=true``) passes as soon as the server runs, before its streams have caught up
with the others. In the field, a rolling update is slowed by the next server's lame duck (the chart's
preStop hook: leaderships handed over, then a 10 s grace period before its clients are closed), which
gives the one restarted before it that time; ncpsim's lame duck has a 0.1 s grace period
(sim.nats.config), so the next restart waits until JetStream is current on every running server
(``/healthz``: a meta leader, and the server's streams and consumers caught up; a server that stayed up
may still be electing a stream leader with the one that came back). That takes a majority of the
servers: with fewer running, JetStream has no quorum, and waiting would only run out; the answer says so
instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .server import CURRENT_PATH, healthz

CURRENT_TIMEOUT = (
    60.0  # seconds for a restarted server's JetStream to catch up: about 1 s on a laptop, a leader
)
# election that splits waits out nats-server's own 4-9 s timeout, and a loaded machine stretches both
_BACKOFF_FIRST, _BACKOFF_MAX = 0.01, 0.1


def quorum(servers: int) -> int:
    """How many servers JetStream's Raft groups need running: a majority."""
    return servers // 2 + 1


@dataclass(frozen=True)
class Catchup:
    """What a restarted server came to: JetStream current, or why it could not be."""

    server: str
    running: int  # servers of the StatefulSet running now
    servers: int  # the StatefulSet's replicas
    current: bool | None  # None: not waited for (no quorum)
    seconds: float = 0.0

    def describe(self) -> str:
        if self.current is None:
            return (
                f"{self.running} of {self.servers} NATS servers running, fewer than the {quorum(self.servers)} "
                "JetStream needs: no quorum, work is not queued until a majority runs"
            )
        if self.current:
            return f"JetStream current on the {self.running} running servers after {self.seconds:.1f} s"
        return f"JetStream not current on every running server after {self.seconds:.0f} s (see their logs)"


def catch_up(
    server: str,
    monitors: Mapping[str, tuple[str, int]],
    servers: int,
    timeout: float = CURRENT_TIMEOUT,
    probe: Callable[[str, int], int] | None = None,
) -> Catchup:
    """Wait until JetStream is current on every running server (``monitors``: each one's monitor address)
    after ``server`` came back, if a majority runs to make it so."""
    count = len(monitors)
    if servers < 2:
        return Catchup(server, count, servers, True)  # one server: ready is current
    if count < quorum(servers):
        return Catchup(server, count, servers, None)
    ask = probe or (lambda host, port: healthz(host, port, path=CURRENT_PATH))
    start, delay = time.monotonic(), _BACKOFF_FIRST
    waiting = dict(monitors)
    while waiting:
        waiting = {name: address for name, address in waiting.items() if ask(*address) != 200}
        if waiting and time.monotonic() - start >= timeout:
            return Catchup(server, count, servers, False, time.monotonic() - start)
        if waiting:
            time.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)
    return Catchup(server, count, servers, True, time.monotonic() - start)
