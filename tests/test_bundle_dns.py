"""A compute cluster's CoreDNS configuration read as CoreDNS reads it (scenarios/bundle/corefile.py,
resolve.py): the forms customers write for callbacks, each answering the two callback names (HTTP's
invocation.<workerDomain>, gRPC's <dashed-pod-ip>.<workerDomain>) as CoreDNS would, citing its line; and
each replayed by the DNS model (records.py) so the replay answers those names as that CoreDNS does."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bundle_support import COREFILE, DOMAIN, LB_ADDRESS, PROXY_SERVICE, rewrite_override, template_server

from dns.rule import View, answer
from scenarios.bundle.archive import read_bundle
from scenarios.bundle.corefile import CorefileError, parse_cluster, parse_corefile, tokens
from scenarios.bundle.records import replayed_dns
from scenarios.bundle.resolve import resolve, rule_domain, rules
from scenarios.bundle.world import ComputeDns, ProxyService, read_world
from scenarios.load import scenario_from_data
from sim.errors import ConfigError
from sim.model.parts import PROXY_LB_IP

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


# -- the replay: each form as the DNS model answers it (scenarios/bundle/records.py) ------------------------
SERVICE = ProxyService("LoadBalancer", "10.43.12.7", (LB_ADDRESS,), ("10084/TCP",), "services.yaml:19")
PROXY_ANSWER, NX = PROXY_LB_IP, "NXDOMAIN"  # the replaying stack's load-balancer address; no answer

# (form, the compute cluster's scenario entry, HTTP's answer, gRPC's answer, what is assumed)
REPLAYS = [
    ("template .server", {"dnsRewrite": {"target": "proxy"}}, PROXY_ANSWER, PROXY_ANSWER, []),
    (
        "regex rewrite to a Service",
        {"dnsRecords": [{"kind": "regex", "name": rf"(.*)\.{ESC}", "target": PROXY_SERVICE}]},
        NX,  # the compute cluster has no such Service: NXDOMAIN, as CoreDNS's kubernetes plugin answers
        NX,
        [],
    ),
    (
        "suffix rewrite, answer auto",
        {"dnsRecords": [{"kind": "suffix", "name": f".{DOMAIN}", "target": ".proxy.nvcf.svc.cluster.local"}]},
        NX,
        NX,
        [],
    ),
    (
        "exact rewrite: HTTP only",
        {"dnsRecords": [{"kind": "exact", "name": HTTP, "target": PROXY_SERVICE}]},
        NX,
        NX,  # no rule: forwarded upstream, which is taken to have no *.<workerDomain> either
        [],
    ),
    ("block rewrite (ncpsim dns-rewrite's form)", {"dnsRewrite": {"target": PROXY_SERVICE}}, NX, NX, []),
    (
        "hosts: an exact record alone",
        {"dnsRecords": [{"kind": "exact", "name": HTTP, "target": "proxy"}]},
        PROXY_ANSWER,  # HTTP callbacks work ...
        NX,  # ... gRPC's <dashed-pod-ip>.<workerDomain> do not
        [],
    ),
    (
        "forward the domain to another resolver",
        {"dnsRewrite": {"target": "proxy"}},
        PROXY_ANSWER,
        PROXY_ANSWER,
        ["dns"],
    ),
    (
        "a template for another domain",
        {"dnsRewrite": {"target": "proxy", "domain": "callback.example.com"}},
        NX,
        NX,
        [],
    ),
    ("nothing for callbacks", {"dnsRewrite": {"target": "proxy"}}, PROXY_ANSWER, PROXY_ANSWER, ["dns"]),
]
CUSTOM = {form[0]: form[1] for form in FORMS}


def replayed_view(entry: dict) -> View:
    """The compute cluster's DNS view as a scenario with `entry` builds it (the path a replay takes)."""
    data = {
        "name": "dns-as-found",
        "summary": "a compute cluster's DNS as the bundle shows it",
        "values": {
            "workerCallbackProxy": {
                "enabled": True,
                "workerDomain": DOMAIN,
                "service": {"type": "LoadBalancer"},
            }
        },
        "topology": {"computeClusters": [{**entry, "workers": [{"count": 1}]}]},
        "steps": [{"invoke": {"function": "http-echo"}}],
    }
    scenario = scenario_from_data(data, Path("as-found.yaml"))
    return scenario.build_topology("as-found").dns_views()["ncpsim-compute-1"]


def shown(view: View, name: str) -> str:
    found = answer(view, name, "A")
    return found.addresses[0] if found.addresses else found.rcode


