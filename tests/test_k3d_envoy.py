"""Golden tests of the Envoy config the k3d backend renders from the local proxy's ProxyPolicy.

One test (or group) per row of DESIGN.md section 3, each naming the Envoy setting that produces the
behaviour. The route table is also read back by a small evaluator (Envoy's virtual-host and route
matching, as documented) and compared with sim.proxy.policy.decide on a table of requests: the same
requests in, the same forward / tunnel / 404 NR out.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import pytest

from certs.profiles import GRPC_WILDCARD
from clusters.render import envoy_base as base
from clusters.render import envoy_quic as quic
from clusters.render.envoy import render_envoy
from sim.proxy.policy import (
    CALLBACK_PATH,
    MAX_HEADERS_BYTES,
    MAX_HEADERS_COUNT,
    Forward,
    ProxyPolicy,
    Reject,
    RequestHead,
    Tunnel,
    decide,
)

WD = "grpc-worker.example.com"
POLICIES = [ProxyPolicy(tls, connect) for tls in (True, False) for connect in (False, True)]
DEFAULT = ProxyPolicy()  # upstream TLS on, CONNECT off: the stack's defaults


def bootstrap(policy: ProxyPolicy = DEFAULT) -> dict:
    return render_envoy(policy, WD).bootstrap


def listener(config: dict, name: str) -> dict:
    return next(item for item in config["static_resources"]["listeners"] if item["name"] == name)


def hcm(config: dict, name: str = "worker_callback_http") -> dict:
    return listener(config, name)["filter_chains"][0]["filters"][0]["typed_config"]


def cluster(config: dict, name: str) -> dict:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


def cluster_names(config: dict) -> set[str]:
    return {c["name"] for c in config["static_resources"]["clusters"]}


def walk(node: object):
    """Every (key, value) pair in a nested config."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


# -- a small evaluator of Envoy's route matching ---------------------------------------------------
def _domain_rank(domain: str, host: str) -> int | None:
    """Envoy's virtual-host order: exact, then suffix wildcard (longer first), prefix wildcard, '*'."""
    if domain == host:
        return 0
    if domain == "*":
        return 3
    if domain.startswith("*") and host.endswith(domain[1:]) and len(host) > len(domain) - 1:
        return 1
    if domain.endswith("*") and host.startswith(domain[:-1]) and len(host) > len(domain) - 1:
        return 2
    return None


def select_route(route_config: dict, headers: dict[str, str]) -> dict | None:
    host = headers[":authority"].lower()  # virtual hosts match case-insensitively
    ranked = [
        (rank, -len(d), vh)
        for vh in route_config["virtual_hosts"]
        for d in vh["domains"]
        if (rank := _domain_rank(d.lower(), host)) is not None
    ]
    if not ranked:
        return None
    vhost = min(ranked, key=lambda r: (r[0], r[1]))[2]
    return next((r for r in vhost["routes"] if _route_matches(r["match"], headers)), None)


def _route_matches(match: dict, headers: dict[str, str]) -> bool:
    connect = headers[":method"] == "CONNECT"
    if "connect_matcher" in match:
        if not connect:
            return False
    elif connect:  # CONNECT carries no :path, so no path or prefix route matches it
        return False
    else:
        path = headers[":path"].split("?", 1)[0]  # path matching ignores the query string
        if not match.get("case_sensitive", True):
            path = path.lower()
        if "path" in match and path != match["path"]:
            return False
        if "prefix" in match and not path.startswith(match["prefix"]):
            return False
    return all(_header_matches(h, headers.get(h["name"])) for h in match.get("headers", []))


def _header_matches(matcher: dict, value: str | None) -> bool:
    if value is None:
        return False
    string_match = matcher["string_match"]
    if "exact" in string_match:
        return value == string_match["exact"]
    return re.fullmatch(string_match["safe_regex"]["regex"], value) is not None  # RE2 FullMatch


