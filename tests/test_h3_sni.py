"""The proxy HTTP/3 front's pure choices: which pod an SNI names, and which frontend Secret it serves."""

from __future__ import annotations

import pytest

from sim.model.values import proxy_settings
from sim.proxy.h3_policy import PodRoute, Refusal, decide_sni

DOMAIN = "grpc-worker.example.com"


@pytest.mark.parametrize(
    ("sni", "decision"),
    [
        (f"10-42-0-41.{DOMAIN}", PodRoute("10.42.0.41")),
        (f"10-42-0-41.{DOMAIN.upper()}.", PodRoute("10.42.0.41")),  # case and a trailing dot do not matter
        (f"10-52-3-7.{DOMAIN}", PodRoute("10.52.3.7")),  # any dashed IP: DNS decides whether it is a pod
        (f"invocation.{DOMAIN}", Refusal(404, "NR", "route_not_found")),
        (f"10-42-0-410.{DOMAIN}", Refusal(404, "NR", "route_not_found")),
        (f"010-42-0-41.{DOMAIN}", Refusal(404, "NR", "route_not_found")),
        (f"a.10-42-0-41.{DOMAIN}", Refusal(404, "NR", "route_not_found")),
        (
            f"10-42-0-41.{DOMAIN}.evil.example",
            Refusal(0, "NR", f"no filter chain matches server name '10-42-0-41.{DOMAIN}.evil.example'"),
        ),
        (DOMAIN, Refusal(0, "NR", f"no filter chain matches server name '{DOMAIN}'")),
        (
            f"10-42-0-41.x{DOMAIN}",
            Refusal(0, "NR", f"no filter chain matches server name '10-42-0-41.x{DOMAIN}'"),
        ),
        (None, Refusal(0, "NR", "no filter chain matches server name None")),
        ("", Refusal(0, "NR", "no filter chain matches server name ''")),
    ],
)
def test_decide_sni(sni: str | None, decision: PodRoute | Refusal) -> None:
    assert decide_sni(sni, DOMAIN) == decision


def test_upstream_name_is_covered_by_the_pod_certificate() -> None:
    assert PodRoute("10.42.0.41").upstream_name == "10-42-0-41.grpc-headless.nvcf.svc.cluster.local"


@pytest.mark.parametrize(
    ("frontend", "secret"),
    [
        ({}, "worker-callback-proxy-frontend-tls"),
        (
            {"certificate": {"issuerRef": {"kind": "ClusterIssuer", "name": "letsencrypt"}}},
            "worker-public-tls",
        ),
        ({"existingSecret": "worker-public-tls"}, "worker-public-tls"),
    ],
)
def test_frontend_secret(frontend: dict, secret: str) -> None:
    values = {"workerCallbackProxy": {"enabled": True, "workerDomain": DOMAIN, "tls": {"frontend": frontend}}}
    assert proxy_settings(values).frontend_secret == secret
