"""Names, images, ports and paths shared by the k3d renderers, the backend and the in-pod entrypoint."""

from __future__ import annotations

from sim.wire import NAMESPACE, NATS_PORT, PROXY_H3_PORT, PROXY_HTTP_PORT

NETWORK = "ncpsim"  # the one Docker network every ncpsim k3d cluster joins
K3S_IMAGE = "rancher/k3s:v1.30.4-k3s1"
KUBE_VERSION = "1.30.0"  # the Kubernetes the manifests are validated against (k3s above)
STANDIN_IMAGE = "ncpsim/standin:dev"  # built from this repo, imported into every cluster
CLUSTER_TIMEOUT = "180s"  # k3d's own wait for a cluster's server to be ready

# Host ports the control-plane cluster's k3d load balancer publishes for the proxy (curl, openssl).
HTTP_HOST_PORT = PROXY_HTTP_PORT
H3_HOST_PORT = PROXY_H3_PORT

# Control-plane objects (namespace nvcf); names follow the stack where the seed names them.
INVOCATION_DEPLOYMENT = "invocation-service"
INVOCATION_SERVICE = "invocation"
GRPC_DEPLOYMENT = "grpc-proxy-deployment"
GRPC_SERVICE = "grpc-headless"
PROXY_NAME = "worker-callback-proxy"  # Deployment and Service (`ncpsim dns-rewrite` may add one elsewhere)
ENVOY_CONFIGMAP = "worker-callback-proxy-envoy"
BUS_NAME = "nats"  # nats-server: Deployment and LoadBalancer Service (compute clusters: selectorless)
TOPOLOGY_CONFIGMAP = "ncpsim-topology"
CAS_CONFIGMAP = "ncpsim-cas"
WORKER_COMPONENT = "function-worker"

# Inside stand-in pods: the state folder layout sim.runtime.component.Context expects.
POD_STATE_DIR = "/var/run/ncpsim"
TOPOLOGY_DIR = "/etc/ncpsim"
TOPOLOGY_FILE = "topology.json"
BUS_ADDRESS = f"{BUS_NAME}.{NAMESPACE}.svc.cluster.local:{NATS_PORT}"

ENV_POD_NAME = "POD_NAME"
ENV_POD_IP = "POD_IP"
ENV_CLUSTER = "NCPSIM_CLUSTER"
ENV_WORKER = "NCPSIM_WORKER"
ENV_BUS = "NCPSIM_BUS_ADDRESS"
ENV_TOPOLOGY = "NCPSIM_TOPOLOGY"
ENV_PROXY_CA = "NVCF_PROXY_CA_PEM"  # what NVCA hands function pods from workerCallbackCaPem


def kube_context(cluster: str) -> str:
    """k3d names the kubeconfig context of cluster NAME k3d-NAME."""
    return f"k3d-{cluster}"
