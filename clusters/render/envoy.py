"""The worker callback proxy's Envoy configuration, rendered from the same `ProxyPolicy` the local
proxy decides with (sim.proxy.policy), so the k3d backend checks ncpsim's fidelity against real Envoy.

Two listeners:

- ``worker_callback_http`` (TCP 10084): TLS with the frontend certificate, an HTTP/1.1 connection
  manager that accepts absolute-form (forward-proxy) request lines, and a route table that matches
  only ``http://<dashed-pod-ip>.invocation.nvcf.svc.cluster.local:<port>/v2/nvcf/worker/request-attach``.
  Anything else finds no route: 404 with response flag NR. Upstream is a dynamic forward proxy
  cluster that resolves the pod name through cluster DNS and re-encrypts with SNI = pod name and a
  SAN check against the stack CA (or plain HTTP to 8080 when upstream TLS is off). CONNECT exists
  only when the policy enables it.
- ``worker_callback_h3`` (UDP 443): QUIC with the same frontend certificate; a callback to
  ``<dashed-pod-ip>.<workerDomain>`` is re-encrypted over HTTP/3 to that grpc-proxy pod's UDP 10084,
  accepting only a ``*.grpc-headless.nvcf.svc.cluster.local`` certificate.

Certificates come through file-based SDS from mounted Secrets with ``watched_directory`` on the
mount, so a kubelet Secret swap (``..data`` symlink rename) reloads them without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from certs.profiles import GRPC_WILDCARD
from sim.proxy.policy import CALLBACK_PATH, MAX_HEADERS_BYTES, MAX_HEADERS_COUNT, POD_SUFFIX, ProxyPolicy
from sim.topology import GRPC_CALLBACK_PORT, GRPC_SUFFIX, PROXY_H3_PORT, PROXY_HTTP_PORT

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
GRPC_POD_HEADER = "x-ncpsim-grpc-pod"  # internal: the grpc-proxy pod the Lua filter derived

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

# Envoy's Lua API: derive the grpc-proxy pod name from the dashed label of the worker's authority.
# The route's :authority regex has already admitted only <dashed-ip>.<workerDomain>[:443].
LUA_SOURCE = f"""\
function envoy_on_request(request_handle)
  local headers = request_handle:headers()
  headers:remove("{GRPC_POD_HEADER}")
  local label = string.match(headers:get(":authority") or "", "^([0-9-]+)%.")
  if label ~= nil then
    headers:add("{GRPC_POD_HEADER}", label .. ".{GRPC_SUFFIX}:{GRPC_CALLBACK_PORT}")
  end