def envoy_headers(method: str, target: str, host: str | None = None) -> dict[str, str]:
    """The pseudo-headers Envoy's HTTP/1 codec makes of a request line on the TLS frontend."""
    if method == "CONNECT":
        return {":method": method, ":authority": target}
    if target.lower().startswith(("http://", "https://")):  # allow_absolute_url
        parts = urlsplit(target)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        # The codec lower-cases the URL's scheme (allow_absolute_url_with_mixed_scheme, on by default).
        return {":method": method, ":scheme": parts.scheme.lower(), ":authority": parts.netloc, ":path": path}
    return {":method": method, ":scheme": "https", ":authority": host or "", ":path": target}


POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
TARGETS = [
    # (method, target, Host header for origin-form)
    ("GET", f"http://{POD}:8443{CALLBACK_PATH}", None),
    ("POST", f"http://{POD}:8443{CALLBACK_PATH}", None),
    ("GET", f"http://{POD}:8443{CALLBACK_PATH}?attempt=2", None),
    ("GET", f"http://{POD}:8080{CALLBACK_PATH}", None),
    ("GET", f"http://{POD}:8443/v2/nvcf/pexec/functions/echo", None),
    ("GET", f"http://{POD}:8443{CALLBACK_PATH};jsessionid=1", None),
    ("GET", f"http://{POD}:8443{CALLBACK_PATH.upper()}", None),
    ("GET", f"http://{POD}:8443/{CALLBACK_PATH}", None),
    ("GET", f"http://{POD}:8443/v2//nvcf/worker/request-attach", None),
    ("GET", f"http://{POD}:8443/v2/nvcf/worker/../worker/request-attach", None),
    ("GET", f"http://{POD}:8443/v2/nvcf/worker/%2e%2e/worker/request-attach", None),
    ("GET", f"http://{POD}:8443/v2/nvcf/worker/request%2Dattach", None),
    ("GET", f"http://{POD}:8443{CALLBACK_PATH}/", None),
    ("GET", f"http://{POD}:443{CALLBACK_PATH}", None),
    ("GET", f"http://{POD}{CALLBACK_PATH}", None),
    ("GET", f"https://{POD}:8443{CALLBACK_PATH}", None),
    ("GET", f"http://{POD.upper()}:8443{CALLBACK_PATH}", None),
    ("GET", f"http://{POD}.:8443{CALLBACK_PATH}", None),
    ("GET", f"http://invocation.nvcf.svc.cluster.local:8443{CALLBACK_PATH}", None),
    ("GET", f"http://a.{POD}:8443{CALLBACK_PATH}", None),
    ("GET", f"http://10-42-0-011.invocation.nvcf.svc.cluster.local:8443{CALLBACK_PATH}", None),
    ("GET", f"http://10-42-0-256.invocation.nvcf.svc.cluster.local:8443{CALLBACK_PATH}", None),
    ("GET", f"http://10-42-0-11.grpc-headless.nvcf.svc.cluster.local:8443{CALLBACK_PATH}", None),
    ("GET", f"http://{POD}.evil.example:8443{CALLBACK_PATH}", None),
    ("GET", f"http://evil.example:8443{CALLBACK_PATH}", None),
    ("GET", CALLBACK_PATH, f"{POD}:8443"),  # origin-form inside the TLS session: not a forward-proxy request
    ("CONNECT", f"{POD}:8443", None),
    ("CONNECT", f"{POD}:8080", None),
    ("CONNECT", "evil.example:8443", None),
    ("CONNECT", f"{POD.upper()}:8443", None),
]


@pytest.mark.parametrize(
    "policy", POLICIES, ids=lambda p: f"tls={p.upstream_tls},connect={p.connect_enabled}"
)
@pytest.mark.parametrize(("method", "target", "host"), TARGETS)
def test_route_table_decides_like_the_policy(
    policy: ProxyPolicy, method: str, target: str, host: str | None
) -> None:
    decision = decide(RequestHead(method, target, headers=(("host", host or "x"),)), policy)
    routes = hcm(bootstrap(policy))["route_config"]
    headers = envoy_headers(method, target, host)
    route = select_route(routes, headers)
    if isinstance(decision, Forward):
        assert route is not None and route["name"] == "request_attach"
        assert headers[":authority"] == decision.authority  # what the forward proxy resolves and dials
        assert route["route"]["cluster"] == (
            "invocation_pods_tls" if decision.tls else "invocation_pods_plain"
        )
    elif isinstance(decision, Tunnel):
        assert route is not None and route["name"] == "connect_tunnel"
        assert headers[":authority"] == f"{decision.host}:{decision.port}"
    else:
        assert isinstance(decision, Reject) and (decision.status, decision.flag) == (404, "NR")
        assert route is None, f"Envoy would route {method} {target} but the policy says 404 NR"


