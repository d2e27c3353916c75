"""Faults a scenario injects into a running local stack, seeded so a replay repeats them exactly.

Process faults act on the launcher (SIGKILL a pod, restart it, scale a role to zero and back, stop and
start DNS); link faults are written to <state>/faults.json, which every component's Context consults
when it dials or resolves (latency, and dropped connections that time out as a dead link would);
`expire` swaps a Secret to a certificate whose validity ended yesterday; `pod-cert` makes a pod serve a
certificate for the wrong name or from another CA.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from certs.profiles import PUBLIC, STACK, frontend_profile, grpc_profile, invocation_profile
from sim.errors import ScenarioError
from sim.model.topology import NATS_ROLE

if TYPE_CHECKING:
    from certs.store import CertStore
    from sim.model.topology import Topology

FAULTS_FILE = "faults.json"


@dataclass(frozen=True)
class LinkFault:
    source: str  # cluster whose dials are affected, e.g. "ncpsim-compute-1"
    target: str  # virtual IP or CIDR the dials go to, e.g. "10.100.0.10" (the proxy's LB)
    latency_ms: int = 0
    drop: float = 0.0  # probability that a connection attempt or query is lost
    timeout_ms: int = 1000  # how long a dropped attempt hangs before it times out

    def applies(self, cluster: str, ip: str) -> bool:
        return cluster == self.source and ipaddress.ip_address(ip) in ipaddress.ip_network(self.target)


@dataclass
class LinkState:
    """What components read: the link faults in force (hot-reloaded by mtime)."""

    links: list[LinkFault] = field(default_factory=list)

    def matching(self, cluster: str, ip: str) -> LinkFault | None:
        return next((f for f in self.links if f.applies(cluster, ip)), None)


def load_links(state_dir: Path, cache: dict[str, Any]) -> LinkState:
    path = cache.setdefault("path", os.path.join(state_dir, FAULTS_FILE))
    try:
        stamp = os.stat(path).st_mtime_ns  # before every dial, lookup and kept-alive request: no pathlib
    except FileNotFoundError:
        return LinkState()
    if cache.get("stamp") != stamp:
        raw = json.loads(Path(path).read_text())
        cache.update(stamp=stamp, state=LinkState([LinkFault(**link) for link in raw.get("links", [])]))
    return cache["state"]


def save_links(state_dir: Path, links: list[LinkFault]) -> None:
    # A name of its own per writer (O_EXCL, no link followed): two `invoke fault link` at once no longer
    # replace each other's temporary file away (FileNotFoundError, a traceback).
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=f".{FAULTS_FILE}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps({"links": [asdict(link) for link in links]}, indent=2))
    os.replace(tmp, state_dir / FAULTS_FILE)


def link_delay(fault: LinkFault | None, rng: random.Random) -> tuple[float, bool]:
    """(seconds to wait, dropped?) for one dial over a faulty link (pure)."""
    if fault is None:
        return 0.0, False
    if fault.drop and rng.random() < fault.drop:
        return fault.timeout_ms / 1000, True
    return fault.latency_ms / 1000, False


EXPIRABLE = {
    "frontend": lambda wd: frontend_profile(wd, STACK),
    "public-frontend": lambda wd: frontend_profile(wd, PUBLIC),
    "invocation": lambda wd: invocation_profile(),
    "grpc-proxy": lambda wd: grpc_profile(),
}


POD_CERTIFICATES = {"invocation": invocation_profile, "grpc-proxy": grpc_profile}


def misissue_pod_certificate(store: CertStore, spec: dict[str, Any]) -> str:
    """The pod serves a certificate for other names or from another CA; the Secret's ca.crt (what the proxy
    verifies against) stays, so the proxy's upstream handshake fails with CERTIFICATE_VERIFY_FAILED."""
    from certs.profiles import Profile
    from certs.volume import load_secret, write_secret

    which = spec.get("pod")
    if which not in POD_CERTIFICATES:
        raise ScenarioError(f"pod-cert: pod {which!r}; choose one of {', '.join(POD_CERTIFICATES)}")
    right = POD_CERTIFICATES[which]()
    names, issuer = tuple(spec.get("names") or right.identities), spec.get("issuer", STACK)
    if names == right.identities and issuer == STACK:
        raise ScenarioError("pod-cert: give names or an issuer that differ from the right certificate's")
    scratch = store.issue(Profile(f"fault-{right.secret}", names, issuer))
    crt, key, _ = load_secret(scratch)
    _, _, trusted = load_secret(store.secret_dir(right.secret))
    write_secret(store.secret_dir(right.secret), crt, key, trusted)
    shutil.rmtree(scratch, ignore_errors=True)
    return f"{which} pod certificate replaced by one for {', '.join(names)} from the {issuer} CA"


def expire_certificate(store: CertStore, which: str, worker_domain: str) -> str:
    if which not in EXPIRABLE:
        raise ScenarioError(f"expire: {which!r}; choose one of {', '.join(EXPIRABLE)}")
    now = datetime.now(UTC)
    store.issue(
        EXPIRABLE[which](worker_domain),
        not_before=now - timedelta(days=30),
        not_after=now - timedelta(days=1),
    )
    said = f"{which} certificate replaced by one that expired yesterday"
    if which in ("frontend", "public-frontend"):
        # What a user poking a warmed-up stack would otherwise take for the fault not working.
        said += "; workers' kept-alive connections keep their session, new handshakes fail"
    return said


