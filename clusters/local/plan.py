"""Which processes a Topology runs on the local backend, in which phase, and in which order they stop (pure).

One process per pod, per NATS server, per compute cluster hosting workers (its worker host), and one each
for the resolver, the auth callout and the proxy. Phase one is the control plane: it binds its ports and
reports them; phase two, the worker hosts, needs phase one's NATS addresses before it reports ready. A
fault, a redeploy and `ncpsim status` name the processes as this plan does (scenarios.fault_args holds
the same names for faults; tests/test_fault_args.py holds the two together).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sim.errors import BackendError
from sim.model.parts import CONTROL_CLUSTER
from sim.model.topology import Topology

from .zygote import LAUNCH_ORDER

READY_TIMEOUT = 15.0  # per phase; a healthy component is ready in well under a second
SIGN_IN_ALLOWANCE = 0.02  # more seconds per worker of the largest worker host: each signs in to NATS first
NATS_CALLOUT = "nats-auth-callout"  # the auth callout service
NATS_SERVER_NAME = re.compile(r"nats-\d+")  # a pod of the nats StatefulSet: its supervisor and nats-server


@dataclass(frozen=True)
class ProcessSpec:
    kind: str  # the runner `python -m sim.runtime.run KIND` starts
    name: str
    cluster: str


def phase_one(topology: Topology) -> list[ProcessSpec]:
    specs = [ProcessSpec("resolver", "resolver", CONTROL_CLUSTER)]
    specs += [ProcessSpec("nats", server.name, CONTROL_CLUSTER) for server in topology.nats_servers]
    specs.append(ProcessSpec("nats-callout", NATS_CALLOUT, CONTROL_CLUSTER))
    specs += [
        ProcessSpec("invocation" if p.role == "invocation" else "grpc-proxy", p.name, p.cluster)
        for p in topology.pods
    ]
    if topology.proxy_enabled:
        specs.append(ProcessSpec("proxy", "worker-callback-proxy", CONTROL_CLUSTER))
    return specs


def phase_two(topology: Topology) -> list[ProcessSpec]:
    return [ProcessSpec("workers", c.name, c.name) for c in topology.clusters if topology.workers_in(c.name)]


def components(topology: Topology) -> list[ProcessSpec]:
    """Every process the topology runs, phase one first."""
    return phase_one(topology) + phase_two(topology)


def spec_named(topology: Topology, name: str) -> ProcessSpec:
    for spec in components(topology):
        if spec.name == name:
            return spec
    raise BackendError(f"no component named {name!r} in this topology")


def spawn_order(topology: Topology) -> list[tuple[int, ProcessSpec]]:
    """Each component with its phase, in LAUNCH_ORDER by kind (stable within a kind). The zygote loads a
    runner's imports before forking its first component, in the same order. Readiness is still awaited
    phase by phase."""
    specs = [(0, spec) for spec in phase_one(topology)] + [(1, spec) for spec in phase_two(topology)]
    return sorted(specs, key=lambda item: LAUNCH_ORDER.index(item[1].kind))


def ready_timeout(topology: Topology) -> float:
    """How long a start phase may take: a worker host is ready once each of its workers has signed in."""
    largest = max((len(topology.workers_in(c.name)) for c in topology.clusters), default=0)
    return READY_TIMEOUT + SIGN_IN_ALLOWANCE * largest


def redeploy_specs(topology: Topology, what: str) -> list[ProcessSpec]:
    """The processes a redeploy replaces: function workers, the proxy, the control-plane pods, or all."""
    first = phase_one(topology)
    groups = {
        "workers": phase_two(topology),
        "proxy": [s for s in first if s.kind == "proxy"],
        "pods": [s for s in first if s.kind in ("invocation", "grpc-proxy")],
    }
    if what == "all":
        return groups["pods"] + groups["proxy"] + groups["workers"]
    return groups[what]


def stop_order(name: str) -> int:
    """Workers first (they call the others), then the proxy and pods, the NATS servers and DNS last."""
    if name.startswith("ncpsim-compute") or name == CONTROL_CLUSTER:
        return 0
    if NATS_SERVER_NAME.fullmatch(name):
        return 3
    return {"worker-callback-proxy": 1, "resolver": 4}.get(name, 2)
