"""What a Topology is made of: clusters, pods, NATS servers, the NVCF API's Service, workers, the
rewrites and Secrets a scenario asks for, and the fixed virtual addresses they sit at (pure values;
sim.model.topology puts them together).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from dns.rule import PROXY, DnsRecord, dashed_ip
from sim.model.values import DEFAULT_WEBHOOK_URL, NatsValues
from sim.wire import (
    GRPC_SUFFIX,
    INVOCATION_SUFFIX,
    PROXY_H3_PORT,
    PROXY_HTTP_PORT,
)

CONTROL_CLUSTER = "ncpsim-cp"

# The invocation Service's ClusterIP: one name and address in front of every invocation-service pod.
INVOCATION_SERVICE_FQDN = INVOCATION_SUFFIX
INVOCATION_SERVICE_IP = "10.43.0.20"

LB_POOL = "10.100.0.0/24"  # load-balancer addresses, reachable from every cluster
PROXY_LB_IP = "10.100.0.10"
BUS_LB_IP = "10.100.0.11"
# The proxy Service's ClusterIP: inside the control plane's service range, which no other cluster routes to.
PROXY_CLUSTER_IP = "10.43.0.30"  # not .10: that is the cluster DNS Service (Cluster.dns_ip)
# The nodes' own network (k3d's docker network): every cluster's pods reach every node address.
NODE_POOL = "172.18.0.0/16"
CONTROL_NODE_IP = "172.18.0.2"
# A NodePort Service answers on every node at a port from 30000-32767, not at the Service port; the
# simulation allocates these (Kubernetes would pick at random unless the chart pins them).
NODE_PORTS = {PROXY_HTTP_PORT: 30084, PROXY_H3_PORT: 30443}

REWRITE_TO_PROXY, NO_REWRITE = PROXY, "none"


@dataclass(frozen=True)
class DnsRewrite:
    """A cluster's CoreDNS rewrite as a scenario asks for it: names under `domain` answer `target`."""

    domain: str | None = None  # None: the workerDomain
    # "proxy" (the proxy Service's address) | "none" | an IPv4 address | a DNS name, looked up in the
    # cluster's own view (the make target's worker-callback-proxy.nvcf.svc.cluster.local)
    target: str = REWRITE_TO_PROXY


@dataclass(frozen=True)
class SecretSpec:
    """A Secret the stack holds before the proxy starts (`existingSecret`): declared, or a user's folder."""

    name: str
    issuer: str = "public"  # "public" | "stack" | "private" (a CA no simulated worker trusts by default)
    names: tuple[str, ...] = ()  # SANs; empty: *.<workerDomain>
    expired: bool = False
    source: str | None = None  # a real folder with tls.crt, tls.key[, ca.crt], used as it is


@dataclass(frozen=True)
class Cluster:
    name: str
    kind: str  # "control" | "compute"
    pod_cidr: str
    service_cidr: str
    # The cluster's DNS records in the order written ("proxy" already the proxy's address); none: no rewrite.
    dns_records: tuple[DnsRecord, ...] = ()

    @cached_property  # asked for each DNS lookup a component makes; parsing the CIDR showed in profiles
    def dns_ip(self) -> str:
        return str(ipaddress.ip_network(self.service_cidr).network_address + 10)


@dataclass(frozen=True)
class Pod:
    name: str  # e.g. "invocation-service-0"
    role: str  # "invocation" | "grpc-proxy"
    cluster: str
    ip: str

    @property
    def fqdn(self) -> str:
        suffix = INVOCATION_SUFFIX if self.role == "invocation" else GRPC_SUFFIX
        return f"{dashed_ip(self.ip)}.{suffix}"


@dataclass(frozen=True)
class NatsServer:
    """One pod of the nats StatefulSet (namespace nats-system): nats-0, nats-1, ..., behind the control
    plane's NATS load balancer; its peers dial its route port by its stable name."""

    name: str
    ordinal: int
    ip: str

    @property
    def fqdn(self) -> str:
        return f"{self.name}.nats-headless.nats-system.svc.cluster.local"

    def address(self, port: int) -> str:
        """The network-map key of one of its ports (client 4222, monitor 8222, route 6222)."""
        return f"{self.ip}:{port}/tcp"


@dataclass(frozen=True)
class ApiService:
    """The NVCF API's Service, where the values say the API runs (the auth callout's webhook goes there)."""

    name: str
    namespace: str
    port: int
    ip: str = "10.43.0.40"  # its ClusterIP, in the control plane's service range

    @property
    def fqdn(self) -> str:
        return f"{self.name}.{self.namespace}.svc.cluster.local"

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}/tcp"


def api_from_webhook(values: Mapping[str, Any]) -> ApiService | None:
    """The API's Service as the token webhook URL names it (`http://NAME.NS.svc.cluster.local:PORT/v2/nvcf/
    webhook/nats-auth`); None for the default URL, another path, or a name outside the cluster."""
    url = NatsValues.from_values(values).webhook_url
    parts, default = urlsplit(url), urlsplit(DEFAULT_WEBHOOK_URL)
    labels = (parts.hostname or "").split(".")
    if url == DEFAULT_WEBHOOK_URL or parts.path != default.path or labels[2:] != ["svc", "cluster", "local"]:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    return ApiService(labels[0], labels[1], port) if len(labels) == 5 else None


NATS_ROLE = "nats"  # the StatefulSet, as `fault scale` and `fault rollout` name it
NATS_POD_RANGE = "10.42.2."  # nats-0 at 10.42.2.10: clear of the invocation and grpc-proxy pods' 10.42.0.x


@dataclass(frozen=True)
class WorkerSpec:
    name: str  # e.g. "worker-1-0"
    cluster: str
    worker_utils: str = "1.4.0"  # version of the worker-utils profile
    trust: str = "stack"  # "stack" (gets NVCF_PROXY_CA_PEM if configured) | "system" | "none"
    # worker-utils that reads NVCF_NATS_ACCOUNT; an older image asks NATS for the account Worker instead
    reads_nats_account: bool = True
    # a pod NVCA created before workerCallbackCaPem was set: it has no NVCF_PROXY_CA_PEM until redeployed
    created_before_pem: bool = False