class Components(Protocol):
    """Process control a backend offers fault steps (the local backend's processes; not k3d yet)."""

    def running(self) -> dict[str, int]: ...
    def kill(self, name: str) -> int: ...
    def restart(self, name: str) -> None: ...
    def stop(self, name: str) -> None: ...


class FaultTarget(Protocol):
    """What a fault step needs of a running stack (clusters.stack.Stack has it)."""

    state_dir: Path

    @property
    def topology(self) -> Topology: ...

    @property
    def components(self) -> Components | None: ...


class FaultInjector:
    """Applies one fault step to a running stack and says what it did."""

    def __init__(self, stack: FaultTarget, rng: random.Random):
        self.stack, self.rng = stack, rng

    ACTIONS = (
        "kill",
        "restart",
        "scale",
        "stop",
        "start",
        "link",
        "clear-links",
        "expire",
        "pod-cert",
        "rollout",
    )

    def apply(self, spec: dict[str, Any]) -> str:
        ((action, arg),) = spec.items()
        if action not in self.ACTIONS:
            raise ScenarioError(f"fault: unknown action {action!r}; use {', '.join(self.ACTIONS)}")
        return getattr(self, "_" + action.replace("-", "_"))(arg)

    @property
    def processes(self) -> Components:
        components = self.stack.components
        if components is None:
            raise ScenarioError(
                "fault: this backend offers no process control; "
                "kill, restart, stop, start and scale need the local backend"
            )
        return components

    def _kill(self, name: str) -> str:
        self._check_running(name)
        pid = self.processes.kill(name)
        return f"SIGKILL {name} (pid {pid})"

    def _restart(self, name: str) -> str:
        self.processes.restart(name)
        if name in self.stack.topology.members(NATS_ROLE):
            return f"restarted {name}; {self._nats_catch_up(name)}"
        return f"restarted {name}"

    def _nats_catch_up(self, name: str) -> str:
        """A restarted NATS server, waited for until its JetStream is current (sim.pods.nats.cluster)."""
        from sim.model.netmap import LOOPBACK, NetMap
        from sim.pods.nats.cluster import catch_up
        from sim.protocols.wire import NATS_MONITOR_PORT

        topology = self.stack.topology
        bindings = NetMap(**json.loads((self.stack.state_dir / "netmap.json").read_text())).bindings
        running = self.processes.running()
        monitors = {
            server.name: (LOOPBACK, bindings[server.address(NATS_MONITOR_PORT)])
            for server in topology.nats_servers
            if server.name in running and server.address(NATS_MONITOR_PORT) in bindings
        }
        return catch_up(name, monitors, len(topology.nats_servers)).describe()

    def _rollout(self, role: str) -> str:
        """`kubectl rollout restart statefulset/nats`: one pod at a time, in reverse ordinal order, each
        ready (and caught up) before the next, so a majority keeps running throughout."""
        if role != NATS_ROLE:
            raise ScenarioError(
                f"rollout: {role!r}; only the nats StatefulSet rolls here (restart a Deployment's pods "
                "one by one with restart)"
            )
        said = [self._restart(name) for name in reversed(self.stack.topology.members(role))]
        return f"rolled out {role} in reverse ordinal order: " + "; ".join(said)

    def _stop(self, name: str) -> str:
        self.processes.stop(name)
        if name == "resolver":
            return f"stopped {name}; workers with a kept-alive connection to the proxy need no lookup"
        return f"stopped {name}"

    def _start(self, name: str) -> str:
        return self._restart(name).replace("restarted", "started")

    def _scale(self, arg: dict[str, Any]) -> str:
        role, replicas = arg["role"], int(arg["replicas"])
        pods = self.stack.topology.members(role)  # a StatefulSet scales down from its highest ordinal
        for name in pods[replicas:]:
            self.processes.stop(name)
        started = [name for name in pods[:replicas] if name not in self.processes.running()]
        for name in started:
            self.processes.restart(name)
        said = f"scaled {role} to {replicas} of {len(pods)} replicas"
        if role == NATS_ROLE and started:
            said += f"; {self._nats_catch_up(started[-1])}"
        return said

    def _link(self, arg: dict[str, Any]) -> str:
        fault = LinkFault(
            source=arg["from"],
            target=arg["to"],
            latency_ms=int(arg.get("latencyMs", 0)),
            drop=float(arg.get("drop", 0.0)),
            timeout_ms=int(arg.get("timeoutMs", 1000)),
        )
        current = load_links(self.stack.state_dir, {}).links
        save_links(self.stack.state_dir, [*current, fault])
        return f"link {fault.source} -> {fault.target}: +{fault.latency_ms} ms, drop {fault.drop:.0%}"

    def _clear_links(self, _arg: Any) -> str:
        save_links(self.stack.state_dir, [])
        return "links healed"

    def _expire(self, which: str) -> str:
        from certs.store import CertStore  # trustme and cryptography: only when a fault needs them

        return expire_certificate(
            CertStore(self.stack.state_dir / "certs"), which, self.stack.topology.worker_domain
        )

    def _pod_cert(self, spec: dict[str, Any]) -> str:
        from certs.store import CertStore

        if not isinstance(spec, dict):
            raise ScenarioError("pod-cert: give {pod: invocation|grpc-proxy, names: [...], issuer: ...}")
        return misissue_pod_certificate(CertStore(self.stack.state_dir / "certs"), spec)

    def _check_running(self, name: str) -> None:
        running = self.processes.running()
        if name not in running:
            raise ScenarioError(
                f"fault: no running component {name!r}; running: {', '.join(sorted(running))}"
            )
