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

from clusters.render.envoy_base import (
    CONNECT_PORT,
    HCM,
    ROUTER,
    STREAM_IDLE_TIMEOUT,
    TLS_DOWN,
    TLS_INSPECTOR,
    TLS_UP,
    Json,
    access_log,
    dfp_cluster,
    dfp_filter,
    http_filter,
    http_options,
    pod_authority_regex,
    sds_files,
    sds_ref,
)
from clusters.render.envoy_quic import grpc_h3_cluster, quic_listener
from sim.proxy.policy import CALLBACK_PATH, MAX_HEADERS_BYTES, MAX_HEADERS_COUNT, POD_SUFFIX, ProxyPolicy
from sim.proxy.san import INVOCATION_UPSTREAM
from sim.wire import PROXY_HTTP_PORT


@dataclass(frozen=True)
class EnvoyConfig:
    bootstrap: Json
    sds: dict[str, Json]  # file name under SDS_DIR -> DiscoveryResponse with one Secret


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
        "route": {
            "cluster": "invocation_pods_tls" if policy.upstream_tls else "invocation_pods_plain",
            "timeout": "0s",
        },
    }
    routes, domains = [attach], {f"*{POD_SUFFIX}:{port}"}
    if policy.connect_enabled:
        routes.append(connect_route())
        domains.add(f"*{POD_SUFFIX}:{CONNECT_PORT}")
    return {
        "name": "worker_callback_routes",
        "virtual_hosts": [{"name": "invocation_pods", "domains": sorted(domains), "routes": routes}],
    }


def connect_route() -> Json:
    """CONNECT to <pod>:8443, terminated here (connect_config) and tunnelled as raw TCP."""
    return {
        "name": "connect_tunnel",
        "match": {
            "connect_matcher": {},
            "headers": [
                {
                    "name": ":authority",
                    "string_match": {"safe_regex": {"regex": pod_authority_regex(CONNECT_PORT)}},
                }
            ],
        },
        "route": {
            "cluster": "invocation_pods_connect",
            "timeout": "0s",
            "upgrade_configs": [{"upgrade_type": "CONNECT", "connect_config": {}}],
        },
    }


def http_connection_manager(policy: ProxyPolicy) -> Json:
    config: Json = {
        "@type": HCM,
        "stat_prefix": "worker_callback_http",
        "codec_type": "HTTP1",
        # Forward-proxy request lines; HTTP/1.0 gets 426; Content-Length with chunked gets 400.
        "http_protocol_options": {
            "allow_absolute_url": True,
            "accept_http_10": False,
            "allow_chunked_length": False,
        },
        "common_http_protocol_options": {
            "headers_with_underscores_action": "ALLOW",
            "max_headers_count": MAX_HEADERS_COUNT,
        },
        "max_request_headers_kb": MAX_HEADERS_BYTES // 1024,
        "stream_idle_timeout": STREAM_IDLE_TIMEOUT,
        # No path rewriting before the route match: "//", "..", "%2e%2e" stay as sent and match nothing.
        "normalize_path": False,
        "merge_slashes": False,
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
        # HTTP workers send no X-Request-Id (worker-utils does not), so Envoy makes one up; a client that
        # sends one (gRPC callbacks, ncpsim's probes) keeps it, and the access log names it.
        "preserve_external_request_id": True,
        "access_log": access_log(),
        "route_config": http_routes(policy),
        "http_filters": [dfp_filter(), http_filter("envoy.filters.http.router", ROUTER)],
    }
    if policy.connect_enabled:
        config["upgrade_configs"] = [{"upgrade_type": "CONNECT"}]
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": config}


def http_listener(policy: ProxyPolicy, worker_domain: str) -> Json:
    tls = {
        "@type": TLS_DOWN,
        "common_tls_context": {
            "tls_certificate_sds_secret_configs": [sds_ref("frontend")],
            "alpn_protocols": ["http/1.1"],
        },
    }
    return {
        "name": "worker_callback_http",
        "address": {
            "socket_address": {"protocol": "TCP", "address": "0.0.0.0", "port_value": PROXY_HTTP_PORT}
        },
        # The TLS inspector reads the SNI so the chain can match it: a ClientHello for any other name
        # finds no filter chain and the connection is closed, as the local front does.
        "listener_filters": [
            {"name": "envoy.filters.listener.tls_inspector", "typed_config": {"@type": TLS_INSPECTOR}}
        ],
        "filter_chains": [
            {
                "filter_chain_match": {"server_names": [f"*.{worker_domain}"]},
                "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls},
                "filters": [http_connection_manager(policy)],
            }
        ],
    }


def invocation_tls_cluster() -> Json:
    """TLS to the pod's 8443: SNI = the pod name, SAN checked against it, chain against the stack CA."""
    cluster = dfp_cluster("invocation_pods_tls", insecure=False)
    cluster["typed_extension_protocol_options"] = http_options(  # the rule of sim.proxy.san
        {"http_protocol_options": {}}, auto_sni=True, auto_san=INVOCATION_UPSTREAM.auto_san
    )
    cluster["transport_socket"] = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": TLS_UP,
            "common_tls_context": {"validation_context_sds_secret_config": sds_ref("invocation_ca")},
        },
    }
    return cluster


def invocation_plain_cluster() -> Json:
    """Plain HTTP to the pod's 8080 (upstreamTls.enabled false): nothing to name or verify."""
    cluster = dfp_cluster("invocation_pods_plain", insecure=True)
    cluster["typed_extension_protocol_options"] = http_options(
        {"http_protocol_options": {}}, auto_sni=False, auto_san=False
    )
    return cluster


def connect_cluster() -> Json:
    """Raw TCP for CONNECT tunnels: the legacy worker runs its own TLS to the pod through it."""
    return dfp_cluster("invocation_pods_connect", insecure=True)


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
            "listeners": [http_listener(policy, worker_domain), quic_listener(worker_domain)],
            "clusters": clusters(policy),
        },
    }
    return EnvoyConfig(bootstrap=bootstrap, sds=sds_files())
