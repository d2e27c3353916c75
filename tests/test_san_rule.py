"""One certificate-name rule (sim.proxy.san): Envoy's DNS SAN matching, from a table, and the rendered Envoy
config derived from the same rule the local fronts apply."""

from __future__ import annotations

import pytest

from certs.profiles import GRPC_WILDCARD
from clusters.render.envoy import render_envoy
from sim.proxy.policy import ProxyPolicy
from sim.proxy.san import GRPC_UPSTREAM, INVOCATION_UPSTREAM, SanRule, dns_name_match, peercert_dns_sans

POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
GRPC_POD = "10-42-0-41.grpc-headless.nvcf.svc.cluster.local"


@pytest.mark.parametrize(
    ("name", "san", "matches"),
    [
        (POD, POD, True),
        (POD, POD.upper(), True),  # case-insensitive
        (POD, "*.invocation.nvcf.svc.cluster.local", True),
        (POD, "*.nvcf.svc.cluster.local", False),  # one label only
        (POD, "10-42-0-*.invocation.nvcf.svc.cluster.local", True),  # Envoy takes a partial wildcard
        (POD, "*-11.invocation.nvcf.svc.cluster.local", True),
        (POD, "*1*.invocation.nvcf.svc.cluster.local", False),  # one * at most
        (POD, "xn--*.invocation.nvcf.svc.cluster.local", False),  # never in an A-label
        (POD, "*.*.nvcf.svc.cluster.local", False),
        ("localhost", "*", False),  # a pattern needs two labels
        # the expected string is taken as it is: a wildcard there matches only that literal SAN
        (GRPC_WILDCARD, GRPC_WILDCARD, True),
        (GRPC_WILDCARD, GRPC_WILDCARD.upper(), True),
        (GRPC_WILDCARD, GRPC_POD, False),
        (GRPC_WILDCARD, "*.nvcf.svc.cluster.local", False),
    ],
)
def test_dns_name_match_is_envoys(name: str, san: str, matches: bool) -> None:
    assert dns_name_match(name, san) is matches


@pytest.mark.parametrize(
    ("rule", "sans", "host", "accepted"),
    [
        (INVOCATION_UPSTREAM, ("*.invocation.nvcf.svc.cluster.local",), POD, True),
        (INVOCATION_UPSTREAM, (POD,), POD, True),
        (INVOCATION_UPSTREAM, ("*.invocation.nvcf.svc",), POD, False),
        (INVOCATION_UPSTREAM, (), POD, False),
        (GRPC_UPSTREAM, (GRPC_WILDCARD,), GRPC_POD, True),
        (GRPC_UPSTREAM, (GRPC_POD, GRPC_WILDCARD), GRPC_POD, True),
        # the seed's case: a grpc-proxy pod certificate issued for the pod's own name is refused ...
        (GRPC_UPSTREAM, (GRPC_POD,), GRPC_POD, False),
        # ... which a hostname check of the pod name (the negative control: auto SAN) would take
        (SanRule(), (GRPC_POD,), GRPC_POD, True),
    ],
)
def test_upstream_rules(rule: SanRule, sans: tuple[str, ...], host: str, accepted: bool) -> None:
    assert rule.accepts(sans, host) is accepted


def test_the_rendered_envoy_config_is_derived_from_the_same_rules() -> None:
    clusters = {
        c["name"]: c
        for c in render_envoy(ProxyPolicy(), "grpc-worker.example.com").bootstrap["static_resources"][
            "clusters"
        ]
    }
    grpc = clusters["grpc_pods_h3"]
    context = grpc["transport_socket"]["typed_config"]["upstream_tls_context"]["common_tls_context"]
    validation = context["combined_validation_context"]["default_validation_context"]
    assert validation == GRPC_UPSTREAM.envoy_validation()
    assert validation["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": "*.grpc-headless.nvcf.svc.cluster.local"}}
    ]
    options = next(iter(clusters["invocation_pods_tls"]["typed_extension_protocol_options"].values()))
    assert options["upstream_http_protocol_options"] == {"auto_sni": True, "auto_san_validation": True}
    assert INVOCATION_UPSTREAM.envoy_validation() == {}


def test_python_peercert_sans() -> None:
    peer = {"subjectAltName": (("DNS", POD), ("IP Address", "10.42.0.11"), ("DNS", "b"))}
    assert peercert_dns_sans(peer) == (POD, "b") and peercert_dns_sans(None) == ()