@pytest.mark.parametrize(("form", "entry", "http", "grpc", "kinds"), REPLAYS, ids=[r[0] for r in REPLAYS])
def test_each_form_replays_as_coredns_answers(
    form: str, entry: dict, http: str, grpc: str, kinds: list
) -> None:
    blocks, _ = parse_cluster(COREFILE, CUSTOM[form])
    dns = ComputeDns("gpu-1", "compute/gpu-1/coredns.yaml", tuple(blocks), {}, {})
    replayed = replayed_dns(dns, DOMAIN, SERVICE)
    assert replayed.cluster(DOMAIN) == entry
    assert [a.kind for a in replayed.assumed] == kinds  # a forward is said as assumed, never silently
    view = replayed_view(entry)
    assert (shown(view, HTTP), shown(view, GRPC)) == (http, grpc)


def test_the_replay_of_an_exact_record_is_what_keeps_grpc_failing() -> None:
    """Negative controls for the two forms the old model approximated: the wildcard it wrote for an exact
    record answers gRPC's name too, and a cluster that has the rewrite's Service answers HTTP's."""
    wildcard_view = replayed_view({"dnsRewrite": {"target": "proxy"}})
    assert shown(wildcard_view, GRPC) == PROXY_ANSWER
    exact = replayed_view({"dnsRecords": [{"kind": "exact", "name": HTTP, "target": "proxy"}]})
    assert shown(exact, GRPC) == NX
    rewrite = replayed_view({"dnsRewrite": {"target": PROXY_SERVICE}})
    with_service = View(rewrite.cluster, hosts=((PROXY_SERVICE, PROXY_ANSWER),), records=rewrite.records)
    assert (shown(rewrite, HTTP), shown(with_service, HTTP)) == (NX, PROXY_ANSWER)


@pytest.mark.parametrize(
    ("custom", "said"),
    [
        ({"a.override": "rewrite name prefix invocation. proxy.\n"}, "prefix rewrite (not modelled)"),
        ({"a.override": f"rewrite continue name exact {HTTP} {PROXY_SERVICE}\n"}, "`rewrite continue`"),
    ],
    ids=["prefix", "continue"],
)
def test_a_form_the_model_does_not_hold_is_said(custom: dict, said: str) -> None:
    blocks, _ = parse_cluster(COREFILE, custom)
    dns = ComputeDns(
        "gpu-1", "compute/gpu-1/coredns.yaml", tuple(blocks), {}, {"coredns-custom/a.override": 30}
    )
    replayed = replayed_dns(dns, DOMAIN, SERVICE)
    assert any(said in a.what and "coredns.yaml:31" in a.what for a in replayed.assumed), replayed.assumed


def test_with_no_services_yaml_an_answered_address_is_taken_for_the_proxys() -> None:
    blocks, _ = parse_cluster(COREFILE, template_server())
    replayed = replayed_dns(ComputeDns("gpu-1", "c.yaml", tuple(blocks), {}, {}), DOMAIN, None)
    assert replayed.cluster(DOMAIN) == {"dnsRewrite": {"target": "proxy"}}
    assert any("no services.yaml" in a.what for a in replayed.assumed)


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [(r"(.+)+x", "repeated group of repeats"), (r"(?=a)b", "not RE2"), (r"(.*)\.a\.example\.com", None)],
    ids=["nested-repeat", "lookahead", "plain (control)"],
)
def test_a_bundle_regex_python_could_not_match_safely_is_refused_in_one_line(
    tmp_path: Path, pattern: str, refused: str | None
) -> None:
    """A hostile bundle's regex would run in Python's backtracking matcher against callback names: a
    repeated group of repeats (exponential there) or a form RE2 lacks is refused, naming its line."""
    (tmp_path / "compute" / "gpu-1").mkdir(parents=True)
    (tmp_path / "environment.yaml").write_text(
        f"workerCallbackProxy: {{enabled: true, workerDomain: {DOMAIN}}}\n"
    )
    custom = {"x.override": f"rewrite name regex {pattern} proxy.example.com\n"}
    maps = [("coredns", {"Corefile": COREFILE}), ("coredns-custom", custom)]
    items = [{"metadata": {"name": name}, "data": data} for name, data in maps]
    (tmp_path / "compute" / "gpu-1" / "coredns.yaml").write_text(
        yaml.safe_dump({"kind": "List", "items": items})
    )
    if refused is None:
        assert read_world(read_bundle(tmp_path)).compute
        return
    with pytest.raises(ConfigError, match=rf"^compute/gpu-1/coredns\.yaml:\d+: .*{refused}") as caught:
        read_world(read_bundle(tmp_path))
    assert "\n" not in str(caught.value)
