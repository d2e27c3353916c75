"""The wire facts of the callback path, in one place: names, ports, paths and the words on the wire.

Everything here is a fact of the real stack (seed `worker-callback-proxy.md`, DESIGN.md sections 2
and 3) that more than one party must agree on: the pods serve these ports and paths, workers dial
them, the proxy routes and refuses by them, and the k3d renderer writes them into manifests and the
Envoy config. A fact that only one party knows stays beside that party.
"""

from __future__ import annotations

NAMESPACE = "nvcf"
INVOCATION_SUFFIX = "invocation.nvcf.svc.cluster.local"  # <dashed-pod-ip>.<this>: an invocation pod
GRPC_SUFFIX = "grpc-headless.nvcf.svc.cluster.local"  # <dashed-pod-ip>.<this>: a grpc-proxy pod
PROXY_SERVICE_FQDN = "worker-callback-proxy.nvcf.svc.cluster.local"

# Ports, as the real Services and pods expose them.
INVOCATION_HTTP_PORT = 8080  # client API, and the plaintext worker API when upstream TLS is off
INVOCATION_TLS_PORT = 8443  # the worker TLS listener (invocation.workerTls); CONNECT always targets it
GRPC_CLIENT_PORT = 10081  # client-facing gRPC (h2c)
# ncpsim's own client metadata (no NVCF client sends it): names a call before grpc hands over its request id.
GRPC_CALL_TAG = "x-ncpsim-call"
GRPC_CALLBACK_PORT = 10084  # worker callbacks, HTTP/3 on UDP
PROXY_HTTP_PORT = 10084  # the worker callback proxy, TLS on TCP
PROXY_H3_PORT = 443  # the worker callback proxy, QUIC on UDP
NATS_PORT = 4222  # NATS client port
NATS_MONITOR_PORT = 8222  # nats-server's monitoring port, as the chart exposes it
NATS_ROUTE_PORT = 6222  # nats-server's cluster (route) port, between the StatefulSet's pods
DNS_PORT = 53

# Paths.
ATTACH_PATH = "/v2/nvcf/worker/request-attach"  # the only path the proxy forwards to an invocation pod
PEXEC_PREFIX = "/v2/nvcf/pexec/functions/"
STATUS_PREFIX = "/v2/nvcf/pexec/status/"
GRPC_CALLBACK_PATH = "/v1/proxy"  # the worker's HTTP/3 POST that becomes the gRPC tunnel

# Envoy's local-reply bodies for upstream failures, as a worker reads them: the router's text, the stream
# reset reason (Http::Utility::resetReasonToString) and the connection's transport failure reason. A
# connect that failed is a RemoteClose ("remote connection failure", with ConnectionImpl's "delayed connect
# error: <strerror>"), a TLS handshake the upstream certificate failed too (SslSocket's error queue, then
# TLS_error_end); a QUIC session Envoy closed itself is a LocalClose ("local connection failure", with
# QuicFilterManagerConnectionImpl's "<quic error> with details: <quiche's details>"). The rendered routes
# have no retry policy, so the body never says "retried and the latest".
UPSTREAM_RESET = "upstream connect error or disconnect/reset before headers. reset reason: "
REMOTE_FAILURE = "remote connection failure"
LOCAL_FAILURE = "local connection failure"
CONNECT_TIMEOUT = "connection timeout"
TERMINATION = "connection termination"
TLS_VERIFY_FAILED = "TLS_error:|268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED"


def reset_body(reason: str, transport_failure: str = "") -> str:
    return (
        UPSTREAM_RESET
        + reason
        + (f", transport failure reason: {transport_failure}" if transport_failure else "")
    )


UF_BODY = reset_body(REMOTE_FAILURE, "delayed connect error: Connection refused")
UF_TLS_BODY = reset_body(REMOTE_FAILURE, f"{TLS_VERIFY_FAILED}:TLS_error_end")
UC_BODY = reset_body(TERMINATION)
DF_BODY = "dns resolution failure"


def invocation_port(upstream_tls: bool) -> int:
    """The pod port a callback reaches: 8443 with upstream TLS, the plaintext 8080 without it."""
    return INVOCATION_TLS_PORT if upstream_tls else INVOCATION_HTTP_PORT


class UpstreamFailure(Exception):
    """The proxy could not reach or trust a pod: the response flag, the body Envoy answers and why."""

    def __init__(self, flag: str, body: str, detail: str):
        super().__init__(detail)
        self.flag, self.body, self.detail = flag, body, detail