end
"""


@dataclass(frozen=True)
class EnvoyConfig:
    bootstrap: Json
    sds: dict[str, Json]  # file name under SDS_DIR -> DiscoveryResponse with one Secret


def _escape(text: str) -> str:
    return text.replace(".", "\\.")


def pod_authority_regex(port: int) -> str:
    """The target form pod_host() accepts: lower-case dashed IP under the invocation Service, exact port."""
    return f"^{DASHED_IP_RE}{_escape(POD_SUFFIX)}:{port}$"


def grpc_authority_regex(worker_domain: str) -> str:
    return f"^{DASHED_IP_RE}\\.{_escape(worker_domain)}(?::{PROXY_H3_PORT})?$"


def _sds(name: str) -> Json:
    return {"name": name, "sds_config": {"path_config_source": {"path": f"{SDS_DIR}/{name}.yaml"},
                                         "resource_api_version": "V3"}}


def sds_files() -> dict[str, Json]:
    """One file per secret. watched_directory is the Secret mount: the kubelet swaps ``..data`` there."""
    def secret(name: str, body: Json) -> Json:
        return {"resources": [{"@type": SECRET, "name": name, **body}]}

    return {
        "frontend.yaml": secret("frontend", {"tls_certificate": {
            "certificate_chain": {"filename": f"{FRONTEND_DIR}/tls.crt"},
            "private_key": {"filename": f"{FRONTEND_DIR}/tls.key"},
            "watched_directory": {"path": FRONTEND_DIR}}}),
        "invocation_ca.yaml": secret("invocation_ca", {"validation_context": {
            "trusted_ca": {"filename": f"{INVOCATION_CA_DIR}/ca.crt"},
            "watched_directory": {"path": INVOCATION_CA_DIR}}}),
        "grpc_ca.yaml": secret("grpc_ca", {"validation_context": {
            "trusted_ca": {"filename": f"{GRPC_CA_DIR}/ca.crt"},
            "watched_directory": {"path": GRPC_CA_DIR}}}),
    }


def access_log() -> list[Json]:
    # No log_format: Envoy's default format, which carries %RESPONSE_FLAGS% (NR, UF, DF, ...) and is
    # what sim.proxy.access_log writes and parses.
    return [{"name": "envoy.access_loggers.file", "typed_config": {"@type": FILE_LOG, "path": "/dev/stdout"}}]


def _filter(name: str, type_url: str, **config: Any) -> Json:
    return {"name": name, "typed_config": {"@type": type_url, **config}}


def _dfp_filter() -> Json:
    return _filter("envoy.filters.http.dynamic_forward_proxy", DFP_FILTER, dns_cache_config=DNS_CACHE)


# -- the HTTP front (TCP 10084) -------------------------------------------------------------------
def http_routes(policy: ProxyPolicy) -> Json:
    """Only the request-attach path on a pod-name authority with an http:// target; no catch-all."""
    port = policy.upstream_port
    attach = {
        "name": "request_attach",
        "match": {
            "path": CALLBACK_PATH,  # exact, compared without the query string
            "case_sensitive": True,
            "headers": [
                {"name": ":scheme", "string_match": {"exact": "http"}},
                {"name": ":authority", "string_match": {"safe_regex": {"regex": pod_authority_regex(port)}}},
            ],
        },
        # timeout 0s: the POST leg stays open until the client has read the response.
        "route": {"cluster": "invocation_pods_tls" if policy.upstream_tls else "invocation_pods_plain",
                  "timeout": "0s"},
    }
    routes, domains = [attach], {f"*{POD_SUFFIX}:{port}"}
    if policy.connect_enabled:
        routes.append(connect_route())
        domains.add(f"*{POD_SUFFIX}:{CONNECT_PORT}")
    return {"name": "worker_callback_routes",
            "virtual_hosts": [{"name": "invocation_pods", "domains": sorted(domains), "routes": routes}]}


def connect_route() -> Json:
    """CONNECT to <pod>:8443, terminated here (connect_config) and tunnelled as raw TCP."""
    return {
        "name": "connect_tunnel",
        "match": {"connect_matcher": {}, "headers": [
            {"name": ":authority", "string_match": {"safe_regex": {"regex": pod_authority_regex(CONNECT_PORT)}}}]},
        "route": {"cluster": "invocation_pods_connect", "timeout": "0s",
                  "upgrade_configs": [{"upgrade_type": "CONNECT", "connect_config": {}}]},
    }


def http_connection_manager(policy: ProxyPolicy) -> Json:
    config: Json = {
        "@type": HCM,
        "stat_prefix": "worker_callback_http",
        "codec_type": "HTTP1",
        # Forward-proxy request lines; HTTP/1.0 gets 426; Content-Length with chunked gets 400.
        "http_protocol_options": {"allow_absolute_url": True, "accept_http_10": False,
                                  "allow_chunked_length": False},
        "common_http_protocol_options": {"headers_with_underscores_action": "ALLOW",
                                         "max_headers_count": MAX_HEADERS_COUNT},
        "max_request_headers_kb": MAX_HEADERS_BYTES // 1024,
        "stream_idle_timeout": STREAM_IDLE_TIMEOUT,
        # No path rewriting before the route match: "//", "..", "%2e%2e" stay as sent and match nothing.
        "normalize_path": False,
        "merge_slashes": False,
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
        # Workers send X-Request-Id = the request id; keep it so the access log names the request.
        "preserve_external_request_id": True,
        "access_log": access_log(),
        "route_config": http_routes(policy),
        "http_filters": [_dfp_filter(), _filter("envoy.filters.http.router", ROUTER)],
    }
    if policy.connect_enabled:
        config["upgrade_configs"] = [{"upgrade_type": "CONNECT"}]
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": config}


