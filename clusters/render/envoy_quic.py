"""The proxy's QUIC front (UDP 443): a callback to ``<dashed-pod-ip>.<workerDomain>`` is re-encrypted
over HTTP/3 to that grpc-proxy pod's UDP 10084, accepting only a ``*.grpc-headless.nvcf.svc.cluster.local``
certificate. The pod name is derived from the worker's authority by a Lua filter and handed to the
dynamic forward proxy (host_rewrite_header), which resolves it through the headless Service."""

from __future__ import annotations

from clusters.render.envoy_base import (
    DASHED_IP_RE,
    DFP_PER_ROUTE,
    HCM,
    LUA,
    QUIC_DOWN,
    QUIC_UP,
    ROUTER,
    STREAM_IDLE_TIMEOUT,
    Json,
    access_log,
    dfp_cluster,
    dfp_filter,
    escape_dots,
    http_filter,
    http_options,
    sds_ref,
)
from sim.proxy.policy import MAX_HEADERS_BYTES, MAX_HEADERS_COUNT
from sim.proxy.san import GRPC_UPSTREAM
from sim.wire import GRPC_CALLBACK_PORT, GRPC_SUFFIX, PROXY_H3_PORT

GRPC_POD_HEADER = "x-ncpsim-grpc-pod"  # internal: the grpc-proxy pod the Lua filter derived

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


def grpc_authority_regex(worker_domain: str) -> str:
    return f"^{DASHED_IP_RE}\\.{escape_dots(worker_domain)}(?::{PROXY_H3_PORT})?$"


def grpc_routes(worker_domain: str) -> Json:
    route = {
        "name": "grpc_callback",
        "match": {
            "prefix": "/",
            "headers": [
                {
                    "name": ":authority",
                    "string_match": {"safe_regex": {"regex": grpc_authority_regex(worker_domain)}},
                }
            ],
        },
        "route": {"cluster": "grpc_pods_h3", "timeout": "0s"},
        "request_headers_to_remove": [GRPC_POD_HEADER],  # internal: never reaches grpc-proxy
        # The dynamic forward proxy looks up, and forwards to, the pod name the Lua filter derived.
        "typed_per_filter_config": {
            "envoy.filters.http.dynamic_forward_proxy": {
                "@type": DFP_PER_ROUTE,
                "host_rewrite_header": GRPC_POD_HEADER,
            }
        },
    }
    domains = [f"*.{worker_domain}", f"*.{worker_domain}:{PROXY_H3_PORT}"]
    return {
        "name": "grpc_callback_routes",
        "virtual_hosts": [{"name": "grpc_pods", "domains": domains, "routes": [route]}],
    }


def h3_connection_manager(worker_domain: str) -> Json:
    return {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": HCM,
            "stat_prefix": "worker_callback_h3",
            "codec_type": "HTTP3",
            "http3_protocol_options": {},
            "common_http_protocol_options": {
                "headers_with_underscores_action": "ALLOW",
                "max_headers_count": MAX_HEADERS_COUNT,
            },
            "max_request_headers_kb": MAX_HEADERS_BYTES // 1024,
            "stream_idle_timeout": STREAM_IDLE_TIMEOUT,
            "preserve_external_request_id": True,
            "access_log": access_log(),
            "route_config": grpc_routes(worker_domain),
            "http_filters": [
                http_filter("envoy.filters.http.lua", LUA, default_source_code={"inline_string": LUA_SOURCE}),
                dfp_filter(),
                http_filter("envoy.filters.http.router", ROUTER),
            ],
        },
    }


def quic_listener(worker_domain: str) -> Json:
    quic = {
        "@type": QUIC_DOWN,
        "downstream_tls_context": {
            "common_tls_context": {
                "tls_certificate_sds_secret_configs": [sds_ref("frontend")],
                "alpn_protocols": ["h3"],
            }
        },
    }
    return {
        "name": "worker_callback_h3",
        "address": {"socket_address": {"protocol": "UDP", "address": "0.0.0.0", "port_value": PROXY_H3_PORT}},
        "udp_listener_config": {"quic_options": {}, "downstream_socket_config": {"prefer_gro": True}},
        "filter_chains": [
            {
                # QUIC listeners match the SNI of the Initial packet themselves (no inspector needed).
                "filter_chain_match": {"server_names": [f"*.{worker_domain}"]},
                "transport_socket": {"name": "envoy.transport_sockets.quic", "typed_config": quic},
                "filters": [h3_connection_manager(worker_domain)],
            }
        ],
    }


def grpc_h3_cluster() -> Json:
    """HTTP/3 to the grpc-proxy pod's UDP 10084, accepting only the fixed grpc-headless wildcard name: the
    SAN rule the local front applies too (sim.proxy.san.GRPC_UPSTREAM)."""
    cluster = dfp_cluster("grpc_pods_h3", insecure=True)  # SAN is the fixed name below, not auto
    cluster["typed_extension_protocol_options"] = http_options(
        {"http3_protocol_options": {}}, auto_sni=True, auto_san=GRPC_UPSTREAM.auto_san
    )
    validation = {
        "combined_validation_context": {
            "default_validation_context": GRPC_UPSTREAM.envoy_validation(),
            "validation_context_sds_secret_config": sds_ref("grpc_ca"),
        }
    }
    cluster["transport_socket"] = {
        "name": "envoy.transport_sockets.quic",
        "typed_config": {"@type": QUIC_UP, "upstream_tls_context": {"common_tls_context": validation}},
    }
    return cluster
