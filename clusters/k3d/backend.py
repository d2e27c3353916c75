"""The k3d backend's steps: `ncpsim up --backend k3d` and `ncpsim down --backend k3d`.

up = preflight -> shared Docker network -> k3d clusters -> stand-in image (docker SDK build, `k3d image
import`) -> control-plane manifests -> rollouts -> the proxy's and nats-server's load-balancer addresses
-> compute manifests (NATS's selectorless Service, coredns-custom with those addresses, workers) -> CoreDNS
restart when the rewrite changed -> rollouts; clusters.k3d.stack then attaches to what runs (live pods,
port-forwards, logs) and hands the replay engine a Stack.

A second `up` creates nothing that exists (`docker network ls`, `k3d cluster list -o json`) and
re-applies the rest. When a step fails, what this run created (clusters, then the network) is
deleted again, so a failed `up` leaves the laptop as it found it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusters.k3d.engine import DOCKERFILE, DockerEngine, build_context
from clusters.k3d.runner import CommandRunner
from clusters.k3d.state import RENDER_DIR, write_files
from clusters.render.bundle import (
    Addresses,
    k3d_config_path,
    manifest_path,
    manifests_by_cluster,
    render_bundle,
)
from clusters.render.control_plane import CertMaterial
from clusters.render.layout import BUS_NAME, CLUSTER_TIMEOUT, NETWORK, PROXY_NAME, STANDIN_IMAGE, kube_context
from clusters.state import adopt
from clusters.state import purge as purge_state
from sim.errors import BackendError
from sim.model.parts import CONTROL_CLUSTER
from sim.model.topology import Topology
from sim.wire import NAMESPACE

OURS = re.compile(rf"^(?:{re.escape(CONTROL_CLUSTER)}|ncpsim-compute-\d+)$")
LB_ATTEMPTS, LB_INTERVAL = 90, 2.0  # servicelb publishes node IPs within seconds; allow three minutes


@dataclass
class Backend:
    """The k3d backend's steps on one stack, and what this run created (for rollback)."""

    runner: CommandRunner
    engine: DockerEngine
    state: Path
    sleep: Callable[[float], None] = time.sleep
    created: list[tuple[str, str]] = field(default_factory=list)  # ("network"|"cluster", name)

    @property
    def render_dir(self) -> Path:
        return self.state / RENDER_DIR

    def kubectl(self, cluster: str, *args: str, check: bool = True) -> Any:
        return self.runner.run("kubectl", "--context", kube_context(cluster), *args, check=check)

    # -- network and clusters -------------------------------------------------------------------
    def ensure_network(self) -> None:
        names = self.runner.run("docker", "network", "ls", "--format", "{{.Name}}").stdout.split()
        if NETWORK not in names:
            self.runner.run("docker", "network", "create", "--label", "io.ncpsim.managed=true", NETWORK)
            self.created.append(("network", NETWORK))

    def existing_clusters(self) -> set[str]:
        listed = json.loads(self.runner.run("k3d", "cluster", "list", "-o", "json").stdout or "[]")
        return {c["name"] for c in listed}

    def ensure_clusters(self, topology: Topology) -> None:
        existing = self.existing_clusters()
        for cluster in topology.clusters:
            if cluster.name in existing:
                continue
            self.runner.run(
                "k3d", "cluster", "create", "--config", str(self.render_dir / k3d_config_path(cluster.name))
            )
            self.created.append(("cluster", cluster.name))

    def load_image(self, topology: Topology, image: str = STANDIN_IMAGE) -> None:
        self.engine.build(build_context(), DOCKERFILE, image)
        for cluster in topology.clusters:
            self.runner.run("k3d", "image", "import", image, "--cluster", cluster.name)

    # -- manifests --------------------------------------------------------------------------------
    def apply(self, cluster: str) -> str:
        return self.kubectl(cluster, "apply", "-f", str(self.render_dir / manifest_path(cluster))).stdout

    def wait_rollouts(self, cluster: str, deployments: list[tuple[str, str]]) -> None:
        for namespace, name in deployments:
            self.kubectl(
                cluster,
                "-n",
                namespace,
                "rollout",
                "status",
                f"deployment/{name}",
                f"--timeout={CLUSTER_TIMEOUT}",
            )

    def lb_address(self, service: str) -> str:
        """The LoadBalancer ingress IP k3s's servicelb gives a control-plane Service: the server
        node's address on the shared network, which compute clusters can route to."""
        for _ in range(LB_ATTEMPTS):
            raw = self.kubectl(
                CONTROL_CLUSTER, "-n", NAMESPACE, "get", "service", service, "-o", "json"
            ).stdout
            ingress = json.loads(raw).get("status", {}).get("loadBalancer", {}).get("ingress") or []
            if ingress and ingress[0].get("ip"):
                return str(ingress[0]["ip"])
            self.sleep(LB_INTERVAL)
        raise BackendError(
            f"service {NAMESPACE}/{service} on {CONTROL_CLUSTER} got no load-balancer address; "
            f"check `kubectl --context {kube_context(CONTROL_CLUSTER)} -n kube-system get pods`"
        )

    def addresses(self, topology: Topology) -> Addresses:
        bus = self.lb_address(BUS_NAME)
        # Without the proxy nothing listens on 10084 at the node: callbacks are refused, as locally.
        return Addresses(proxy=self.lb_address(PROXY_NAME) if topology.proxy_enabled else bus, bus=bus)

    def restart_coredns(self, cluster: str, applied: str) -> None:
        """A changed coredns-custom reaches CoreDNS's volume only after a kubelet sync, and its reload
        plugin watches the Corefile, not the imported snippets: restart it, but only when it changed."""
        if re.search(r"^configmap/coredns-custom (created|configured)", applied, re.MULTILINE):
            self.kubectl(cluster, "-n", "kube-system", "rollout", "restart", "deployment", "coredns")
            self.wait_rollouts(cluster, [("kube-system", "coredns")])

    def rollback(self) -> list[str]:
        """Delete what this run created, newest first; returns what could not be removed."""
        left = []
        for kind, name in reversed(self.created):
            argv = (
                ("k3d", "cluster", "delete", name) if kind == "cluster" else ("docker", "network", "rm", name)
            )
            if not self.runner.run(*argv, check=False).ok:
                left.append(f"{kind} {name}")
        self.created.clear()
        return left