def test_upper_case_scheme_is_forwarded_by_envoy_and_the_policy() -> None:
    target = f"HTTP://{POD}:8443{CALLBACK_PATH}"
    route = select_route(hcm(bootstrap())["route_config"], envoy_headers("GET", target))
    assert route is not None and route["name"] == "request_attach"  # what Envoy does
    assert isinstance(decide(RequestHead("GET", target), DEFAULT), Forward)  # and the local policy agrees


# -- row: allowed target + request-attach (query ignored) -> forwarded, SNI = pod name -------------
def test_row_forward_route_is_the_exact_callback_path_on_a_pod_name_authority() -> None:
    routes = hcm(bootstrap())["route_config"]["virtual_hosts"]
    assert [vh["domains"] for vh in routes] == [
        ["*.invocation.nvcf.svc.cluster.local:8443"]
    ]  # no catch-all "*"
    (route,) = routes[0]["routes"]
    assert route["match"]["path"] == CALLBACK_PATH  # `path`: exact, compared without the query string
    assert route["match"]["case_sensitive"] is True
    assert "prefix" not in route["match"] and "safe_regex" not in route["match"]
    headers = {h["name"]: h["string_match"] for h in route["match"]["headers"]}
    assert headers[":scheme"] == {"exact": "http"}  # an absolute http:// target, not origin-form over TLS
    assert headers[":authority"]["safe_regex"]["regex"] == base.pod_authority_regex(8443)


def test_row_forward_reencrypts_with_sni_and_san_of_the_pod_name() -> None:
    upstream = cluster(bootstrap(), "invocation_pods_tls")
    options = upstream["typed_extension_protocol_options"][base.HTTP_OPTIONS_KEY]
    assert options["upstream_http_protocol_options"] == {"auto_sni": True, "auto_san_validation": True}
    assert options["explicit_http_config"] == {
        "http_protocol_options": {}
    }  # HTTP/1.1 to the pod, like workers
    assert upstream["cluster_type"]["name"] == "envoy.clusters.dynamic_forward_proxy"
    assert "allow_insecure_cluster_options" not in upstream["cluster_type"]["typed_config"]
    assert upstream["lb_policy"] == "CLUSTER_PROVIDED"


def test_row_forward_filter_and_clusters_share_one_dns_cache() -> None:
    config = bootstrap(ProxyPolicy(connect_enabled=True))
    filters = hcm(config)["http_filters"]
    assert [f["name"] for f in filters] == [
        "envoy.filters.http.dynamic_forward_proxy",
        "envoy.filters.http.router",
    ]
    caches = [v for k, v in walk(config) if k == "dns_cache_config"]
    assert len(caches) >= 4 and all(cache == base.DNS_CACHE for cache in caches)


def test_row_forward_keeps_the_workers_request_id_for_the_access_log() -> None:
    assert hcm(bootstrap())["preserve_external_request_id"] is True


# -- row: other path, ;params, case, //, .., %2e%2e, host off form, wrong port -> 404 NR -----------
def test_row_not_found_nothing_rewrites_the_path_before_matching() -> None:
    manager = hcm(bootstrap())
    assert manager["normalize_path"] is False  # ".." and "%2e%2e" are not resolved into the callback path
    assert manager["merge_slashes"] is False  # "//" stays
    assert manager["path_with_escaped_slashes_action"] == "KEEP_UNCHANGED"


def test_row_not_found_authority_regex_is_the_policy_pod_name_form() -> None:
    regex = base.pod_authority_regex(8443)
    assert re.fullmatch(regex, f"{POD}:8443")
    for bad in (
        f"{POD}:8080",
        f"{POD.upper()}:8443",
        f"x{POD}:8443",
        "10-42-0-01.invocation.nvcf.svc.cluster.local:8443",
        "1-2-3.invocation.nvcf.svc.cluster.local:8443",
        f"{POD}:8443x",
    ):
        assert not re.fullmatch(regex, bad), bad


