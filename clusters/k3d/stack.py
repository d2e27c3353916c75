"""The k3d backend as a Stack: the clusters brought up, the pods as the cluster placed them, port-forwards
to their client ports, their logs copied into the state folder, and redeploys as re-rendered manifests.

The replay engine drives this Stack as it drives the local one (scenarios.engine). Never run against
live clusters on the machine it was written on; see clusters.k3d.live.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from certs.store import CertStore
from clusters.certificates import with_stack_secret
from clusters.k3d.backend import Backend, bring_up, check_reachable, teardown
from clusters.k3d.engine import DockerEngine, SdkEngine
from clusters.k3d.live import (
    LogSync,
    PortForward,
    fresh_records,
    live_topology,
    start_forwards,
    write_netmap,
)
from clusters.k3d.preflight import preflight
from clusters.k3d.runner import CommandRunner
from clusters.k3d.state import cert_material, stack_state
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
from clusters.render.nats import one_server
from clusters.render.text import dump_all
from clusters.stack import COMMAND_TURN, Endpoint, Endpoints, Json, build_status, log_files
from clusters.state import StackLock, write_file
from sim.errors import ScenarioError
from sim.model.parts import CONTROL_CLUSTER
from sim.model.topology import Topology
from sim.wire import NAMESPACE


def _is_worker(obj: Json) -> bool:
    template = obj.get("spec", {}).get("template", {}).get("metadata", {})
    return bool(template.get("labels", {}).get("app.kubernetes.io/component") == WORKER_COMPONENT)


GROUPS: dict[str, Callable[[Json, bool], bool]] = {
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
    """Redeploys as re-rendered manifests, applied, with a rollout restart so new pods start."""

    backend: Backend
    scenario_topology: Topology  # the Topology as rendered (virtual pods), values updated by set_values
    addresses: Addresses

    def redeploy(self, topology: Topology, what: str) -> None:
        # the values and the function pods as the replay now has them (a workers redeploy makes new pods)
        rendered = replace(self.scenario_topology, values=topology.values, workers=topology.workers)
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


class K3dStack:
    """The running clusters, as this process sees them: live pods, port-forwards and log copying."""

    backend = "k3d"

    def __init__(self, k3d: Backend, scenario_topology: Topology, addresses: Addresses | None = None):
        self.k3d, self.name, self.state_dir = k3d, scenario_topology.stack, k3d.state
        self.scenario_topology = scenario_topology
        self.topology = scenario_topology
        self.forwards: list[PortForward] = []
        self.log_sync: LogSync | None = None
        self.addresses = addresses
        self.lock = StackLock(self.state_dir)

    def changing(self) -> AbstractContextManager[None]:
        return self.lock.held(wait=COMMAND_TURN)

    def attach(self, scenario: str) -> K3dStack:
        """Find the live pods, forward their client ports, copy their logs, write status.json."""
        fresh_records(self.state_dir)
        self.topology = self._forward(live_topology(self.k3d.runner, self.scenario_topology))
        status = build_status(self.backend, self.topology, self.state_dir, scenario, endpoints(self.topology))
        write_file(self.state_dir / "status.json", json.dumps(status, indent=2))
        sync_runner = CommandRunner(env=self.k3d.runner.env, echo=None)  # silent: it polls every half second
        self.log_sync = LogSync(sync_runner, self.state_dir, [c.name for c in self.topology.clusters]).start()
        return self

    def _forward(self, live: Topology) -> Topology:
        for forward in self.forwards:
            forward.stop()
        self.forwards = start_forwards(self.k3d.runner, live)
        write_file(self.state_dir / "topology.json", live.to_json())
        write_netmap(self.state_dir, live, self.forwards)
        return live

    def redeploy(self, topology: Topology, what: str) -> Topology:
        addresses = self.addresses or self.k3d.addresses(self.scenario_topology)
        ClusterLauncher(self.k3d, self.scenario_topology, addresses).redeploy(topology, what)
        self.scenario_topology = replace(
            self.scenario_topology, values=topology.values, workers=topology.workers
        )
        if what in ("pods", "all"):  # new pods, new IPs: the forwards follow them
            self.topology = self._forward(live_topology(self.k3d.runner, self.scenario_topology))
        else:
            self.topology = replace(self.topology, values=topology.values, workers=topology.workers)
        return self.topology

    def status(self) -> Json | None:
        path = self.state_dir / "status.json"
        return json.loads(path.read_text()) if path.exists() else None

    def logs(self) -> dict[str, str]:
        return log_files(self.state_dir)

    def close(self) -> None:
        if self.log_sync is not None:
            self.log_sync.stop()  # and one last copy
            self.log_sync = None
        for forward in self.forwards:
            forward.stop()
        self.forwards = []

    def down(self, purge: bool = False) -> list[str]:
        self.close()
        # The engine may already be gone: only the commands are needed to delete clusters.
        preflight(self.k3d.runner, self.k3d.engine, tools=("docker", "k3d"), with_engine=False)
        return teardown(self.k3d, purge)

    @property
    def components(self) -> None:
        return None  # fault steps that act on processes are the local backend's


def endpoints(topology: Topology) -> Endpoints:
    """The load balancer's host ports; cluster DNS is not published on the laptop (ask it from inside,
    e.g. `kubectl run ... dig`); logs are `kubectl logs` commands and the copies in the state folder."""
    cp = kube_context(CONTROL_CLUSTER)
    logs = {"worker-callback-proxy": f"kubectl --context {cp} -n {NAMESPACE} logs deploy/{PROXY_NAME}"}
    return Endpoints(
        proxy_http=Endpoint("127.0.0.1", HTTP_HOST_PORT),
        proxy_h3=Endpoint("127.0.0.1", H3_HOST_PORT),
        dns={c.name: Endpoint(None, None, {"context": kube_context(c.name)}) for c in topology.clusters},
        logs=logs,
    )


def status(topology: Topology, state: Path, scenario: str) -> Json:
    """`ncpsim status --json` for the k3d backend (the shared contract, the load balancer's ports)."""
    return build_status(K3dStack.backend, topology, state, scenario, endpoints(topology))


class K3dBackend:
    """Real k3d clusters through the `k3d`, `kubectl` and `docker` commands (and the docker SDK)."""

    name = "k3d"

    def __init__(
        self,
        runner: CommandRunner | None = None,
        engine: DockerEngine | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.runner, self.engine, self.sleep = runner, engine, sleep

    def _steps(self, stack: str) -> Backend:
        return Backend(
            self.runner or CommandRunner(), self.engine or SdkEngine(), stack_state(stack), self.sleep
        )

    def up(self, topology: Topology, scenario: str) -> K3dStack:
        """preflight -> clusters, image, manifests, rollouts (rolled back on failure) -> attach."""
        k3d = self._steps(topology.stack)
        preflight(k3d.runner, k3d.engine)
        check_reachable(topology)
        material = cert_material(k3d.state / "certs", topology)
        topology = with_stack_secret(CertStore(k3d.state / "certs"), topology)
        # The values as applied: a workerCallbackCaPem marker is PEM text from here on, so a redeploy after a
        # CA rotation renders the PEM the customer pasted, not the new CA (as the local backend does).
        topology = topology.with_ca_pem(
            lambda issuer: (k3d.state / "certs" / "ca" / issuer / "ca.crt").read_text()
        )
        topology, notice = one_server(topology)
        if notice:
            print(notice, file=sys.stderr)
        bring_up(k3d, topology, material)
        return K3dStack(k3d, topology).attach(scenario)

    def attach(self, stack: str) -> K3dStack:
        k3d = self._steps(stack)
        saved = k3d.state / "topology.json"
        topology = (
            Topology.load(k3d.state)
            if saved.exists()
            else Topology(stack=stack, worker_domain="", values={}, clusters=(), pods=())
        )
        return K3dStack(k3d, topology)

    def interruptible(self, stack: str) -> AbstractContextManager[None]:
        return (
            nullcontext()
        )  # `bring_up` rolls back itself; clusters that are up stay up, as with Ctrl-C on Helm
