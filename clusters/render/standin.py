"""Deployments of the stand-in image: the same Python components the local backend runs as processes
(the NATS auth callout, invocation-service, grpc-proxy, function workers), started by ``clusters.k3d.pod``.

Each pod gets the Topology as a ConfigMap, its Secrets mounted where ``sim.runtime.component.Context`` looks
for them (``<state>/certs/secrets/<name>``), the CAs at ``<state>/certs/ca/<issuer>/ca.crt``, and its
real name and IP from the downward API (pod IPs are the cluster's to assign, not the Topology's).
"""

from __future__ import annotations

from typing import Any

from certs.profiles import GRPC_SECRET, INVOCATION_SECRET
from clusters.render import kube
from clusters.render.layout import (
    BUS_ADDRESS,
    CAS_CONFIGMAP,
    ENV_BUS,
    ENV_CLUSTER,
    ENV_POD_IP,
    ENV_POD_NAME,
    ENV_PROXY_CA,
    ENV_TOPOLOGY,
    ENV_WORKER,
    GRPC_DEPLOYMENT,
    INVOCATION_DEPLOYMENT,
    POD_STATE_DIR,
    STANDIN_IMAGE,
    TOPOLOGY_CONFIGMAP,
    TOPOLOGY_DIR,
    TOPOLOGY_FILE,
    WORKER_COMPONENT,
)
from sim.model.parts import WorkerSpec
from sim.model.topology import Topology
from sim.wire import (
    GRPC_CALLBACK_PORT,
    GRPC_CLIENT_PORT,
    INVOCATION_HTTP_PORT,
    INVOCATION_TLS_PORT,
    NAMESPACE,
)

Json = dict[str, Any]
SECRETS_DIR = f"{POD_STATE_DIR}/certs/secrets"
CA_DIR = f"{POD_STATE_DIR}/certs/ca"


def _base_volumes() -> tuple[list[Json], list[Json]]:
    volumes = [kube.config_map_volume("topology", TOPOLOGY_CONFIGMAP), {"name": "state", "emptyDir": {}}]
    mounts = [kube.mount("topology", TOPOLOGY_DIR), kube.mount("state", POD_STATE_DIR, read_only=False)]
    return volumes, mounts


def _with_secret(volumes: list[Json], mounts: list[Json], secret: str) -> None:
    volumes.append(kube.secret_volume(secret, secret))
    mounts.append(kube.mount(secret, f"{SECRETS_DIR}/{secret}"))


def _with_cas(volumes: list[Json], mounts: list[Json]) -> None:
    # Workers trust the public-style CA as "system roots" and, with trust: stack, the stack CA too.
    volumes.append(
        kube.config_map_volume(
            "cas", CAS_CONFIGMAP, {"stack.crt": "stack/ca.crt", "public.crt": "public/ca.crt"}
        )
    )
    mounts.append(kube.mount("cas", CA_DIR))


def _env(cluster: str, extra: list[Json] | None = None) -> list[Json]:
    return [
        kube.env_field(ENV_POD_NAME, "metadata.name"),
        kube.env_field(ENV_POD_IP, "status.podIP"),
        kube.env_value(ENV_CLUSTER, cluster),
        kube.env_value(ENV_BUS, BUS_ADDRESS),
        kube.env_value(ENV_TOPOLOGY, f"{TOPOLOGY_DIR}/{TOPOLOGY_FILE}"),
        *(extra or []),
    ]


def _container(
    kind: str, cluster: str, ports: list[Json], mounts: list[Json], image: str, env: list[Json] | None = None
) -> Json:
    container: Json = {
        "name": kind,
        "image": image,
        "imagePullPolicy": "Never",  # imported with `k3d image import`; no registry has it
        "command": ["python", "-m", "clusters.k3d.pod"],
        "args": [kind],
        "env": _env(cluster, env),
        "volumeMounts": mounts,
    }
    if ports:
        container["ports"] = [
            {"name": p["name"], "containerPort": p["port"], "protocol": p["protocol"]} for p in ports
        ]
        tcp = next((p for p in ports if p["protocol"] == "TCP"), None)
        if tcp:
            container["readinessProbe"] = {"tcpSocket": {"port": tcp["port"]}, "periodSeconds": 2}
    return container


def _deployment(
    name: str,
    kind: str,
    component: str,
    replicas: int,
    container: Json,
    volumes: list[Json],
    topology: Topology,
) -> Json:
    spec = {"containers": [container], "volumes": volumes, "terminationGracePeriodSeconds": 5}
    annotations = {"ncpsim.io/topology-checksum": kube.checksum(topology.to_json())}
    return kube.deployment(name, NAMESPACE, replicas, kube.labels(name, component), spec, annotations)


INVOCATION_PORTS = [kube.port("http", INVOCATION_HTTP_PORT), kube.port("worker-tls", INVOCATION_TLS_PORT)]
GRPC_PORTS = [kube.port("grpc", GRPC_CLIENT_PORT), kube.port("callback", GRPC_CALLBACK_PORT, "UDP")]


def invocation_deployment(topology: Topology, cluster: str, image: str = STANDIN_IMAGE) -> Json:
    volumes, mounts = _base_volumes()
    _with_secret(volumes, mounts, INVOCATION_SECRET)
    container = _container("invocation", cluster, INVOCATION_PORTS, mounts, image)
    replicas = len(topology.pods_of("invocation"))
    return _deployment(
        INVOCATION_DEPLOYMENT, "invocation", "invocation-service", replicas, container, volumes, topology
    )


def grpc_deployment(topology: Topology, cluster: str, image: str = STANDIN_IMAGE) -> Json:
    volumes, mounts = _base_volumes()
    _with_secret(volumes, mounts, GRPC_SECRET)
    _with_cas(volumes, mounts)
    container = _container("grpc-proxy", cluster, GRPC_PORTS, mounts, image)
    replicas = len(topology.pods_of("grpc-proxy"))
    return _deployment(GRPC_DEPLOYMENT, "grpc-proxy", "grpc-proxy", replicas, container, volumes, topology)


def worker_deployment(
    topology: Topology, worker: WorkerSpec, proxy_ca_pem: str, image: str = STANDIN_IMAGE
) -> Json:
    """One Deployment per simulated function worker. NVCF_PROXY_CA_PEM is set only when the values
    carry workerCallbackCaPem, as NVCA does; pods created before a change keep what they had."""
    volumes, mounts = _base_volumes()
    _with_cas(volumes, mounts)
    env = [kube.env_value(ENV_WORKER, worker.name)]
    if worker.created_before_pem:  # the pod as NVCA created it before workerCallbackCaPem was set
        proxy_ca_pem = ""
    if proxy_ca_pem.strip():
        env.append(kube.env_value(ENV_PROXY_CA, proxy_ca_pem))
    container = _container("workers", worker.cluster, [], mounts, image, env)
    deployment = _deployment(worker.name, "workers", WORKER_COMPONENT, 1, container, volumes, topology)
    deployment["spec"]["template"]["metadata"]["annotations"]["ncpsim.io/proxy-ca-checksum"] = kube.checksum(
        proxy_ca_pem
    )
    return deployment
