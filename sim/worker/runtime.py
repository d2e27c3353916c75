"""One function worker as its callbacks see it: its pod spec, its trust (the system roots and
NVCF_PROXY_CA_PEM), the connections it keeps, and the line worker-utils logs when a request fails.
The worker host (sim.worker.host) makes one per worker of its cluster; the HTTP and gRPC callbacks
(sim.worker.http_callback, sim.worker.grpc_callback) read it.
"""

from __future__ import annotations

import ssl
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from sim.model.parts import WorkerSpec
from sim.protocols.go_errors import proxy_ca_certs, zap_error
from sim.protocols.tls import client_context
from sim.runtime.component import Context
from sim.wire import DNS_PORT
from sim.worker.pool import KeepAlivePool

if TYPE_CHECKING:
    from sim.worker.quic_cache import QuicCache


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def proxy_ca_pem(ctx: Context) -> str:
    """NVCF_PROXY_CA_PEM as NVCA hands it to a new function pod: the workerCallbackCaPem text of the values
    as last applied. A `@stack-ca` marker was replaced by PEM text when they were applied
    (Topology.with_ca_pem), so a CA rotated since then is not seen here, as in the field."""
    agent = ctx.values.get("global", {}).get("nvcaOperator", {}).get("agent", {})
    pem = str(agent.get("workerCallbackCaPem") or "")
    if pem.strip().startswith("@"):
        raise ValueError(
            f"workerCallbackCaPem {pem.strip()!r} reached a worker host unresolved; "
            "the backend applies the values (Topology.with_ca_pem) before pods start"
        )
    return pem


_CONTEXTS: dict[tuple[tuple[str, ...], tuple[tuple[str, int], ...], str], ssl.SSLContext] = {}


@dataclass
class WorkerRuntime:
    spec: WorkerSpec
    ctx: Context
    proxy_ca_pem: str  # NVCF_PROXY_CA_PEM as it was when this worker's pod was created
    pool: KeepAlivePool = field(default_factory=KeepAlivePool)  # worker-utils' shared proxy client
    # The worker library's QUIC connections by host, made by the first gRPC callback (aioquic loads only
    # where a function speaks gRPC).
    quic: QuicCache | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def reads_nats_account(self) -> bool:
        return self.spec.reads_nats_account

    @cached_property  # asked on every callback; a pod's image does not change
    def sends_connect(self) -> bool:
        """worker-utils before 1.3.2 tunnels with CONNECT instead of forward-proxy requests."""
        return version_tuple(self.spec.worker_utils) < (1, 3, 2)

    @cached_property
    def dns_address(self) -> str:
        """The cluster DNS Service the worker's resolver asks (ip:53), as Go's lookup errors name it."""
        return f"{self.ctx.topology.cluster(self.ctx.cluster).dns_ip}:{DNS_PORT}"

    @cached_property
    def proxy_ca(self) -> str:
        """The certificates of NVCF_PROXY_CA_PEM that Go's x509.CertPool takes (the rest is skipped)."""
        return proxy_ca_certs(self.proxy_ca_pem)

    @property
    def proxy_ca_broken(self) -> bool:
        """NVCF_PROXY_CA_PEM is set but holds no certificate: worker-utils' ca.ProxyCAs refuses it."""
        return bool(self.proxy_ca_pem.strip()) and not self.proxy_ca

    def cafiles(self) -> list[Path]:
        if self.spec.trust == "none":
            return []
        public = self.ctx.ca_path("public")
        # The simulated system roots; during a public root rollover the old root stays trusted beside it.
        roots = [public] + [prev for prev in [public.with_name("ca.prev.crt")] if prev.exists()]
        if self.spec.trust == "stack":
            roots.append(self.ctx.ca_path("stack"))  # an image with the stack CA baked in
        return roots

    def client_context(self, alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
        """Built once per trust material (the root files, NVCF_PROXY_CA_PEM, ALPN) and shared by the host's
        workers that have the same: parsing the CA files for every callback cost ~15% of a worker host's
        CPU, and one context per worker ~10% of a 400-worker host's start. A changed or added root file
        (a rollover) makes a new key, so a new context."""
        files = self.cafiles()
        key = (alpn, tuple((str(p), p.stat().st_mtime_ns) for p in files if p.exists()), self.proxy_ca)
        context = _CONTEXTS.get(key)
        if context is None:
            context = _CONTEXTS[key] = client_context(files, self.proxy_ca, alpn, keep_peer_chain=True)
        return context


def make_workers(ctx: Context) -> dict[str, WorkerRuntime]:
    pem = proxy_ca_pem(ctx)
    return {
        w.name: WorkerRuntime(w, ctx, "" if w.created_before_pem else pem)
        for w in ctx.topology.workers_in(ctx.cluster)
    }


def log_failure(worker: str, request_id: str, error: str, stateful: bool = False) -> None:
    """The worker host's log (its stderr) gets the line worker-utils logs for a failed request."""
    now = time.time()
    if stateful:
        print(
            zap_error(now, "failed to handle stateful work request", error, request_id, worker),
            file=sys.stderr,
        )
    print(zap_error(now, "failed to handle request", error, request_id, worker), file=sys.stderr, flush=True)
