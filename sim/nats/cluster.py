"""The nats StatefulSet as its operators read it: quorum, and when a restarted server has caught up.

Why a restarted server is waited for beyond the chart's readiness probe: the probe
(``/healthz?js-server-only=true``) passes as soon as the server runs, before its streams have caught up
with the others. When the next server enters lame duck (the chart's preStop hook), nats-server hands each
Raft group it leads to another member at once and shuts its JetStream down a second later, whatever the
grace period. The member chosen takes over only if its log matches the leader's to the last entry; one
that came back a moment ago may not have heard from its group's leader yet, and even ``/healthz`` reads
it healthy then (a Raft node that knows no leader only checks that it applied what it committed). The
handover misses, and the group has no leader until an election timeout (4-9 s) runs out: publishes to
that stream get "no responders", its workers pull nothing. So the next restart waits until JetStream is
current: every running server's ``/healthz`` answers 200, and every Raft group (the meta group, each
stream, each consumer) has a leader among the running servers that sees each running member with nothing
left to copy (``/jsz``, its replicas ``current``). A field rollout gated by the chart's probe alone can
miss a handover so; ncpsim's assumption is the operator who waits. That takes a majority of the servers:
with fewer running, JetStream has no quorum, and waiting would only run out; the answer says so instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .server import CURRENT_PATH, JSZ_PATH, monitor

CURRENT_TIMEOUT = (
    60.0  # seconds for a restarted server's JetStream to catch up: about 1 s on a laptop, a leader
)
# election that splits waits out nats-server's own 4-9 s timeout, and a loaded machine stretches both
_BACKOFF_FIRST, _BACKOFF_MAX = 0.01, 0.1


def quorum(servers: int) -> int:
    """How many servers JetStream's Raft groups need running: a majority."""
    return servers // 2 + 1


@dataclass(frozen=True)
class Group:
    """One JetStream Raft group as one server sees it (its ``/jsz``)."""

    name: str  # as nats-server's log names it: "meta", "stream 'APP > rq_x'", "consumer 'APP > rq_x > c'"
    leader: str  # "" while the server knows none
    current: Mapping[str, bool]  # the other members; as the leader sees them, True when caught up


@dataclass(frozen=True)
class Reading:
    """What one server's monitor says: why ``/healthz`` fails ("" when it answers 200), its Raft groups."""

    unhealthy: str
    groups: tuple[Group, ...] = ()


def groups(jsz: Mapping[str, Any]) -> tuple[Group, ...]:
    """The Raft groups in a ``/jsz?streams=true&consumers=true`` answer."""

    def group(name: str, cluster: Mapping[str, Any] | None) -> Group:
        cluster = cluster or {}
        replicas = cluster.get("replicas") or []
        return Group(name, cluster.get("leader") or "", {r["name"]: bool(r.get("current")) for r in replicas})

    found = []
    if jsz.get("meta_cluster"):
        found.append(group("meta", jsz["meta_cluster"]))
    for account in jsz.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            path = f"{account['name']} > {stream['name']}"
            found.append(group(f"stream '{path}'", stream.get("cluster")))
            for consumer in stream.get("consumer_detail") or []:
                found.append(group(f"consumer '{path} > {consumer['name']}'", consumer.get("cluster")))
    return tuple(found)


def behind(readings: Mapping[str, Reading]) -> list[str]:
    """Why JetStream is not current on every running server (``readings``: each one's, by server name):
    a server's failing ``/healthz``, a group with no leader among them, a member its leader sees behind."""
    said = [f"{server}: {reading.unhealthy}" for server, reading in readings.items() if reading.unhealthy]
    led: dict[str, Group] = {}
    for server, reading in readings.items():
        led.update((g.name, g) for g in reading.groups if g.leader == server)
    names = sorted({g.name for reading in readings.values() for g in reading.groups})
    for name in names:
        if name not in led:
            said.append(f"{name}: no leader among the running servers")
            continue
        leader = led[name]
        lagging = sorted(m for m, current in leader.current.items() if m in readings and not current)
        if lagging:
            said.append(f"{name}: {', '.join(lagging)} not caught up with its leader {leader.leader}")
    return said


def read(host: str, port: int) -> Reading:
    """One server's ``/healthz`` and, when it answers 200, its ``/jsz``."""
    status, body = monitor(host, port, CURRENT_PATH)
    if status != 200:
        return Reading(_error(body) or (f"/healthz answered {status}" if status else "monitor not answering"))
    status, body = monitor(host, port, JSZ_PATH)
    try:
        return Reading("", groups(json.loads(body))) if status == 200 else Reading(f"/jsz answered {status}")
    except (ValueError, KeyError, TypeError):
        return Reading("/jsz answered something else than JetStream's account details")


def _error(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error") or "")
    except (ValueError, AttributeError):
        return ""


@dataclass(frozen=True)
class Catchup:
    """What a restarted server came to: JetStream current, or why it could not be."""

    server: str
    running: int  # servers of the StatefulSet running now
    servers: int  # the StatefulSet's replicas
    current: bool | None  # None: not waited for (no quorum)
    seconds: float = 0.0
    behind: tuple[str, ...] = ()  # what was still behind when the wait ran out

    def describe(self) -> str:
        if self.current is None:
            return (
                f"{self.running} of {self.servers} NATS servers running, fewer than the {quorum(self.servers)} "
                "JetStream needs: no quorum, work is not queued until a majority runs"
            )
        if self.current:
            return f"JetStream current on the {self.running} running servers after {self.seconds:.1f} s"
        return f"JetStream not current on every running server after {self.seconds:.0f} s: " + "; ".join(
            self.behind
        )


def catch_up(
    server: str,
    monitors: Mapping[str, tuple[str, int]],
    servers: int,
    timeout: float = CURRENT_TIMEOUT,
    probe: Callable[[str, int], Reading] = read,
) -> Catchup:
    """Wait until JetStream is current on every running server (``monitors``: each one's monitor address)
    after ``server`` came back, if a majority runs to make it so."""
    count = len(monitors)
    if servers < 2:
        return Catchup(server, count, servers, True)  # one server: ready is current
    if count < quorum(servers):
        return Catchup(server, count, servers, None)
    start, delay = time.monotonic(), _BACKOFF_FIRST
    while True:
        said = behind({name: probe(*address) for name, address in monitors.items()})
        if not said:
            return Catchup(server, count, servers, True, time.monotonic() - start)
        if time.monotonic() - start >= timeout:
            return Catchup(server, count, servers, False, time.monotonic() - start, tuple(said))
        time.sleep(delay)
        delay = min(delay * 2, _BACKOFF_MAX)