def http_listener(policy: ProxyPolicy) -> Json:
    tls = {"@type": TLS_DOWN, "common_tls_context": {
        "tls_certificate_sds_secret_configs": [_sds("frontend")], "alpn_protocols": ["http/1.1"]}}
    return {
        "name": "worker_callback_http",
        "address": {"socket_address": {"protocol": "TCP", "address": "0.0.0.0", "port_value": PROXY_HTTP_PORT}},
        "filter_chains": [{
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls},
            "filters": [http_connection_manager(policy)],
        }],
    }


# -- the QUIC front (UDP 443) ---------------------------------------------------------------------
def grpc_routes(worker_domain: str) -> Json:
    route = {
        "name": "grpc_callback",
        "match": {"prefix": "/", "headers": [
            {"name": ":authority", "string_match": {"safe_regex": {"regex": grpc_authority_regex(worker_domain)}}}]},
        "route": {"cluster": "grpc_pods_h3", "timeout": "0s", "request_headers_to_remove": [GRPC_POD_HEADER]},
        # The dynamic forward proxy looks up, and forwards to, the pod name the Lua filter derived.
        "typed_per_filter_config": {"envoy.filters.http.dynamic_forward_proxy": {
            "@type": DFP_PER_ROUTE, "host_rewrite_header": GRPC_POD_HEADER}},
    }
    domains = [f"*.{worker_domain}", f"*.{worker_domain}:{PROXY_H3_PORT}"]
    return {"name": "grpc_callback_routes",
            "virtual_hosts": [{"name": "grpc_pods", "domains": domains, "routes": [route]}]}


def h3_connection_manager(worker_domain: str) -> Json:
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": {
        "@type": HCM,
        "stat_prefix": "worker_callback_h3",
        "codec_type": "HTTP3",
        "http3_protocol_options": {},
        "common_http_protocol_options": {"headers_with_underscores_action": "ALLOW",
                                         "max_headers_count": MAX_HEADERS_COUNT},
        "max_request_headers_kb": MAX_HEADERS_BYTES // 1024,
        "stream_idle_timeout": STREAM_IDLE_TIMEOUT,
        "preserve_external_request_id": True,
        "access_log": access_log(),
        "route_config": grpc_routes(worker_domain),
        "http_filters": [
            _filter("envoy.filters.http.lua", LUA, default_source_code={"inline_string": LUA_SOURCE}),
            _dfp_filter(),
            _filter("envoy.filters.http.router", ROUTER),
        ],
    }}


def quic_listener(worker_domain: str) -> Json:
    quic = {"@type": QUIC_DOWN, "downstream_tls_context": {"common_tls_context": {
        "tls_certificate_sds_secret_configs": [_sds("frontend")], "alpn_protocols": ["h3"]}}}
    return {
        "name": "worker_callback_h3",
        "address": {"socket_address": {"protocol": "UDP", "address": "0.0.0.0", "port_value": PROXY_H3_PORT}},
        "udp_listener_config": {"quic_options": {}, "downstream_socket_config": {"prefer_gro": True}},
        "filter_chains": [{
            "transport_socket": {"name": "envoy.transport_sockets.quic", "typed_config": quic},
            "filters": [h3_connection_manager(worker_domain)],
        }],
    }