def test_row_not_found_upstream_port_follows_the_policy() -> None:
    plain = hcm(bootstrap(ProxyPolicy(upstream_tls=False)))["route_config"]["virtual_hosts"][0]
    assert plain["domains"] == ["*.invocation.nvcf.svc.cluster.local:8080"]


# -- row: CONNECT disabled -> 404 NR; enabled -> 200 and a raw tunnel to host:8443 ----------------
def test_row_connect_absent_unless_enabled() -> None:
    config = bootstrap(ProxyPolicy(connect_enabled=False))
    assert not [k for k, _ in walk(config) if k in ("connect_matcher", "upgrade_configs", "connect_config")]
    assert "invocation_pods_connect" not in cluster_names(config)


def test_row_connect_enabled_terminates_connect_and_tunnels_raw_tcp() -> None:
    config = bootstrap(ProxyPolicy(connect_enabled=True))
    assert hcm(config)["upgrade_configs"] == [{"upgrade_type": "CONNECT"}]
    route = next(
        r for r in hcm(config)["route_config"]["virtual_hosts"][0]["routes"] if r["name"] == "connect_tunnel"
    )
    assert route["match"]["connect_matcher"] == {}
    assert route["route"]["upgrade_configs"] == [{"upgrade_type": "CONNECT", "connect_config": {}}]
    assert route["route"]["cluster"] == "invocation_pods_connect"
    tunnel = cluster(config, "invocation_pods_connect")
    assert "transport_socket" not in tunnel  # the legacy worker's own TLS runs inside the tunnel
    assert {h["name"]: h["string_match"]["safe_regex"]["regex"] for h in route["match"]["headers"]} == {
        ":authority": base.pod_authority_regex(8443)
    }


# -- row: pod refuses / wrong CA or name -> 503 UF (CERTIFICATE_VERIFY_FAILED); no DNS -> 503 DF ---
def test_row_upstream_failures_verify_against_the_invocation_secret_ca() -> None:
    config = render_envoy(DEFAULT, WD)
    tls = cluster(config.bootstrap, "invocation_pods_tls")["transport_socket"]
    assert tls["name"] == "envoy.transport_sockets.tls"
    sds = tls["typed_config"]["common_tls_context"]["validation_context_sds_secret_config"]
    assert sds["name"] == "invocation_ca"
    assert sds["sds_config"]["path_config_source"]["path"] == f"{base.SDS_DIR}/invocation_ca.yaml"
    (secret,) = config.sds["invocation_ca.yaml"]["resources"]
    assert secret["validation_context"]["trusted_ca"] == {"filename": f"{base.INVOCATION_CA_DIR}/ca.crt"}


def test_row_upstream_failures_are_not_retried_or_timed_out() -> None:
    config = bootstrap(ProxyPolicy(connect_enabled=True))
    assert not [
        k for k, _ in walk(config) if k in ("retry_policy", "retry_on", "hedge_policy")
    ]  # 503 UF surfaces
    assert all(c["connect_timeout"] == base.CONNECT_TIMEOUT for c in config["static_resources"]["clusters"])


def test_row_unresolvable_pod_name_is_a_dns_cache_miss() -> None:
    # DF comes from the dynamic forward proxy's DNS cache: names resolve through cluster DNS, where
    # the headless `invocation` Service answers <dashed-ip>.invocation.nvcf.svc.cluster.local.
    assert base.DNS_CACHE == {"name": "pod_names", "dns_lookup_family": "V4_ONLY"}
    assert (
        cluster(bootstrap(), "invocation_pods_tls")["cluster_type"]["typed_config"]["dns_cache_config"]
        == base.DNS_CACHE
    )


# -- row: codec errors: CL+TE 400 DPE, other TE 501, headers 60 KiB/100 431, '#' 400, HTTP/1.0 426 -
def test_row_codec_limits_match_the_policy() -> None:
    manager = hcm(bootstrap())
    assert manager["codec_type"] == "HTTP1"
    assert manager["max_request_headers_kb"] * 1024 == MAX_HEADERS_BYTES == 60 * 1024
    assert manager["common_http_protocol_options"]["max_headers_count"] == MAX_HEADERS_COUNT == 100
    assert (
        manager["common_http_protocol_options"]["headers_with_underscores_action"] == "ALLOW"
    )  # as the policy


