"""`wait:` steps: conditions on what the stack has recorded (events) or bound (the network map).

The predicates are pure over what they are given; `wait_until` only re-reads the files between tries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scenarios.spec import Wait
from scenarios.tail import StackTail
from sim.model.topology import Topology


def matching_events(wait: Wait, events: list[dict[str, Any]], since: float) -> int:
    return sum(
        1
        for e in events
        if e["kind"] == wait.event
        and e.get("ts", 0) >= since
        and all(e.get(k) == v for k, v in wait.where.items())
    )


def listener_key(wait: Wait, topology: Topology) -> str | None:
    """The network-map key ("10.42.0.11:8443/tcp") a `listener: POD:PORT` condition is about."""
    pod_name, _, port = (wait.listener or "").rpartition(":")
    pod = next((p for p in topology.pods if p.name == pod_name), None)
    return f"{pod.ip}:{port}/tcp" if pod else None


def bound_now(state_dir: Path) -> set[str]:
    try:
        return set(json.loads((state_dir / "netmap.json").read_text())["bindings"])
    except (OSError, ValueError, KeyError):
        return set()


def holds(wait: Wait, tail: StackTail, topology: Topology, since: float) -> tuple[bool, str]:
    """(does the condition hold, what was seen) for the report."""
    if wait.event:
        seen = matching_events(wait, tail.events, since)
        return seen >= wait.count, f"{seen} seen"
    key = listener_key(wait, topology)
    if key is None:
        return False, f"no pod named {wait.listener.rpartition(':')[0]!r} in the topology"  # type: ignore[union-attr]
    present = key in bound_now(tail.state_dir)
    return present == wait.bound, f"{key} is {'bound' if present else 'not bound'}"


async def wait_until(wait: Wait, tail: StackTail, topology: Topology, since: float) -> str | None:
    """None once the condition holds; else, after the timeout, what was seen instead."""
    state: dict[str, Any] = {}

    def check() -> bool:
        ok, state["seen"] = holds(wait, tail, topology, since)
        return ok

    if await tail.wait_for(check, wait.timeout):
        return None
    return f"expected {wait.describe()} within {wait.timeout:g}s, but {state.get('seen', 'nothing was seen')}"
