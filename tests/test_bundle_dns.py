"""A compute cluster's CoreDNS configuration read as CoreDNS reads it (scenarios/bundle/corefile.py,
resolve.py): the forms customers write for callbacks, each answering the two callback names (HTTP's
invocation.<workerDomain>, gRPC's <dashed-pod-ip>.<workerDomain>) as CoreDNS would, citing its line."""

from __future__ import annotations

import pytest
from bundle_support import COREFILE, DOMAIN, LB_ADDRESS, PROXY_SERVICE, rewrite_override, template_server

from scenarios.bundle.corefile import CorefileError, parse_cluster, parse_corefile, tokens
from scenarios.bundle.resolve import resolve, rule_domain, rules

HTTP, GRPC = f"invocation.{DOMAIN}", f"10-42-0-41.{DOMAIN}"
ESC = DOMAIN.replace(".", r"\.")

# (coredns-custom data, HTTP's (outcome, value), gRPC's (outcome, value), the deciding key:line)
FORMS = [
    (
        "template .server",
        template_server(),
        ("address", LB_ADDRESS),
        ("address", LB_ADDRESS),
        "callbacks.server:3",
    ),
    (
        "regex rewrite to a Service",
        rewrite_override(),
        ("cluster-name", PROXY_SERVICE),
        ("cluster-name", PROXY_SERVICE),
        "callbacks.override:1",
    ),
    (
        "suffix rewrite, answer auto",
        {"a.override": f"rewrite name suffix .{DOMAIN} .proxy.nvcf.svc.cluster.local answer auto\n"},
        ("cluster-name", "invocation.proxy.nvcf.svc.cluster.local"),
        ("cluster-name", "10-42-0-41.proxy.nvcf.svc.cluster.local"),
        "a.override:1",
    ),
    (
        "exact rewrite: HTTP only",
        {"a.override": f"rewrite name exact {HTTP} {PROXY_SERVICE}\n"},
        ("cluster-name", PROXY_SERVICE),
        ("forwarded", "/etc/resolv.conf"),
        "a.override:1",
    ),
    (
        "block rewrite (ncpsim dns-rewrite's form)",
        {
            "w.override": f"rewrite stop {{\n    name regex ^(.+)\\.{ESC}\\.$ {PROXY_SERVICE}.\n    answer auto\n}}\n"
        },
        ("cluster-name", PROXY_SERVICE),
        ("cluster-name", PROXY_SERVICE),
        "w.override:2",
    ),
    (
        "hosts: an exact record alone",
        {"h.override": f"hosts {{\n  {LB_ADDRESS} {HTTP}\n  fallthrough\n}}\n"},
        ("address", LB_ADDRESS),
        ("forwarded", "/etc/resolv.conf"),
        "h.override:2",
    ),
    (
        "forward the domain to another resolver",
        {"f.server": f"{DOMAIN}:53 {{\n  forward . 10.0.0.53 10.0.0.54\n}}\n"},
        ("forwarded", "10.0.0.53 10.0.0.54"),
        ("forwarded", "10.0.0.53 10.0.0.54"),
        "f.server:2",
    ),
    (
        "a template for another domain",
        template_server("callback.example.com"),
        ("forwarded", "/etc/resolv.conf"),
        ("forwarded", "/etc/resolv.conf"),
        "Corefile:15",
    ),
    (
        "nothing for callbacks",
        {},
        ("forwarded", "/etc/resolv.conf"),
        ("forwarded", "/etc/resolv.conf"),
        "Corefile:15",
    ),
]


@pytest.mark.parametrize(("name", "custom", "http", "grpc", "line"), FORMS, ids=[f[0] for f in FORMS])
def test_each_form_answers_as_coredns_does(
    name: str, custom: dict, http: tuple, grpc: tuple, line: str
) -> None:
    blocks, notes = parse_cluster(COREFILE, custom)
    assert notes == []
    answered = resolve(blocks, HTTP)
    assert (answered.outcome, answered.value) == http
    assert (resolve(blocks, GRPC).outcome, resolve(blocks, GRPC).value) == grpc
    assert f"{answered.via[-1].origin.key}:{answered.via[-1].origin.line}" == line


def test_coredns_custom_keys_no_import_reaches_are_noted() -> None:
    """A Corefile without the imports (kubeadm's): coredns-custom is ignored by CoreDNS, and said to be."""
    plain = COREFILE.replace("    import /etc/coredns/custom/*.override\n", "").replace(
        "import /etc/coredns/custom/*.server\n", ""
    )
    blocks, notes = parse_cluster(plain, template_server())
    assert notes == [
        "coredns-custom callbacks.server: no import in the Corefile reaches it, so CoreDNS ignores it"
    ]
    assert resolve(blocks, HTTP).outcome == "forwarded"


def test_the_longest_zone_serves_a_name() -> None:
    blocks, _ = parse_cluster(COREFILE, {**template_server(), **rewrite_override()})
    assert resolve(blocks, HTTP).outcome == "address"  # the .server block for the domain, not .:53's rewrite
    assert resolve(blocks, "kubernetes.default.svc.cluster.local").outcome == "cluster-name"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (".:53 {\n  errors\n", "not closed"),
        ('.:53 {\n  template IN A x { answer "a\n}\n}\n', "not closed"),
        ("errors\n", "not followed by a { block"),
    ],
)
def test_a_broken_corefile_names_its_line(text: str, error: str) -> None:
    with pytest.raises(CorefileError, match=error):
        parse_corefile(text, "coredns", "Corefile")


def test_tokens_whole_byte_by_byte_and_with_trailing_data() -> None:
    text = '.:53 { # comment\n  template IN A x { answer "{{ .Name }} 60 IN A 1.2.3.4" }\n}\n'
    whole = [t.text for t in tokens(text)]
    assert whole == [
        ".:53",
        "{",
        "template",
        "IN",
        "A",
        "x",
        "{",
        "answer",
        "{{ .Name }} 60 IN A 1.2.3.4",
        "}",
        "}",
    ]
    assert [t.text for t in tokens(text + "# trailing\n")] == whole


def test_a_rules_domain_is_read_from_its_regex() -> None:
    blocks, _ = parse_cluster(
        COREFILE, {**rewrite_override("grpc-workers.example.com"), **template_server("b.example.com")}
    )
    assert sorted(rule_domain(r) for r in rules(blocks) if r.kind != "forward") == [
        "b.example.com",
        "grpc-workers.example.com",
    ]
