"""DNS as customers write it (dns.rule.DnsRecord), from tables: the match kinds, rewrites to names looked up
in the same view, exact records, and how a scenario's topology spells them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from dns.rule import PROXY, Answer, DnsRecord, View, answer, wildcard
from scenarios.load import load_scenario
from sim.errors import ConfigError, ScenarioError
from sim.model.parts import PROXY_LB_IP, DnsRewrite
from sim.model.topology import ComputeSpec, Topology, build
from sim.model.values import DEFAULTS, deep_merge

WD = "grpc-worker.example.com"
LB = "10.100.0.10"
SERVICE = "worker-callback-proxy.nvcf.svc.cluster.local"  # the make target's default rewrite target
POD = f"10-42-0-41.{WD}"  # a gRPC callback host
INVOCATION = f"invocation.{WD}"  # the HTTP callback proxy address
MAKE_TARGET = wildcard(WD, SERVICE)


# -- matching and rewriting, kind by kind ---------------------------------------------------------------
MATCHES = [
    # record, name (normalised), matches
    (DnsRecord("exact", INVOCATION, LB), INVOCATION, True),
    (DnsRecord("exact", INVOCATION.upper() + ".", LB), INVOCATION, True),
    (DnsRecord("exact", INVOCATION, LB), POD, False),
    (DnsRecord("exact", INVOCATION, LB), f"x.{INVOCATION}", False),
    (DnsRecord("suffix", f".{WD}", LB), POD, True),
    (DnsRecord("suffix", f".{WD}", LB), WD, False),  # the leading dot: names under it only
    (DnsRecord("suffix", WD, LB), WD, True),  # CoreDNS compares strings: the apex too ...
    (DnsRecord("suffix", WD, LB), f"x{WD}", True),  # ... and a name that merely ends the same
    (DnsRecord("regex", r"^(.+)\.grpc-worker\.example\.com\.$", LB), POD, True),
    (DnsRecord("regex", r"^(.+)\.grpc-worker\.example\.com\.$", LB), WD, False),
    (DnsRecord("regex", r"grpc-worker\.example\.com$", LB), POD, False),  # the FQDN ends in a dot
    (DnsRecord("regex", r"^10-42-", LB), POD, True),  # searched, not matched whole
]


@pytest.mark.parametrize(("record", "name", "expected"), MATCHES)
def test_matches(record: DnsRecord, name: str, expected: bool) -> None:
    assert record.matches(name) is expected


REWRITES = [
    # record, name asked, the name looked up instead (None: not rewritten)
    (DnsRecord("exact", INVOCATION, SERVICE), INVOCATION, SERVICE),
    (
        DnsRecord("exact", INVOCATION, "Proxy.Ops.svc.cluster.local."),
        INVOCATION,
        "proxy.ops.svc.cluster.local",
    ),
    (DnsRecord("exact", INVOCATION, SERVICE), POD, None),
    (DnsRecord("suffix", f".{WD}", ".ops.svc.cluster.local"), POD, "10-42-0-41.ops.svc.cluster.local"),
    # a suffix rewrite replaces the suffix: to a whole name it glues the label on, as CoreDNS does
    (DnsRecord("suffix", f".{WD}", SERVICE), INVOCATION, f"invocation{SERVICE}"),
    (MAKE_TARGET, POD, SERVICE),
    (MAKE_TARGET, WD, None),
    (
        DnsRecord("regex", r"^([^.]+)\.grpc-worker\.example\.com\.$", "{1}.ops.svc.cluster.local"),
        POD,
        "10-42-0-41.ops.svc.cluster.local",
    ),
    (
        DnsRecord("regex", r"^([^.]+)\.grpc-worker\.example\.com\.$", "{1}.ops.svc.cluster.local"),
        f"a.{POD}",
        None,
    ),
    (DnsRecord("regex", r"^(x)?10-42", "{1}.ops.svc.cluster.local"), POD, ""),  # ".ops...": no usable name
]


@pytest.mark.parametrize(("record", "name", "expected"), REWRITES)
def test_rewrite(record: DnsRecord, name: str, expected: str | None) -> None:
    assert record.is_rewrite
    assert record.rewrite(name) == expected


# -- a cluster's answers, as the seed's cases have them ---------------------------------------------------
EXPOSED = DnsRecord("exact", SERVICE, LB)  # the customer makes the name resolve to the proxy
EXACT_ONLY = DnsRecord("exact", INVOCATION, LB)
ANSWERS = [
    # records, name, qtype, answer
    # the make target's rewrite: the compute cluster has no worker-callback-proxy Service
    ((MAKE_TARGET,), INVOCATION, "A", Answer("NXDOMAIN", (), "rewrite")),
    ((MAKE_TARGET,), POD, "A", Answer("NXDOMAIN", (), "rewrite")),
    ((MAKE_TARGET,), SERVICE, "A", Answer("NXDOMAIN", (), "none")),
    # ... until the name resolves there: the answer keeps the name asked (answer auto), no CNAME
    ((MAKE_TARGET, EXPOSED), INVOCATION, "A", Answer("NOERROR", (LB,), "rewrite")),
    ((MAKE_TARGET, EXPOSED), POD, "A", Answer("NOERROR", (LB,), "rewrite")),
    ((MAKE_TARGET, EXPOSED), POD, "AAAA", Answer("NOERROR", (), "rewrite")),  # NODATA: the name exists
    ((EXPOSED, MAKE_TARGET), POD, "A", Answer("NOERROR", (LB,), "rewrite")),  # rewrites come first anyway
    ((MAKE_TARGET, EXPOSED), WD, "A", Answer("NXDOMAIN", (), "none")),
    # one exact record without the wildcard: the HTTP proxy name resolves, pod names do not
    ((EXACT_ONLY,), INVOCATION, "A", Answer("NOERROR", (LB,), "record")),
    ((EXACT_ONLY,), POD, "A", Answer("NXDOMAIN", (), "none")),
    ((EXACT_ONLY,), POD, "AAAA", Answer("NXDOMAIN", (), "none")),
    # the wildcard the seed asks for covers both
    ((wildcard(WD, LB),), POD, "A", Answer("NOERROR", (LB,), "record")),
    # the first address record that matches answers, as CoreDNS tries its templates in order
    (
        (DnsRecord("exact", INVOCATION, "10.100.0.99"), wildcard(WD, LB)),
        INVOCATION,
        "A",
        Answer("NOERROR", ("10.100.0.99",), "record"),
    ),
    (
        (wildcard(WD, LB), DnsRecord("exact", INVOCATION, "10.100.0.99")),
        INVOCATION,
        "A",
        Answer("NOERROR", (LB,), "record"),
    ),
    # the first rewrite that matches is the only one (rewrite stop), and is not rewritten again
    (
        (
            DnsRecord("exact", INVOCATION, "a.ops.svc.cluster.local"),
            DnsRecord("exact", "a.ops.svc.cluster.local", SERVICE),
            EXPOSED,
        ),
        INVOCATION,
        "A",
        Answer("NXDOMAIN", (), "rewrite"),
    ),
    # a rewrite whose result is no name is an error, as CoreDNS answers it
    (
        (DnsRecord("regex", r"^(x)?10-42", "{1}.ops.svc.cluster.local"),),
        POD,
        "A",
        Answer("SERVFAIL", (), "rewrite"),
    ),
]


@pytest.mark.parametrize(("records", "name", "qtype", "expected"), ANSWERS)
def test_answer(records: tuple[DnsRecord, ...], name: str, qtype: str, expected: Answer) -> None:
    assert answer(View("ncpsim-compute-1", records=records), name, qtype) == expected


def test_a_rewrite_finds_the_clusters_own_names_too() -> None:
    view = View("ncpsim-cp", hosts=((SERVICE, LB),), records=(MAKE_TARGET,))
    assert answer(view, POD, "A") == Answer("NOERROR", (LB,), "rewrite")


# -- refused at construction, with an example -------------------------------------------------------------
@pytest.mark.parametrize(
    ("build_it", "message"),
    [
        (lambda: DnsRecord("prefix", "invocation.", LB), "exact, suffix or regex"),
        (lambda: DnsRecord("exact", "*.grpc-worker.example.com", LB), "exact record name must be a DNS name"),
        (lambda: DnsRecord("suffix", "..example.com", LB), "the suffix must be a DNS name"),
        (lambda: DnsRecord("regex", r"^(.+\.example\.com\.$", LB), "does not compile"),
        (lambda: DnsRecord("regex", r"^(?=a)", LB), "not RE2"),
        (lambda: DnsRecord("regex", r"^(a)\1$", LB), "not RE2"),
        (lambda: DnsRecord("regex", r"^(a+)+$", LB), "repeated group"),
        (lambda: DnsRecord("exact", INVOCATION, "10.100.0.999"), "IPv4 address such as 10.100.0.10"),
        (lambda: DnsRecord("exact", INVOCATION, "proxyy"), "must be proxy, an IPv4 address"),
        (
            lambda: DnsRecord("exact", INVOCATION, "http://proxy.example.com"),
            "must be proxy, an IPv4 address",
        ),
        (
            lambda: DnsRecord("exact", INVOCATION, "{1}.ops.svc.cluster.local"),
            "must be proxy",
        ),  # groups: regex only
        (lambda: View("c", records=(DnsRecord("exact", INVOCATION, PROXY),)), "pointing_at"),
    ],
)
def test_refused_at_construction(build_it: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_it()


def test_proxy_is_filled_in_and_a_record_describes_itself() -> None:
    record = DnsRecord("exact", INVOCATION, PROXY)
    assert record.pointing_at(LB) == DnsRecord("exact", INVOCATION, LB)
    assert MAKE_TARGET.pointing_at(LB) is MAKE_TARGET
    assert wildcard(WD, LB).describe() == f"*.{WD} -> {LB}"
    assert MAKE_TARGET.describe() == rf"/^(.+)\.grpc-worker\.example\.com\.$/ -> {SERVICE}"


# -- a scenario's topology --------------------------------------------------------------------------------
def values() -> dict:
    return deep_merge(
        DEFAULTS,
        {"workerCallbackProxy": {"enabled": True, "workerDomain": WD, "service": {"type": "LoadBalancer"}}},
    )


def test_dns_rewrite_to_a_name_and_records_after_it() -> None:
    spec = ComputeSpec((), DnsRewrite(target=SERVICE), (DnsRecord("exact", SERVICE, PROXY),))
    topology = build("t", values(), compute=(spec,))
    assert topology.cluster("ncpsim-compute-1").dns_records == (MAKE_TARGET, EXPOSED)
    assert Topology.from_json(topology.to_json()) == topology  # what every component reads back


def test_catalogue_topologies_say_what_their_names_say() -> None:
    missing = load_scenario("dns-rewrite-to-missing-service").build_topology("t")
    assert missing.compute_clusters[0].dns_records == (MAKE_TARGET,)
    exact = load_scenario("dns-exact-invocation-record").build_topology("t")
    assert exact.compute_clusters[0].dns_records == (EXACT_ONLY,)  # no default wildcard beside it
    plain = load_scenario("http-callback").build_topology("t")
    assert plain.compute_clusters[0].dns_records == (wildcard(WD, PROXY_LB_IP),)


@pytest.mark.parametrize(
    ("cluster_yaml", "where", "message"),
    [
        (
            "dnsRecords: [{kind: prefix, name: a.example.com, target: proxy}]",
            "topology.computeClusters[0].dnsRecords[0].kind",
            "is not one of",
        ),
        (
            "dnsRecords: [{kind: exact, name: a.example.com, target: proxy}, {kind: regex, name: '(a+)+', target: proxy}]",
            ":9: topology.computeClusters[0].dnsRecords[1]",
            "repeated group",
        ),
        (
            "dnsRewrite: {target: worker callback proxy}",
            "topology.computeClusters[0].dnsRewrite.target",
            "expected form",
        ),
        ("dnsRewrite: {target: 10.100.0.999}", ":9: topology.computeClusters[0].dnsRewrite", "IPv4 address"),
        ("dnsRecords: [{kind: exact, name: a.example.com}]", "dnsRecords[0].target", "is required"),
    ],
)
def test_dns_mistakes_name_the_file_line_and_key(
    tmp_path: Path, cluster_yaml: str, where: str, message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nsummary: s\nvalues:\n  workerCallbackProxy:\n    enabled: true\n    workerDomain: "
        f"{WD}\ntopology:\n  computeClusters:\n    - {cluster_yaml}\nsteps:\n"
        "  - invoke: {function: http-echo}\n"
    )
    with pytest.raises(ScenarioError) as caught:
        load_scenario(str(path))
    assert where in str(caught.value) and message in str(caught.value), str(caught.value)


def test_a_bad_record_built_from_code_is_one_line_config_error() -> None:
    spec = ComputeSpec((), None, ())
    with pytest.raises(ConfigError, match="topology dnsRewrite"):
        build("t", values(), compute=(ComputeSpec((), DnsRewrite(target="a..b.example.com")),))
    assert build("t", values(), compute=(spec,)).cluster("ncpsim-compute-1").dns_records == ()


def test_a_state_folder_from_before_dns_records_still_reads() -> None:
    topology = build("t", values(), compute=(ComputeSpec(()),))
    raw = json.loads(topology.to_json())
    for cluster in raw["clusters"]:  # the old form: one rewrite as (domain, IPv4), "" for none
        records = cluster.pop("dns_records")
        cluster.update(rewrite_domain=WD if records else "", rewrite_target=LB if records else "")
    assert [c["rewrite_target"] for c in raw["clusters"]] == ["", LB]
    assert Topology.from_json(json.dumps(raw)) == topology