# -- upstream clusters ----------------------------------------------------------------------------
def _dfp_cluster(name: str, *, insecure: bool) -> Json:
    # allow_insecure_cluster_options: Envoy refuses a forward-proxy cluster without auto SNI and
    # auto SAN validation unless told the cluster checks peers some other way (or not at all).
    cluster_type = {"@type": DFP_CLUSTER, "dns_cache_config": DNS_CACHE}
    if insecure:
        cluster_type["allow_insecure_cluster_options"] = True
    return {"name": name, "connect_timeout": CONNECT_TIMEOUT, "lb_policy": "CLUSTER_PROVIDED",
            "cluster_type": {"name": "envoy.clusters.dynamic_forward_proxy", "typed_config": cluster_type}}


def _http_options(explicit: Json, *, auto_sni: bool, auto_san: bool) -> Json:
    options: Json = {"@type": HTTP_OPTIONS, "explicit_http_config": explicit}
    if auto_sni or auto_san:
        options["upstream_http_protocol_options"] = {"auto_sni": auto_sni, "auto_san_validation": auto_san}
    return {HTTP_OPTIONS_KEY: options}


def invocation_tls_cluster() -> Json:
    """TLS to the pod's 8443: SNI = the pod name, SAN checked against it, chain against the stack CA."""
    cluster = _dfp_cluster("invocation_pods_tls", insecure=False)
    cluster["typed_extension_protocol_options"] = _http_options(
        {"http_protocol_options": {}}, auto_sni=True, auto_san=True)
    cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": TLS_UP, "common_tls_context": {"validation_context_sds_secret_config": _sds("invocation_ca")}}}
    return cluster


def invocation_plain_cluster() -> Json:
    """Plain HTTP to the pod's 8080 (upstreamTls.enabled false): nothing to name or verify."""
    cluster = _dfp_cluster("invocation_pods_plain", insecure=True)
    cluster["typed_extension_protocol_options"] = _http_options(
        {"http_protocol_options": {}}, auto_sni=False, auto_san=False)
    return cluster


def connect_cluster() -> Json:
    """Raw TCP for CONNECT tunnels: the legacy worker runs its own TLS to the pod through it."""
    return _dfp_cluster("invocation_pods_connect", insecure=True)


def grpc_h3_cluster() -> Json:
    """HTTP/3 to the grpc-proxy pod's UDP 10084, accepting only the fixed grpc-headless wildcard name."""
    cluster = _dfp_cluster("grpc_pods_h3", insecure=True)  # SAN is the fixed name below, not auto
    cluster["typed_extension_protocol_options"] = _http_options(
        {"http3_protocol_options": {}}, auto_sni=True, auto_san=False)
    validation = {"combined_validation_context": {
        "default_validation_context": {"match_typed_subject_alt_names": [
            {"san_type": "DNS", "matcher": {"exact": GRPC_WILDCARD}}]},
        "validation_context_sds_secret_config": _sds("grpc_ca")}}
    cluster["transport_socket"] = {"name": "envoy.transport_sockets.quic", "typed_config": {
        "@type": QUIC_UP, "upstream_tls_context": {"common_tls_context": validation}}}
    return cluster


def clusters(policy: ProxyPolicy) -> list[Json]:
    out = [invocation_tls_cluster() if policy.upstream_tls else invocation_plain_cluster()]
    if policy.connect_enabled:
        out.append(connect_cluster())
    out.append(grpc_h3_cluster())
    return out


def render_envoy(policy: ProxyPolicy, worker_domain: str) -> EnvoyConfig:
    """The bootstrap (envoy.yaml) and its SDS files for this policy and worker domain."""
    bootstrap = {
        "node": {"id": "worker-callback-proxy", "cluster": "worker-callback-proxy"},
        # Admin on loopback only: kubectl port-forward reaches it, workers cannot.
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9901}}},
        "static_resources": {
            "listeners": [http_listener(policy), quic_listener(worker_domain)],
            "clusters": clusters(policy),
        },
    }
    return EnvoyConfig(bootstrap=bootstrap, sds=sds_files())
