"""Faults a scenario injects into a running local stack, seeded so a replay repeats them exactly.

Process faults act on the backend's processes (SIGKILL a pod, restart it, scale a role to zero and back,
stop and start DNS); link faults go to <state>/faults.json, which every component reads (sim.runtime.links);
`expire` swaps a Secret to a certificate whose validity ended yesterday; `pod-cert` makes a pod serve a
certificate for the wrong name or from another CA. Every argument is checked against the stack's topology
first (scenarios.fault_args): nothing is reported done that was not.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from certs.profiles import PUBLIC, STACK, frontend_profile, grpc_profile, invocation_profile
from clusters.stack import Components
from scenarios.fault_args import (
    POD_CERTIFICATES,
    ClearLinks,
    Expire,
    PodCert,
    ProcessFault,
    Rollout,
    Scale,
    parse_fault,
)
from sim.errors import ScenarioError
from sim.model.parts import NATS_ROLE
from sim.runtime.links import LinkFault, load_links, save_links

if TYPE_CHECKING:
    from certs.store import CertStore
    from sim.model.topology import Topology

# What stopping a running NATS pod does first, as the chart's preStop hook (clusters.local.launcher)
LAME_DUCK = " after its lame duck (leaderships handed over, clients moved to the other servers)"
# What ncpsim's rollout waits for that the chart's does not (sim.nats.cluster says why), said where it acts.
OPERATORS_WAIT = (
    "each next server stopped only once every stream's and consumer's leader saw the others caught up, as an "
    "operator would wait; the chart's readiness probe does not, and a handover to a server still catching up "
    "leaves that stream without a leader for an election (4-9 s)"
)
EXPIRABLE = {
    "frontend": lambda wd: frontend_profile(wd, STACK),
    "public-frontend": lambda wd: frontend_profile(wd, PUBLIC),
    "invocation": lambda wd: invocation_profile(),
    "grpc-proxy": lambda wd: grpc_profile(),
}


def misissue_pod_certificate(store: CertStore, fault: PodCert) -> str:
    """The pod serves a certificate for other names or from another CA; the Secret's ca.crt (what the proxy
    verifies against) stays, so the proxy's upstream handshake fails with CERTIFICATE_VERIFY_FAILED."""
    from certs.profiles import Profile
    from certs.volume import load_secret, write_secret

    right = POD_CERTIFICATES[fault.pod]()
    scratch = store.issue(Profile(f"fault-{right.secret}", fault.names, fault.issuer))
    crt, key, _ = load_secret(scratch)
    _, _, trusted = load_secret(store.secret_dir(right.secret))
    write_secret(store.secret_dir(right.secret), crt, key, trusted)
    shutil.rmtree(scratch, ignore_errors=True)
    return (
        f"{fault.pod} pod certificate replaced by one for {', '.join(fault.names)} from the {fault.issuer} CA"
    )


def expire_certificate(store: CertStore, which: str, worker_domain: str) -> str:
    """`which` is one of EXPIRABLE: scenarios/schema.json checked the step's choice."""
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


class FaultTarget(Protocol):
    """What a fault step needs of a running stack (clusters.stack.Stack has it)."""

    @property
    def state_dir(self) -> Path: ...

    @property
    def topology(self) -> Topology: ...

    @property
    def components(self) -> Components | None: ...


