"""A scenario's replay on the k3d clusters: the stack object the engine drives (state folder and a
launcher whose `redeploy` re-renders and re-applies), the live topology, and the report.

Never run against live clusters on the machine it was written on; see clusters.k3d.live.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clusters.k3d.backend import Backend
from clusters.k3d.live import (
    LogSync,
    PortForward,
    fresh_records,
    live_topology,
    run_engine,
    start_forwards,
    write_netmap,
)
from clusters.k3d.runner import CommandRunner
from clusters.k3d.state import cert_material
from clusters.render.bundle import Addresses, manifests_by_cluster
from clusters.render.layout import (
    ENVOY_CONFIGMAP,
    GRPC_DEPLOYMENT,
    H3_HOST_PORT,
    HTTP_HOST_PORT,
    INVOCATION_DEPLOYMENT,
    PROXY_NAME,
    TOPOLOGY_CONFIGMAP,
    WORKER_COMPONENT,
    kube_context,
)
from clusters.render.text import dump_all
from scenarios.model import Scenario
from sim.errors import ScenarioError
from sim.model.topology import CONTROL_CLUSTER, Topology
from sim.protocols.wire import NAMESPACE, PROXY_HTTP_PORT

Json = dict[str, Any]


def _is_worker(obj: Json) -> bool:
    template = obj.get("spec", {}).get("template", {}).get("metadata", {})
    return template.get("labels", {}).get("app.kubernetes.io/component") == WORKER_COMPONENT


GROUPS = {
    "proxy": lambda o, compute: not compute and o["metadata"]["name"] in (ENVOY_CONFIGMAP, PROXY_NAME),
    "pods": lambda o, compute: (
        not compute and o["metadata"]["name"] in (TOPOLOGY_CONFIGMAP, INVOCATION_DEPLOYMENT, GRPC_DEPLOYMENT)
    ),
    "workers": lambda o, compute: compute or _is_worker(o),
    "all": lambda o, compute: True,
}


def select(objects: list[Json], what: str, compute: bool) -> list[Json]:
    """The objects a redeploy of `what` re-applies in one cluster (as a Helm upgrade of that part would)."""
    if what not in GROUPS:
        raise ScenarioError(f"redeploy {what!r}: choose one of {', '.join(GROUPS)}")
    return [o for o in objects if GROUPS[what](o, compute)]


@dataclass
class ClusterLauncher:
    """What the engine calls `stack.launcher`: redeploys become re-rendered manifests, applied."""

    backend: Backend
    scenario_topology: Topology  # the Topology as rendered (virtual pods), values updated by set_values
    addresses: Addresses

    def redeploy(self, topology: Topology, what: str) -> None:
        rendered = replace(self.scenario_topology, values=topology.values)
        material = cert_material(self.backend.state / "certs", rendered)
        for cluster, objects in manifests_by_cluster(rendered, material, self.addresses).items():
            chosen = select(objects, what, compute=cluster != CONTROL_CLUSTER)
            if not chosen:
                continue
            self.backend.runner.run(
                "kubectl", "--context", kube_context(cluster), "apply", "-f", "-", input_text=dump_all(chosen)
            )
            deployments = [
                (o["metadata"]["namespace"], o["metadata"]["name"])
                for o in chosen
                if o["kind"] == "Deployment"
            ]
            for namespace, name in deployments:  # new pods even when nothing in the spec changed
                self.backend.kubectl(cluster, "-n", namespace, "rollout", "restart", f"deployment/{name}")
            self.backend.wait_rollouts(cluster, deployments)


@dataclass
class ClusterStack:
    """The engine's view of a stack: a name, a state folder and a launcher."""

    name: str
    state_dir: Path
    launcher: ClusterLauncher


