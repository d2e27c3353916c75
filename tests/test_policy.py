"""The proxy's routing decision, table-driven (DESIGN.md section 3)."""

from __future__ import annotations

import pytest

from sim.proxy.policy import Forward, ProxyPolicy, Reject, RequestHead, Tunnel, decide, pod_host

POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
ATTACH = "/v2/nvcf/worker/request-attach"
TLS = ProxyPolicy()
PLAIN = ProxyPolicy(upstream_tls=False)
CONNECT_ON = ProxyPolicy(connect_enabled=True)
H = (("host", f"{POD}:8443"),)


def head(method: str, target: str, version: str = "1.1", headers: tuple = H) -> RequestHead:
    return RequestHead(method=method, target=target, http_version=version, headers=headers)


ROUTES = [
    # (why, head, policy, expected)
    ("callback GET", head("GET", f"http://{POD}:8443{ATTACH}"), TLS, Forward(POD, 8443, ATTACH, True)),
    ("callback POST", head("POST", f"http://{POD}:8443{ATTACH}"), TLS, Forward(POD, 8443, ATTACH, True)),
    (
        "query ignored, kept",
        head("GET", f"http://{POD}:8443{ATTACH}?a=1"),
        TLS,
        Forward(POD, 8443, ATTACH + "?a=1", True),
    ),
    (
        "plaintext upstream on 8080",
        head("GET", f"http://{POD}:8080{ATTACH}"),
        PLAIN,
        Forward(POD, 8080, ATTACH, False),
    ),
    ("8443 while upstream TLS is off", head("GET", f"http://{POD}:8443{ATTACH}"), PLAIN, 404),
    ("other path", head("GET", f"http://{POD}:8443/v2/nvcf/pexec/functions/x"), TLS, 404),
    ("path prefix", head("GET", f"http://{POD}:8443{ATTACH}/x"), TLS, 404),
    (";params", head("GET", f"http://{POD}:8443{ATTACH};a=b"), TLS, 404),
    ("upper case", head("GET", f"http://{POD}:8443/V2/nvcf/worker/request-attach"), TLS, 404),
    ("double slash", head("GET", f"http://{POD}:8443//v2/nvcf/worker/request-attach"), TLS, 404),
    ("dot-dot", head("GET", f"http://{POD}:8443/v2/nvcf/x/../worker/request-attach"), TLS, 404),
    ("encoded dot-dot", head("GET", f"http://{POD}:8443/v2/nvcf/x/%2e%2e/worker/request-attach"), TLS, 404),
    ("encoded slash", head("GET", f"http://{POD}:8443/v2%2fnvcf/worker/request-attach"), TLS, 404),
    ("wrong port", head("GET", f"http://{POD}:9000{ATTACH}"), TLS, 404),
    ("no port", head("GET", f"http://{POD}{ATTACH}"), TLS, 404),
    ("other host", head("GET", f"http://example.com:8443{ATTACH}"), TLS, 404),
    ("not a dashed IP", head("GET", f"http://abc.invocation.nvcf.svc.cluster.local:8443{ATTACH}"), TLS, 404),
    (
        "two labels",
        head("GET", f"http://x.10-42-0-11.invocation.nvcf.svc.cluster.local:8443{ATTACH}"),
        TLS,
        404,
    ),
    (
        "grpc-headless host",
        head("GET", f"http://10-42-0-41.grpc-headless.nvcf.svc.cluster.local:8443{ATTACH}"),
        TLS,
        404,
    ),
    ("upper-case host", head("GET", f"http://{POD.upper()}:8443{ATTACH}"), TLS, 404),
    ("https scheme", head("GET", f"https://{POD}:8443{ATTACH}"), TLS, 404),
    ("ftp scheme", head("GET", f"ftp://{POD}:8443{ATTACH}"), TLS, 404),
    ("origin form", head("GET", ATTACH), TLS, 404),
    ("user-info", head("GET", f"http://user:pw@{POD}:8443{ATTACH}"), TLS, 400),
    ("fragment", head("GET", f"http://{POD}:8443{ATTACH}#frag"), TLS, 400),
    ("HTTP/1.0", head("GET", f"http://{POD}:8443{ATTACH}", version="1.0"), TLS, 426),
    ("lower-case method", head("get", f"http://{POD}:8443{ATTACH}"), TLS, 400),
    ("CONNECT while disabled", head("CONNECT", f"{POD}:8443"), TLS, 404),
    ("CONNECT enabled", head("CONNECT", f"{POD}:8443"), CONNECT_ON, Tunnel(POD, 8443)),
    ("CONNECT to another host", head("CONNECT", "example.com:443"), CONNECT_ON, 404),
    ("CONNECT to another port", head("CONNECT", f"{POD}:22"), CONNECT_ON, 404),
    (
        "CL with TE",
        head(
            "POST",
            f"http://{POD}:8443{ATTACH}",
            headers=H + (("content-length", "3"), ("transfer-encoding", "chunked")),
        ),
        TLS,
        400,
    ),
    (
        "gzip TE",
        head("POST", f"http://{POD}:8443{ATTACH}", headers=H + (("transfer-encoding", "gzip"),)),
        TLS,
        501,
    ),
    (
        "101 headers",
        head("GET", f"http://{POD}:8443{ATTACH}", headers=H + tuple((f"x-{i}", "v") for i in range(100))),
        TLS,
        431,
    ),
    (
        "61 KiB of headers",
        head("GET", f"http://{POD}:8443{ATTACH}", headers=H + (("x-big", "a" * 61 * 1024),)),
        TLS,
        431,
    ),
]


@pytest.mark.parametrize(("why", "request_head", "policy", "expected"), ROUTES, ids=[r[0] for r in ROUTES])
def test_decide(why: str, request_head: RequestHead, policy: ProxyPolicy, expected: object) -> None:
    decision = decide(request_head, policy)
    if isinstance(expected, int):
        assert isinstance(decision, Reject), decision
        assert decision.status == expected
        flag = {404: "NR", 426: "-"}.get(expected, "DPE")
        assert decision.flag == flag
    else:
        assert decision == expected


@pytest.mark.parametrize(
    ("authority", "port", "expected"),
    [
        (f"{POD}:8443", 8443, POD),
        (f"{POD}:8443", 8080, None),
        ("10-42-0-256.invocation.nvcf.svc.cluster.local:8443", 8443, None),
        ("10-42-0.invocation.nvcf.svc.cluster.local:8443", 8443, None),
        (".invocation.nvcf.svc.cluster.local:8443", 8443, None),
        (f"{POD}", 8443, None),
    ],
)
def test_pod_host(authority: str, port: int, expected: str | None) -> None:
    assert pod_host(authority, port) == expected


def test_no_forward_ever_leaves_the_allowed_form() -> None:
    """Whatever the table throws at it, a Forward always names a pod on the worker port and the callback path."""
    for _, request_head, policy, _ in ROUTES:
        decision = decide(request_head, policy)
        if isinstance(decision, Forward):
            assert pod_host(decision.authority, policy.upstream_port) == decision.host
            assert decision.path.split("?")[0] == ATTACH
