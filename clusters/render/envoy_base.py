"""Shared pieces of the worker callback proxy's Envoy config: paths, type URLs, the DNS cache, SDS
files, the access log and the dynamic forward proxy cluster skeleton (see clusters.render.envoy)."""

from __future__ import annotations

from typing import Any

from sim.proxy.policy import POD_SUFFIX

Json = dict[str, Any]

CONFIG_DIR = "/etc/envoy"  # the ConfigMap mount
SDS_DIR = f"{CONFIG_DIR}/sds"
SECRETS_DIR = "/etc/envoy-secrets"  # Secret mounts live outside the ConfigMap mount (it is read-only)
FRONTEND_DIR = f"{SECRETS_DIR}/frontend"
INVOCATION_CA_DIR = f"{SECRETS_DIR}/invocation"
GRPC_CA_DIR = f"{SECRETS_DIR}/grpc"

CONNECT_PORT = 8443  # legacy workers tunnel to the pod's TLS listener, whatever upstream TLS says
STREAM_IDLE_TIMEOUT = "300s"  # Envoy's default, stated: an idle callback stream ends with 408 SI
CONNECT_TIMEOUT = "5s"

T = "type.googleapis.com/envoy."
HCM = T + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
DFP_FILTER = T + "extensions.filters.http.dynamic_forward_proxy.v3.FilterConfig"
DFP_PER_ROUTE = T + "extensions.filters.http.dynamic_forward_proxy.v3.PerRouteConfig"
DFP_CLUSTER = T + "extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig"
ROUTER = T + "extensions.filters.http.router.v3.Router"
LUA = T + "extensions.filters.http.lua.v3.Lua"
FILE_LOG = T + "extensions.access_loggers.file.v3.FileAccessLog"
TLS_DOWN = T + "extensions.transport_sockets.tls.v3.DownstreamTlsContext"
TLS_UP = T + "extensions.transport_sockets.tls.v3.UpstreamTlsContext"
TLS_INSPECTOR = T + "extensions.filters.listener.tls_inspector.v3.TlsInspector"
QUIC_DOWN = T + "extensions.transport_sockets.quic.v3.QuicDownstreamTransport"
QUIC_UP = T + "extensions.transport_sockets.quic.v3.QuicUpstreamTransport"
SECRET = T + "extensions.transport_sockets.tls.v3.Secret"
HTTP_OPTIONS = T + "extensions.upstreams.http.v3.HttpProtocolOptions"
HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

# One DNS cache for the filters and every dynamic forward proxy cluster (Envoy requires them to match).
DNS_CACHE: Json = {"name": "pod_names", "dns_lookup_family": "V4_ONLY"}

# Same octet rule as dns.rule.undash: 0-255, no leading zeros, so 10-42-0-011 is not a pod name.
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
DASHED_IP_RE = f"{_OCTET}(?:-{_OCTET}){{3}}"


def escape_dots(text: str) -> str:
    return text.replace(".", "\\.")


def pod_authority_regex(port: int) -> str:
    """The target form pod_host() accepts: lower-case dashed IP under the invocation Service, exact port."""
    return f"^{DASHED_IP_RE}{escape_dots(POD_SUFFIX)}:{port}$"


def sds_ref(name: str) -> Json:
    return {
        "name": name,
        "sds_config": {
            "path_config_source": {"path": f"{SDS_DIR}/{name}.yaml"},
            "resource_api_version": "V3",
        },
    }


def sds_files() -> dict[str, Json]:
    """One file per secret. watched_directory is the Secret mount: the kubelet swaps ``..data`` there."""

    def secret(name: str, body: Json) -> Json:
        return {"resources": [{"@type": SECRET, "name": name, **body}]}

    return {
        "frontend.yaml": secret(
            "frontend",
            {
                "tls_certificate": {
                    "certificate_chain": {"filename": f"{FRONTEND_DIR}/tls.crt"},
                    "private_key": {"filename": f"{FRONTEND_DIR}/tls.key"},
                    "watched_directory": {"path": FRONTEND_DIR},
                }
            },
        ),
        "invocation_ca.yaml": secret(
            "invocation_ca",
            {
                "validation_context": {
                    "trusted_ca": {"filename": f"{INVOCATION_CA_DIR}/ca.crt"},
                    "watched_directory": {"path": INVOCATION_CA_DIR},
                }
            },
        ),
        "grpc_ca.yaml": secret(
            "grpc_ca",
            {
                "validation_context": {
                    "trusted_ca": {"filename": f"{GRPC_CA_DIR}/ca.crt"},
                    "watched_directory": {"path": GRPC_CA_DIR},
                }
            },
        ),
    }


def access_log() -> list[Json]:
    # No log_format: Envoy's default format, which carries %RESPONSE_FLAGS% (NR, UF, DF, ...) and is
    # what sim.proxy.access_log writes and parses.
    return [{"name": "envoy.access_loggers.file", "typed_config": {"@type": FILE_LOG, "path": "/dev/stdout"}}]


def http_filter(name: str, type_url: str, **config: Any) -> Json:
    return {"name": name, "typed_config": {"@type": type_url, **config}}


def dfp_filter() -> Json:
    return http_filter("envoy.filters.http.dynamic_forward_proxy", DFP_FILTER, dns_cache_config=DNS_CACHE)


def dfp_cluster(name: str, *, insecure: bool) -> Json:
    # allow_insecure_cluster_options: Envoy refuses a forward-proxy cluster without auto SNI and
    # auto SAN validation unless told the cluster checks peers some other way (or not at all).
    cluster_type: Json = {"@type": DFP_CLUSTER, "dns_cache_config": DNS_CACHE}
    if insecure:
        cluster_type["allow_insecure_cluster_options"] = True
    return {
        "name": name,
        "connect_timeout": CONNECT_TIMEOUT,
        "lb_policy": "CLUSTER_PROVIDED",
        "cluster_type": {"name": "envoy.clusters.dynamic_forward_proxy", "typed_config": cluster_type},
    }


def http_options(explicit: Json, *, auto_sni: bool, auto_san: bool) -> Json:
    options: Json = {"@type": HTTP_OPTIONS, "explicit_http_config": explicit}
    if auto_sni or auto_san:
        options["upstream_http_protocol_options"] = {"auto_sni": auto_sni, "auto_san_validation": auto_san}
    return {HTTP_OPTIONS_KEY: options}
