"""The Stack: what every backend's ``up(topology)`` returns, and the one `ncpsim status` contract.

scenarios/ and tasks/ drive a Stack without knowing its backend: the replay engine reads the state
folder (events, access log, network map), redeploys through the Stack, and asks it for process
control only for fault steps. Each backend supplies the endpoints it publishes; `build_status` turns
them into the contract of DESIGN.md section 5, so the backends cannot drift apart.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from sim.model.assumptions import assumptions
from sim.model.topology import Topology
from sim.model.values import proxy_settings
from sim.wire import (
    GRPC_CALLBACK_PORT,
    GRPC_SUFFIX,
    INVOCATION_HTTP_PORT,
    NATS_MONITOR_PORT,
    NATS_PORT,
    invocation_port,
)

Json = dict[str, Any]
COMMAND_TURN = 60.0  # how long a command that changes a stack waits for the one before it to finish


class Components(Protocol):
    """Process control a backend offers fault steps (the local backend's processes; not k3d yet)."""

    def running(self) -> dict[str, int]: ...
    def kill(self, name: str) -> int: ...
    def restart(self, *names: str) -> None: ...  # stopped, then started together
    def stop(self, *names: str) -> None: ...  # together (NATS servers' lame ducks overlap)


class Stack(Protocol):
    """A running stack, whatever runs it. Its four names are read-only here (a backend may compute them:
    the local stack reads its topology from the state folder on each use), so both backends' stacks are
    Stacks for mypy (tests/test_seams.py)."""

    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def topology(self) -> Topology:
        """As running now: k3d pods carry the IPs the cluster gave them."""
        ...

    def redeploy(self, topology: Topology, what: str) -> Topology:
        """Replace workers|proxy|pods|all as a rollout would, with `topology`'s values; the new topology."""
        ...

    def status(self) -> Json | None: ...
    def logs(self) -> dict[str, str]: ...
    def down(self, purge: bool = False) -> list[str]: ...

    def close(self) -> None:
        """Let go of what this process holds for the stack (port-forwards, log copying); it keeps running."""
        ...

    def changing(self) -> AbstractContextManager[None]:
        """Held by a command that changes the running stack (set, fault, rotate, step): such commands run one
        at a time, in the order they came, each waiting its turn (COMMAND_TURN seconds at most)."""
        ...

    @property
    def components(self) -> Components | None: ...


class Backend(Protocol):
    """What runs stacks: the local processes or the k3d clusters (tasks.cli.backend_named chooses one)."""

    @property
    def name(self) -> str: ...

    def up(self, topology: Topology, scenario: str) -> Stack: ...
    def attach(self, stack: str) -> Stack:
        """The stack of that name as it is (for status, logs and down), running or not."""
        ...

    def interruptible(self, stack: str) -> AbstractContextManager[None]:
        """Around a whole `up` and replay: Ctrl-C or SIGTERM at any moment leaves nothing running."""
        ...


@dataclass(frozen=True)
class Endpoint:
    host: str | None
    port: int | None
    extra: Json = field(default_factory=dict)


@dataclass(frozen=True)
class Endpoints:
    """What a backend publishes on the laptop: the proxy's two fronts, each cluster's DNS, the logs."""

    proxy_http: Endpoint
    proxy_h3: Endpoint
    dns: dict[str, Endpoint]
    logs: dict[str, str]
    nats: Endpoint = Endpoint(
        None, None
    )  # the first NATS server's client port; extra "monitorPort", "servers"


def nats_endpoint(topology: Topology, bindings: dict[str, int], host: str) -> Endpoint:
    """The NATS servers' real client and monitor ports, from the bindings of each pod of the StatefulSet;
    the contract's own host and port are the first server's."""
    servers = [
        {
            "name": s.name,
            "ip": s.ip,
            "host": host,
            "port": bindings.get(s.address(NATS_PORT)),
            "monitor": f"http://{host}:{bindings[s.address(NATS_MONITOR_PORT)]}"
            if s.address(NATS_MONITOR_PORT) in bindings
            else None,
        }
        for s in topology.nats_servers
    ]
    first = topology.nats_servers[0] if servers else None
    port = bindings.get(first.address(NATS_PORT)) if first else None
    monitor = bindings.get(first.address(NATS_MONITOR_PORT)) if first else None
    extra: Json = {"servers": servers, **({"monitorPort": monitor} if monitor else {})}
    return Endpoint(host, port, extra)


def build_status(backend: str, topology: Topology, state: Path, scenario: str, endpoints: Endpoints) -> Json:
    """The `ncpsim status --json` contract of DESIGN.md section 5, for every backend."""
    wd = topology.worker_domain
    settings = proxy_settings(topology.values)
    # The pod targets workers are handed, as the pods hand them out: the worker TLS port unless upstreamTls
    # is off (DESIGN.md section 1); without the proxy, the plaintext port and grpc-proxy's own name.
    port = invocation_port(settings.upstream_tls) if settings.enabled else INVOCATION_HTTP_PORT
    pods = [
        {
            "name": p.name,
            "role": p.role,
            "cluster": p.cluster,
            "ip": p.ip,
            "target": (
                f"http://{p.fqdn}:{port}"
                if p.role == "invocation"
                else f"https://{p.fqdn.split('.')[0]}.{wd}"
                if settings.enabled
                else f"https://{p.fqdn.split('.')[0]}.{GRPC_SUFFIX}:{GRPC_CALLBACK_PORT}"
            ),
        }
        for p in topology.pods
    ]
    return {
        "backend": backend,
        "stack": topology.stack,
        "scenario": scenario,
        "workerDomain": wd,
        "stateDir": str(state),
        "proxy": _proxy_status(topology, endpoints) if settings.enabled else None,
        "dns": {name: {"host": e.host, "port": e.port, **e.extra} for name, e in endpoints.dns.items()},
        "ca": {
            issuer: str(state / "certs" / "ca" / issuer / "ca.crt")
            for issuer in ("stack", "public", "private")
        },
        "pods": pods,
        "nats": _nats_status(topology, endpoints.nats),
        "logs": endpoints.logs,
        "events": str(state / "events"),
        # What ncpsim filled in where the customer's world left a gap (added to the contract, issue 26).
        "assumptions": [a.to_json() for a in assumptions(topology, backend)],
    }


def _proxy_status(topology: Topology, endpoints: Endpoints) -> Json:
    """The proxy's two fronts: real host and port, and the name and URL workers are handed. The HTTP URL is
    global.workerEndpoints.invocationProxyURL when set; the HTTP/3 block names one real pod name too."""
    wd = topology.worker_domain
    url = proxy_settings(topology.values).invocation_proxy_url
    grpc = topology.pods_of("grpc-proxy")
    example = f"{grpc[0].fqdn.split('.')[0]}.{wd}" if grpc else None
    return {
        "http": {
            "host": endpoints.proxy_http.host,
            "port": endpoints.proxy_http.port,
            "name": urlsplit(url).hostname or f"invocation.{wd}",
            "url": url,
        },
        "h3": {
            "host": endpoints.proxy_h3.host,
            "port": endpoints.proxy_h3.port,
            "name": f"*.{wd}",
            "url": f"https://<dashed-pod-ip>.{wd}",
            "example": example,
        },
    }


def _nats_status(topology: Topology, nats: Endpoint) -> Json:
    """``url`` as workers see it (the load balancer's 4222, in front of every server); host/port/monitor
    real (the first server's), None when unpublished; ``servers``: each pod of the StatefulSet, with its
    real client port and monitor (a backend that publishes none lists none)."""
    monitor_port = nats.extra.get("monitorPort")
    return {
        "host": nats.host,
        "port": nats.port,
        "url": f"nats://{topology.bus_lb_ip}:{NATS_PORT}",
        "monitor": f"http://{nats.host}:{monitor_port}" if nats.host and monitor_port else None,
        "servers": list(nats.extra.get("servers", [])),
    }


def log_files(state: Path) -> dict[str, str]:
    return {path.stem: str(path) for path in sorted((state / "logs").glob("*.log"))}
