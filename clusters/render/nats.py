"""NATS in the control-plane cluster: the real nats-server (image from ``nats.image.*``) with the same
config the local backend renders, its LoadBalancer Service, and the auth callout service (stand-in
image, ``clusters.k3d.pod nats-callout``).

The config holds public keys only; every stand-in derives the seeds it needs from the topology's seed
(sim.nats.stack), as the local backend's components do. JetStream keeps its store in an emptyDir:
work survives a nats-server container restart, not a pod replacement (the chart's PVC is out of scope).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from clusters.render import kube
from clusters.render.layout import BUS_NAME, STANDIN_IMAGE
from clusters.render.standin import _base_volumes, _container, _deployment
from sim.model.topology import Topology
from sim.model.values import NatsValues
from sim.nats.config import render
from sim.nats.stack import StackKeys, server_config
from sim.wire import NAMESPACE, NATS_MONITOR_PORT, NATS_PORT

Json = dict[str, Any]

NATS_CONFIGMAP = "nats-config"
CALLOUT_NAME = "nats-auth-callout-service"
CONFIG_DIR = "/etc/nats"
STORE_DIR = "/data/jetstream"
# A nats-server with JetStream and auth callout (2.10+); `nats.image.*` in the values overrides it.
DEFAULT_IMAGE = {"registry": "docker.io", "repository": "library/nats", "tag": "2.10.22-alpine"}
PORTS = [kube.port("client", NATS_PORT), kube.port("monitor", NATS_MONITOR_PORT)]


def one_server(topology: Topology) -> tuple[Topology, str | None]:
    """The topology the k3d backend runs: one nats-server (a Deployment), whatever nats.config.cluster says,
    and the line that says so (None when the values ask for one server anyway)."""
    servers = len(topology.nats_servers)
    if servers < 2:
        return topology, None
    nats = dict(topology.values.get("nats") or {})
    config = dict(nats.get("config") or {})
    config["cluster"] = {**(config.get("cluster") or {}), "enabled": False}
    values = {**topology.values, "nats": {**nats, "config": config}}
    notice = (
        f"k3d backend: one nats-server, not the {servers} of nats.config.cluster (the NATS cluster, its "
        "routes and R3 streams run on the local backend only)"
    )
    return replace(topology, values=values), notice


def nats_image(topology: Topology) -> str:
    given = (topology.values.get("nats") or {}).get("image") or {}
    image = {**DEFAULT_IMAGE, **{k: str(v) for k, v in given.items() if k in DEFAULT_IMAGE and v}}
    return f"{image['registry']}/{image['repository']}:{image['tag']}"


def nats_config_text(topology: Topology) -> str:
    """The same server config as the local backend's, listening on the pod's ports."""
    auth_timeout = NatsValues.from_values(topology.values).auth_timeout
    config = server_config(
        StackKeys.of(topology), STORE_DIR, NATS_PORT, NATS_MONITOR_PORT, auth_timeout=auth_timeout
    )
    return render(config.__class__(**{**config.__dict__, "host": "0.0.0.0"}))


def nats_config_map(topology: Topology) -> Json:
    return kube.config_map(NATS_CONFIGMAP, NAMESPACE, {"nats-server.conf": nats_config_text(topology)})


def nats_deployment(topology: Topology, config_map: Json) -> Json:
    container: Json = {
        "name": "nats",
        "image": nats_image(topology),
        "imagePullPolicy": "IfNotPresent",
        "args": ["-c", f"{CONFIG_DIR}/nats-server.conf"],
        "ports": [{"name": p["name"], "containerPort": p["port"], "protocol": p["protocol"]} for p in PORTS],
        # /healthz answers 200 only once JetStream is up: the same readiness as the local supervisor's.
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": NATS_MONITOR_PORT}, "periodSeconds": 2},
        "volumeMounts": [
            kube.mount("config", CONFIG_DIR),
            kube.mount("jetstream", STORE_DIR, read_only=False),
        ],
    }
    spec = {
        "containers": [container],
        "volumes": [kube.config_map_volume("config", NATS_CONFIGMAP), {"name": "jetstream", "emptyDir": {}}],
        "terminationGracePeriodSeconds": 5,
    }
    annotations = {"ncpsim.io/config-checksum": kube.checksum(config_map["data"])}
    return kube.deployment(BUS_NAME, NAMESPACE, 1, kube.labels(BUS_NAME, "nats"), spec, annotations)


def nats_service() -> Json:
    """Compute clusters reach NATS only through this load balancer (client port only)."""
    return kube.service(
        BUS_NAME, NAMESPACE, [kube.port("client", NATS_PORT)], {"app": BUS_NAME}, kind="LoadBalancer"
    )


def callout_deployment(topology: Topology, cluster: str, image: str = STANDIN_IMAGE) -> Json:
    volumes, mounts = _base_volumes()
    container = _container("nats-callout", cluster, [], mounts, image)
    return _deployment(CALLOUT_NAME, "nats-callout", "nats-auth-callout", 1, container, volumes, topology)


def nats_manifests(topology: Topology, cluster: str, image: str = STANDIN_IMAGE) -> list[Json]:
    config_map = nats_config_map(topology)
    return [
        config_map,
        nats_deployment(topology, config_map),
        nats_service(),
        callout_deployment(topology, cluster, image),
    ]