def test_row_codec_http1_options_reject_http10_and_chunked_with_length() -> None:
    options = hcm(bootstrap())["http_protocol_options"]
    assert options == {"allow_absolute_url": True, "accept_http_10": False, "allow_chunked_length": False}
    # Nothing relaxes the codec's own refusals (other Transfer-Encoding 501, '#' and bad request lines 400).


# -- row: no route timeout for request-attach; idle stream 5 min -> 408 SI -------------------------
def test_row_long_lived_callbacks_have_no_route_timeout_but_an_idle_timeout() -> None:
    config = bootstrap(ProxyPolicy(connect_enabled=True))
    routes = [route for key, value in walk(config) if key == "routes" for route in value]
    assert len(routes) == 3 and all(r["route"]["timeout"] == "0s" for r in routes)
    for name in ("worker_callback_http", "worker_callback_h3"):
        assert hcm(config, name)["stream_idle_timeout"] == "300s"
        assert "request_timeout" not in hcm(config, name)


# -- the default access log with response flags ---------------------------------------------------
def test_access_log_is_envoys_default_format_on_stdout() -> None:
    config = bootstrap()
    for name in ("worker_callback_http", "worker_callback_h3"):
        (log,) = hcm(config, name)["access_log"]
        assert log["typed_config"] == {
            "@type": base.FILE_LOG,
            "path": "/dev/stdout",
        }  # no log_format: default


# -- certificates: file-based SDS, reloaded on a Secret swap --------------------------------------
def test_frontend_certificate_comes_from_a_watched_secret_mount() -> None:
    config = render_envoy(DEFAULT, WD)
    for name in ("worker_callback_http", "worker_callback_h3"):
        socket = listener(config.bootstrap, name)["filter_chains"][0]["transport_socket"]["typed_config"]
        context = socket.get("common_tls_context") or socket["downstream_tls_context"]["common_tls_context"]
        assert [s["name"] for s in context["tls_certificate_sds_secret_configs"]] == ["frontend"]
    (secret,) = config.sds["frontend.yaml"]["resources"]
    assert secret["@type"] == base.SECRET
    assert secret["tls_certificate"]["watched_directory"] == {
        "path": base.FRONTEND_DIR
    }  # ..data swaps land here
    assert secret["tls_certificate"]["certificate_chain"] == {"filename": f"{base.FRONTEND_DIR}/tls.crt"}
    for name in ("invocation_ca.yaml", "grpc_ca.yaml"):
        (ca,) = config.sds[name]["resources"]
        assert ca["validation_context"]["watched_directory"]["path"] in (
            base.INVOCATION_CA_DIR,
            base.GRPC_CA_DIR,
        )


# -- plain HTTP upstream ----------------------------------------------------------------------------
def test_plain_http_upstream_when_upstream_tls_is_off() -> None:
    config = bootstrap(ProxyPolicy(upstream_tls=False))
    assert "invocation_pods_tls" not in cluster_names(config)
    plain = cluster(config, "invocation_pods_plain")
    assert "transport_socket" not in plain
    assert plain["cluster_type"]["typed_config"]["allow_insecure_cluster_options"] is True
    assert (
        hcm(config)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"]
        == "invocation_pods_plain"
    )


# -- the QUIC front: UDP 443, re-encrypted over HTTP/3 to grpc-proxy pods on UDP 10084 -------------
def test_quic_listener_on_udp_443_with_the_frontend_certificate() -> None:
    quic = listener(bootstrap(), "worker_callback_h3")
    assert quic["address"]["socket_address"] == {"protocol": "UDP", "address": "0.0.0.0", "port_value": 443}
    assert quic["udp_listener_config"]["quic_options"] == {}
    assert "downstream_socket_config" in quic["udp_listener_config"]
    socket = quic["filter_chains"][0]["transport_socket"]
    assert (
        socket["name"] == "envoy.transport_sockets.quic" and socket["typed_config"]["@type"] == base.QUIC_DOWN
    )
    assert socket["typed_config"]["downstream_tls_context"]["common_tls_context"]["alpn_protocols"] == ["h3"]
    manager = hcm(bootstrap(), "worker_callback_h3")
    assert manager["codec_type"] == "HTTP3" and manager["http3_protocol_options"] == {}