def cluster_replay_class() -> type:
    from scenarios.engine import Replay

    class ClusterReplay(Replay):
        """Replay whose pods come back with new IPs after a pod redeploy (port-forwards follow)."""

        def __init__(self, scenario: Scenario, stack: ClusterStack, topology: Topology, session: Session):
            super().__init__(scenario, stack, topology)
            self.session = session

        def redeploy(self, what: str) -> str:
            note = super().redeploy(what)
            if what in ("pods", "all"):
                self.topology = self.session.refresh(self.topology)
                self.facts = replace(self.facts, pod_ips={p.name: p.ip for p in self.topology.pods})
            return note

    return ClusterReplay


@dataclass
class Session:
    backend: Backend
    forwards: list[PortForward]

    def refresh(self, topology: Topology) -> Topology:
        for forward in self.forwards:
            forward.stop()
        live = live_topology(self.backend.runner, topology)
        self.forwards = start_forwards(self.backend.runner, live)
        write_netmap(self.backend.state, live, self.forwards)
        return live

    def close(self) -> None:
        for forward in self.forwards:
            forward.stop()


def status(topology: Topology, state: Path, scenario: str) -> Json:
    """`invoke status --json` for the k3d backend: the same keys; proxy ports are the load balancer's."""
    wd = topology.worker_domain
    cp = kube_context(CONTROL_CLUSTER)
    return {
        "backend": "k3d",
        "stack": topology.stack,
        "scenario": scenario,
        "workerDomain": wd,
        "stateDir": str(state),
        "proxy": {
            "http": {
                "host": "127.0.0.1",
                "port": HTTP_HOST_PORT,
                "name": f"invocation.{wd}",
                "url": f"https://invocation.{wd}:{PROXY_HTTP_PORT}",
            },
            "h3": {
                "host": "127.0.0.1",
                "port": H3_HOST_PORT,
                "name": f"*.{wd}",
                "url": f"https://<dashed-pod-ip>.{wd}",
            },
        },
        # Cluster DNS is not published on the laptop: ask it from inside, e.g. kubectl run ... dig.
        "dns": {
            c.name: {"host": None, "port": None, "context": kube_context(c.name)} for c in topology.clusters
        },
        "ca": {
            "stack": str(state / "certs" / "ca" / "stack" / "ca.crt"),
            "public": str(state / "certs" / "ca" / "public" / "ca.crt"),
        },
        "pods": [
            {
                "name": p.name,
                "role": p.role,
                "cluster": p.cluster,
                "ip": p.ip,
                "target": f"http://{p.fqdn}:8443"
                if p.role == "invocation"
                else f"https://{p.fqdn.split('.')[0]}.{wd}",
            }
            for p in topology.pods
        ],
        "logs": {"worker-callback-proxy": f"kubectl --context {cp} -n {NAMESPACE} logs deploy/{PROXY_NAME}"},
        "events": str(state / "events"),
    }


def run_replay(backend: Backend, scenario: Scenario, topology: Topology) -> int:
    """Replay on the running clusters; print the report; 0 when every expectation holds."""
    from scenarios.engine import ScenarioResult, write_artifacts
    from scenarios.report import render_text

    state, started = backend.state, time.monotonic()
    fresh_records(state)
    live = live_topology(backend.runner, topology)
    (state / "topology.json").write_text(live.to_json())
    result = ScenarioResult(scenario, status=status(live, state, scenario.name))  # reports draw pods from it
    (state / "status.json").write_text(json.dumps(result.status, indent=2))
    session = Session(backend, start_forwards(backend.runner, live))
    try:
        write_netmap(state, live, session.forwards)
        launcher = ClusterLauncher(backend, topology, backend.addresses(topology))
        stack = ClusterStack(topology.stack, state, launcher)
        sync_runner = CommandRunner(env=backend.runner.env, echo=None)  # silent: it polls every half second
        with LogSync(sync_runner, state, [c.name for c in topology.clusters]):
            replay = cluster_replay_class()(scenario, stack, live, session)
            result.steps = run_engine(replay)
    except ScenarioError as exc:
        result.error = str(exc)
    finally:
        session.close()
        result.elapsed = time.monotonic() - started
    write_artifacts(result, state)
    print(render_text(result), end="")
    return 0 if result.ok else 1
