"""A customer's install as the fake `kubectl` and `helm` serve it (tests/fakebin/cluster.py), and the
collector run against it: the support-bundle tests build bundles the way a customer would.

`Install` describes what the customer's clusters hold; `Install.cluster()` is the fakes' JSON; `collect`
runs scenarios/bundle/collect.sh with only the fakes, sh and the POSIX tools on PATH, and returns the
bundle (the .tar.gz; its folder is beside it).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
import yaml

REPO = Path(__file__).resolve().parents[1]
FAKEBIN = Path(__file__).resolve().parent / "fakebin"
COLLECT = REPO / "scenarios" / "bundle" / "collect.sh"
COLLECT_TIMEOUT = 60.0
CP, COMPUTE = "prod-cp", "arn:aws:eks:us-east-1:1234:cluster/gpu-1"  # a context name with / and :
DOMAIN = "callbacks.example.com"
LB_ADDRESS = "203.0.113.10"
PROXY_SERVICE = "worker-callback-proxy.nvcf.svc.cluster.local"

# The compute cluster's Corefile as k3s ships it: coredns-custom's files are imported.
COREFILE = """.:53 {
    errors
    health
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
    }
    hosts /etc/coredns/NodeHosts {
      ttl 60
      reload 15s
      fallthrough
    }
    prometheus :9153
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
    import /etc/coredns/custom/*.override
}
import /etc/coredns/custom/*.server
"""


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def template_server(domain: str = DOMAIN, address: str = LB_ADDRESS) -> dict[str, str]:
    """coredns-custom's `.server` entry a customer writes: every name under the domain answers the LB."""
    return {
        "callbacks.server": f"{domain}:53 {{\n    errors\n    template IN A {domain} {{\n"
        f'      answer "{{{{ .Name }}}} 60 IN A {address}"\n    }}\n}}\n'
    }


def rewrite_override(domain: str = DOMAIN, target: str = PROXY_SERVICE) -> dict[str, str]:
    """The make target's `.override` entry: a regex rewrite to a Service name, answer auto."""
    pattern = domain.replace(".", r"\.")
    return {"callbacks.override": f"rewrite name regex (.*)\\.{pattern} {target} answer auto\n"}


@dataclass
class Frontend:
    """The proxy's frontend certificate as the cluster holds it (a cert-manager Secret)."""

    names: tuple[str, ...] = (f"*.{DOMAIN}",)
    secret: str = "worker-callback-proxy-frontend-tls"
    issuer: str = "nvcf-openbao-pki"  # cert-manager's issuer-name annotation
    organization: str = "OpenBao PKI"
    expired: bool = False
    ca: trustme.CA = field(init=False)

    def __post_init__(self) -> None:
        self.ca = trustme.CA(organization_name=self.organization)

    @property
    def ca_pem(self) -> str:
        """The issuing CA, as the customer pastes it into workerCallbackCaPem."""
        return self.ca.cert_pem.bytes().decode()

    def secret_object(self) -> tuple[dict[str, Any], bytes]:
        """The Secret, with its private key where kubectl shows it (data and last-applied); and the key."""
        ca = self.ca
        now = datetime.datetime.now(datetime.UTC)
        window = (
            {"not_before": now - datetime.timedelta(days=90), "not_after": now - datetime.timedelta(days=2)}
            if self.expired
            else {}
        )
        leaf = ca.issue_cert(*self.names, **window)
        crt = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        key = leaf.private_key_pem.bytes()
        data = {"tls.crt": b64(crt), "tls.key": b64(key), "ca.crt": b64(ca.cert_pem.bytes())}
        applied = {"apiVersion": "v1", "kind": "Secret", "data": data, "metadata": {"name": self.secret}}
        meta = {
            "name": self.secret,
            "namespace": "nvcf",
            "annotations": {
                "cert-manager.io/issuer-kind": "ClusterIssuer",
                "cert-manager.io/issuer-name": self.issuer,
                "cert-manager.io/alt-names": ",".join(self.names),
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied) + "\n",
            },
        }
        obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": meta,
            "data": data,
        }
        return obj, key


def healthy(frontend: Frontend, service_type: str = "LoadBalancer", **more: Any) -> dict[str, Any]:
    """Values of a working install: the proxy on, exposed, workers given the frontend's CA."""
    return {
        "workerCallbackProxy": {"enabled": True, "workerDomain": DOMAIN, "service": {"type": service_type}},
        "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": frontend.ca_pem}}},
        **more,
    }


@dataclass
class Install:
    """What the customer's control-plane and compute clusters hold."""

    values: dict[str, Any]
    service_type: str = "LoadBalancer"
    lb_address: str | None = LB_ADDRESS  # None: a LoadBalancer Service still pending
    frontend: Frontend = field(default_factory=Frontend)
    custom_dns: dict[str, str] | None = field(default_factory=template_server)  # None: no coredns-custom
    worker_utils: str = "1.4.0"
    pod_pem: str | None = None  # NVCF_PROXY_CA_PEM on the function pods
    proxy_log: str = ""
    callout_log: str = ""
    planted_key: bytes = b""  # filled by cluster(): the private key the collector must leave behind

    def cluster(self) -> dict[str, Any]:
        secret, self.planted_key = self.frontend.secret_object()
        service: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "worker-callback-proxy", "namespace": "nvcf"},
            "spec": {
                "type": self.service_type,
                "clusterIP": "10.43.12.7",
                "ports": [
                    {"name": "http", "port": 10084, "protocol": "TCP", "targetPort": 10084},
                    {"name": "h3", "port": 443, "protocol": "UDP", "targetPort": 443},
                ],
            },
            "status": {"loadBalancer": {"ingress": [{"ip": self.lb_address}]} if self.lb_address else {}},
        }
        compute = [*self.coredns(), *self.pods()]
        return {
            "contexts": {
                CP: {
                    "objects": [service, secret, *self.pod_secrets()],
                    "logs": {
                        "nvcf/deploy/worker-callback-proxy": self.proxy_log,
                        "nats-system/app.kubernetes.io/instance=nats-auth-callout-service": self.callout_log,
                    },
                },
                COMPUTE: {"objects": compute, "logs": {}},
            },
            "releases": [{"name": "worker-callback-proxy", "namespace": "nvcf", "chart": "wcp-1.0.4"}],
        }

    def pod_secrets(self) -> list[dict[str, Any]]:
        """The pod certificates the stack issues from its CA (no private key planted: not what is tested)."""
        out = []
        for name, names in (
            ("invocation-service-worker-tls", ("*.invocation.nvcf.svc.cluster.local",)),
            ("grpc-proxy-worker-tls", ("*.grpc-headless.nvcf.svc.cluster.local",)),
        ):
            leaf = self.frontend.ca.issue_cert(*names)
            data = {"tls.crt": b64(leaf.cert_chain_pems[0].bytes()), "ca.crt": b64(self.frontend.ca_pem)}
            meta = {"name": name, "namespace": "nvcf"}
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "kubernetes.io/tls",
                    "metadata": meta,
                    "data": data,
                }
            )
        return out

    def coredns(self) -> list[dict[str, Any]]:
        maps = [("coredns", {"Corefile": COREFILE, "NodeHosts": "172.18.0.2 k3d-gpu-1-server-0\n"})]
        if self.custom_dns is not None:
            maps.append(("coredns-custom", self.custom_dns))
        return [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "kube-system"},
                "data": data,
            }
            for name, data in maps
        ]

    def pods(self) -> list[dict[str, Any]]:
        env = [{"name": "NVCF_WORKER_ID", "value": "w-1"}]
        if self.pod_pem is not None:
            env.append({"name": "NVCF_PROXY_CA_PEM", "value": self.pod_pem})
        return [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"fn-echo-{n}",
                    "namespace": "nvcf-backend",
                    "labels": {"nvcf.nvidia.com/function-version-id": "fv-1"},
                    "creationTimestamp": "2024-05-01T10:00:00Z",
                },
                "spec": {
                    "containers": [
                        {"name": "inference", "image": "nvcr.io/acme/echo:2.1"},
                        {
                            "name": "utils",
                            "image": f"nvcr.io/nvidia/nvcf-byoc/worker-utils:{self.worker_utils}",
                            "env": env,
                        },
                    ]
                },
                "status": {"phase": "Running"},
            }
            for n in range(2)
        ]


def collect(tmp_path: Path, install: Install, *extra: str, name: str = "bundle") -> tuple[Path, Path]:
    """Run the collector against the install; (the .tar.gz, the fake tools' call log)."""
    env_file = tmp_path / "prod.yaml"
    env_file.write_text(yaml.safe_dump(install.values, sort_keys=False))
    world = tmp_path / "cluster.json"
    world.write_text(json.dumps(install.cluster()))
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    import sys

    sys.path.insert(0, str(FAKEBIN))
    try:
        import fake
    finally:
        sys.path.remove(str(FAKEBIN))
    fake.install(bin_dir, ("kubectl", "helm"))
    log = tmp_path / "calls.jsonl"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "NCPSIM_FAKE_CLUSTER": str(world),
        "NCPSIM_FAKE_LOG": str(log),
        "NCPSIM_FAKE_STATE": str(tmp_path / "fake-state.json"),
        "HOME": str(tmp_path),
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }
    out = tmp_path / name
    args = ["--control-plane", CP, "--compute", COMPUTE, "--env-file", str(env_file), "--out", str(out)]
    done = subprocess.run(
        ["sh", str(COLLECT), *args, *extra],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=COLLECT_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out.with_name(f"{name}.tar.gz"), log