def test_quic_upstream_is_http3_and_accepts_only_the_grpc_headless_name() -> None:
    upstream = cluster(bootstrap(), "grpc_pods_h3")
    options = upstream["typed_extension_protocol_options"][base.HTTP_OPTIONS_KEY]
    assert options["explicit_http_config"] == {"http3_protocol_options": {}}
    assert options["upstream_http_protocol_options"] == {"auto_sni": True, "auto_san_validation": False}
    transport = upstream["transport_socket"]
    assert transport["name"] == "envoy.transport_sockets.quic"
    combined = transport["typed_config"]["upstream_tls_context"]["common_tls_context"][
        "combined_validation_context"
    ]
    assert combined["default_validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": GRPC_WILDCARD}}
    ]
    assert combined["validation_context_sds_secret_config"]["name"] == "grpc_ca"


@pytest.mark.parametrize(
    ("authority", "pod"),
    [
        (f"10-42-0-41.{WD}", "10-42-0-41.grpc-headless.nvcf.svc.cluster.local:10084"),
        (f"10-42-0-41.{WD}:443", "10-42-0-41.grpc-headless.nvcf.svc.cluster.local:10084"),
        (f"invocation.{WD}", None),
        (f"10-42-0-41.{WD}.evil", None),
        ("10-42-0-41.other.example", None),
        (f"10-42-0-999.{WD}", None),
    ],
)
def test_quic_route_forwards_a_dashed_pod_label_to_that_grpc_proxy_pod(
    authority: str, pod: str | None
) -> None:
    manager = hcm(bootstrap(), "worker_callback_h3")
    route = select_route(
        manager["route_config"], {":method": "POST", ":authority": authority, ":path": "/v1/proxy"}
    )
    if pod is None:
        assert route is None
        return
    assert route is not None and route["route"]["cluster"] == "grpc_pods_h3"
    per_route = route["typed_per_filter_config"]["envoy.filters.http.dynamic_forward_proxy"]
    assert per_route == {"@type": base.DFP_PER_ROUTE, "host_rewrite_header": quic.GRPC_POD_HEADER}
    # The Lua filter's pattern ^([0-9-]+)%. is Python's ^([0-9-]+)\. : the pod name it writes follows.
    label = re.match(r"^([0-9-]+)\.", authority)
    assert label and f"{label[1]}.grpc-headless.nvcf.svc.cluster.local:10084" == pod
    assert (
        f'"{quic.GRPC_POD_HEADER}"' in quic.LUA_SOURCE
        and "grpc-headless.nvcf.svc.cluster.local:10084" in quic.LUA_SOURCE
    )
    assert [f["name"] for f in manager["http_filters"]] == [
        "envoy.filters.http.lua",
        "envoy.filters.http.dynamic_forward_proxy",
        "envoy.filters.http.router",
    ]


def test_config_uses_only_v3_type_urls_and_is_json() -> None:
    for policy in POLICIES:
        config = render_envoy(policy, WD)
        json.dumps(config.bootstrap)
        types = [v for k, v in walk([config.bootstrap, config.sds]) if k == "@type"]
        assert types and all(t.startswith("type.googleapis.com/envoy.") and ".v3." in t for t in types)


def test_both_listeners_match_only_the_worker_domain_sni() -> None:
    """A ClientHello or QUIC Initial for another name finds no filter chain, as the local fronts refuse it."""
    listeners = {
        lst["name"]: lst for lst in render_envoy(DEFAULT, WD).bootstrap["static_resources"]["listeners"]
    }
    for listener in listeners.values():
        assert [c["filter_chain_match"]["server_names"] for c in listener["filter_chains"]] == [[f"*.{WD}"]]
    inspectors = [f["name"] for f in listeners["worker_callback_http"]["listener_filters"]]
    assert inspectors == ["envoy.filters.listener.tls_inspector"]  # TCP needs it to read the SNI