class FaultInjector:
    """Applies one fault step to a running stack and says what it did."""

    def __init__(self, stack: FaultTarget, rng: random.Random):
        self.stack, self.rng = stack, rng

    def apply(self, spec: Mapping[str, Any]) -> str:
        """Check the step's `{ACTION: ARGUMENT}` against the stack's topology, then act on the stack."""
        fault = parse_fault(spec, self.stack.topology)
        if isinstance(fault, ProcessFault):
            act: Callable[[str], str] = getattr(self, "_" + fault.action)  # _kill, _restart, _stop, _start
            return act(fault.component)
        if isinstance(fault, Scale):
            return self._scale(fault)
        if isinstance(fault, LinkFault):
            return self._link(fault)
        if isinstance(fault, ClearLinks):
            save_links(self.stack.state_dir, [])
            return "links healed"
        if isinstance(fault, Rollout):
            return self._rollout(fault)
        if isinstance(fault, Expire):
            return expire_certificate(self._certs(), fault.which, self.stack.topology.worker_domain)
        return misissue_pod_certificate(self._certs(), fault)

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
        nats = name in self.stack.topology.members(NATS_ROLE)
        drained = nats and name in self.processes.running()  # the backend runs its preStop: lame duck
        self.processes.restart(name)
        if nats:
            return f"restarted {name}{LAME_DUCK if drained else ''}; {self._nats_catch_up(name)}"
        return f"restarted {name}"

    def _nats_catch_up(self, name: str) -> str:
        """A restarted NATS server, waited for until its JetStream is current (sim.nats.cluster)."""
        from sim.model.netmap import LOOPBACK, NetMap
        from sim.nats.cluster import catch_up
        from sim.wire import NATS_MONITOR_PORT

        topology = self.stack.topology
        bindings = NetMap(**json.loads((self.stack.state_dir / "netmap.json").read_text())).bindings
        running = self.processes.running()
        monitors = {
            server.name: (LOOPBACK, bindings[server.address(NATS_MONITOR_PORT)])
            for server in topology.nats_servers
            if server.name in running and server.address(NATS_MONITOR_PORT) in bindings
        }
        return catch_up(name, monitors, len(topology.nats_servers)).describe()

    def _rollout(self, fault: Rollout) -> str:
        """`kubectl rollout restart statefulset/nats`: one pod at a time, in reverse ordinal order, each
        ready (and caught up) before the next, so a majority keeps running throughout."""
        said = [self._restart(name) for name in reversed(fault.pods)]
        wait = f" ({OPERATORS_WAIT})" if fault.role == NATS_ROLE and len(fault.pods) > 1 else ""
        return f"rolled out {fault.role} in reverse ordinal order{wait}: " + "; ".join(said)

    def _stop(self, name: str) -> str:
        drained = name in self.stack.topology.members(NATS_ROLE) and name in self.processes.running()
        self.processes.stop(name)
        if drained:
            return f"stopped {name}{LAME_DUCK}"
        if name == "resolver":
            return f"stopped {name}; workers with a kept-alive connection to the proxy need no lookup"
        return f"stopped {name}"

    def _start(self, name: str) -> str:
        return self._restart(name).replace("restarted", "started")

    def _scale(self, fault: Scale) -> str:
        """Pods go and come together: the nats chart's StatefulSet has Parallel pod management (no ordinal
        order, none waits for another to be ready), and the other roles are Deployments."""
        self.processes.stop(*fault.pods[fault.replicas :])
        started = [name for name in fault.pods[: fault.replicas] if name not in self.processes.running()]
        if started:
            self.processes.restart(*started)
        said = f"scaled {fault.role} to {fault.replicas} of {len(fault.pods)} replicas"
        if fault.role == NATS_ROLE and started:
            said += f"; {self._nats_catch_up(started[-1])}"
        return said

    def _link(self, fault: LinkFault) -> str:
        current = load_links(self.stack.state_dir, {}).links
        save_links(self.stack.state_dir, [*current, fault])
        said = f"link {fault.source} -> {fault.target} ({fault.protocol}): +{fault.latency_ms} ms"
        return (
            said
            + f", drop {fault.drop:.0%}"
            + (f" (lost attempts hang {fault.timeout_ms} ms)" if fault.drop else "")
        )

    def _certs(self) -> CertStore:
        from certs.store import CertStore  # trustme and cryptography: only when a fault needs them

        return CertStore(self.stack.state_dir / "certs")

    def _check_running(self, name: str) -> None:
        running = self.processes.running()
        if name not in running:
            raise ScenarioError(
                f"fault: no running component {name!r}; running: {', '.join(sorted(running))}"
            )