def deployments_of(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o["kind"] == "Deployment"]


def bring_up(backend: Backend, topology: Topology, material: CertMaterial) -> Topology:
    """Everything between preflight and the replay; on any failure, roll back and re-raise."""
    try:
        write_files(backend.render_dir, render_bundle(topology, material))
        backend.ensure_network()
        backend.ensure_clusters(topology)
        backend.load_image(topology)
        control = manifests_by_cluster(topology, material, Addresses.virtual(topology))[CONTROL_CLUSTER]
        backend.apply(CONTROL_CLUSTER)
        backend.wait_rollouts(CONTROL_CLUSTER, deployments_of(control))
        addresses = backend.addresses(topology)
        files = render_bundle(topology, material, addresses)
        write_files(backend.render_dir, files)
        live = manifests_by_cluster(topology, material, addresses)
        for cluster in topology.compute_clusters:
            applied = backend.apply(cluster.name)
            backend.restart_coredns(cluster.name, applied)
            backend.wait_rollouts(cluster.name, deployments_of(live[cluster.name]))
    except BaseException as exc:
        left = backend.rollback()
        if left and isinstance(exc, BackendError):
            raise BackendError(f"{exc}; rollback could not remove {', '.join(left)}") from exc
        raise
    return topology


def check_reachable(topology: Topology) -> None:
    """Compute clusters reach the proxy here only through a LoadBalancer Service, and the only address a
    cluster's DNS records may answer is the proxy's (k3d's network has no other simulated address)."""
    if (
        topology.compute_clusters
        and topology.values["workerCallbackProxy"]["service"]["type"] != "LoadBalancer"
    ):
        raise BackendError(
            "workerCallbackProxy.service.type: the k3d backend reaches the proxy from compute "
            "clusters through its load balancer; set it to LoadBalancer"
        )
    for cluster in topology.clusters:
        for record in cluster.dns_records:
            if not record.is_rewrite and record.target != topology.proxy_ip:
                raise BackendError(
                    f"topology DNS of {cluster.name}: {record.describe()}: the k3d backend answers only the "
                    "proxy's address (a rewrite to a name is rendered as written); replay a record for "
                    "another address on the local backend"
                )


def teardown(backend: Backend, purge: bool = False) -> list[str]:
    """Delete ncpsim's clusters (compute first) and the shared network; what was removed (maybe nothing).
    `purge` also removes the stack's state folder (certificates, rendered files, events)."""
    runner = backend.runner
    ours = sorted(
        (n for n in backend.existing_clusters() if OURS.match(n)), key=lambda n: (n == CONTROL_CLUSTER, n)
    )
    for name in ours:
        runner.run("k3d", "cluster", "delete", name)
    removed = [f"cluster {name}" for name in ours]
    if NETWORK in runner.run("docker", "network", "ls", "--format", "{{.Name}}").stdout.split():
        runner.run("docker", "network", "rm", NETWORK)
        removed.append(f"network {NETWORK}")
    (backend.state / "status.json").unlink(missing_ok=True)
    # Only a stack folder is removed: a link, or a folder holding anything ncpsim does not write (a clone's
    # sim/ package, with NCPSIM_HOME at the clone), is refused in one line (clusters.state).
    if purge and (backend.state.exists() or backend.state.is_symlink()):
        adopt(
            backend.state
        )  # k3d's `up` writes no marker: a folder of nothing but ncpsim's own names is ours
        purge_state(backend.state)
        removed.append(f"state folder {backend.state}")
    return removed
