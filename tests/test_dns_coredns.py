"""A cluster's DNS records as CoreDNS config (dns.coredns): what is rendered, and that the rendered text,
read back, answers as the local records do."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from test_dns_rule import RULE, WORKER_DOMAIN_NAMES  # the shared name table (pytest puts tests/ on sys.path)

from dns.coredns import CONFIGMAP_KEY, evaluate_rewrite, read_override, render_coredns_custom, view_of
from dns.rule import Answer, DnsRecord, View, answer, wildcard

PROXY_SERVICE = "worker-callback-proxy.nvcf.svc.cluster.local"
MAKE_TARGET = wildcard("grpc-worker.example.com", PROXY_SERVICE)  # the make target's rewrite to a name


@pytest.fixture(scope="module")
def rendered() -> dict:
    return render_coredns_custom([MAKE_TARGET])


def test_configmap_is_the_one_k3s_imports(rendered: dict) -> None:
    assert rendered["apiVersion"] == "v1"
    assert rendered["kind"] == "ConfigMap"
    assert rendered["metadata"]["name"] == "coredns-custom"
    assert rendered["metadata"]["namespace"] == "kube-system"
    # k3s imports /etc/coredns/custom/*.override into the .:53 block; other suffixes are ignored
    assert list(rendered["data"]) == [CONFIGMAP_KEY]
    assert CONFIGMAP_KEY.endswith(".override")


def test_configmap_survives_yaml_and_kubernetes_schema(rendered: dict) -> None:
    text = yaml.safe_dump(rendered, sort_keys=False)
    assert yaml.safe_load(text) == rendered
    kubernetes_validate.validate(yaml.safe_load(text), "1.30", strict=True)


def test_stanza_is_a_regex_name_rewrite_with_answer_auto(rendered: dict) -> None:
    stanza = rendered["data"][CONFIGMAP_KEY]
    lines = [line.strip() for line in stanza.splitlines() if line.strip() and not line.startswith("#")]
    assert lines == [
        "rewrite stop {",
        r"name regex ^(.+)\.grpc-worker\.example\.com\.$ worker-callback-proxy.nvcf.svc.cluster.local.",
        "answer auto",
        "}",
    ]
    pattern = lines[1].split()[2]
    assert "(?" not in pattern and "\\d" not in pattern  # plain RE2: Go and Python agree on it


@pytest.mark.parametrize(("qname", "covered"), WORKER_DOMAIN_NAMES)
def test_rendered_rewrite_agrees_with_the_record(rendered: dict, qname: str, covered: bool) -> None:
    assert evaluate_rewrite(rendered, qname) == (PROXY_SERVICE if covered else None)


def test_other_domains_are_escaped_too() -> None:
    rendered = render_coredns_custom([wildcard("Workers.NVCF.example.net", "proxy.nvcf.svc.cluster.local.")])
    assert r"\.workers\.nvcf\.example\.net\.$" in rendered["data"][CONFIGMAP_KEY]
    assert evaluate_rewrite(rendered, "10-42-0-17.workers.nvcf.example.net") == "proxy.nvcf.svc.cluster.local"
    assert evaluate_rewrite(rendered, "10-42-0-17.workersxnvcf.example.net") is None


@pytest.mark.parametrize("service", ["", "worker callback proxy", "proxy..nvcf", "http://proxy.nvcf"])
def test_bad_service_name_is_refused(service: str) -> None:
    with pytest.raises(ValueError, match="Service name"):
        render_coredns_custom([RULE], {RULE.target: service})


def test_a_record_still_pointing_at_proxy_is_refused() -> None:
    with pytest.raises(ValueError, match="pointing_at"):
        render_coredns_custom([DnsRecord("exact", "invocation.grpc-worker.example.com", "proxy")])


def test_an_address_is_a_template_with_its_nodata_companion() -> None:
    stanza = render_coredns_custom([RULE])["data"][CONFIGMAP_KEY]
    lines = [line.strip() for line in stanza.splitlines() if line.strip() and not line.startswith("#")]
    assert lines == [
        "template IN A {",
        r"match ^(.+)\.grpc-worker\.example\.com\.$",
        'answer "{{ .Name }} 5 IN A 10.100.0.10"',
        "fallthrough",
        "}",
        "template IN ANY {",
        r"match ^(.+)\.grpc-worker\.example\.com\.$",
        "rcode NOERROR",
        "fallthrough",
        "}",
    ]


# Every form, alone and together: the rendered text read back answers every name as the records do.
WD = "grpc-worker.example.com"
FORMS = {
    "wildcard address": (RULE,),
    "exact address": (DnsRecord("exact", f"invocation.{WD}", "10.100.0.10"),),
    "suffix without a dot": (DnsRecord("suffix", WD, "10.100.0.10"),),
    "regex address": (DnsRecord("regex", r"^10-42-0-[0-9]+\.grpc-worker\.example\.com\.$", "10.100.0.10"),),
    "make target, unresolved": (MAKE_TARGET,),
    "make target, Service made": (MAKE_TARGET, DnsRecord("exact", PROXY_SERVICE, "10.100.0.10")),
    "exact rewrite": (DnsRecord("exact", f"invocation.{WD}", "callback.ops.svc.cluster.local"),),
    "suffix rewrite": (DnsRecord("suffix", f".{WD}", ".ops.svc.cluster.local"),),
    "regex rewrite with a group": (
        DnsRecord("regex", r"^([^.]+)\.grpc-worker\.example\.com\.$", "{1}.ops.svc.cluster.local"),
        DnsRecord("suffix", ".ops.svc.cluster.local", "10.100.0.11"),
    ),
    "first address wins": (DnsRecord("exact", f"invocation.{WD}", "10.100.0.99"), RULE),
}
NAMES = [
    *(q for q, _ in WORKER_DOMAIN_NAMES),
    PROXY_SERVICE,
    "callback.ops.svc.cluster.local",
    "invocation.ops.svc.cluster.local",
    "10-42-0-17.ops.svc.cluster.local",
]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_read_back_answers_as_the_records_do(form: str) -> None:
    records = FORMS[form]
    local = View("compute", records=records)
    rendered = view_of(render_coredns_custom(records), "compute")
    assert [r for _, r in read_override(render_coredns_custom(records))]  # something was rendered
    for qname in NAMES:
        for qtype in ("A", "AAAA"):
            mine, theirs = answer(local, qname, qtype), answer(rendered, qname, qtype)
            assert (mine.rcode, mine.addresses) == (theirs.rcode, theirs.addresses), (form, qname, qtype)


def test_the_make_targets_rewrite_finds_nothing_until_the_name_exists() -> None:
    pod = f"10-42-0-41.{WD}"
    alone = view_of(render_coredns_custom([MAKE_TARGET]), "compute")
    assert answer(alone, pod, "A") == Answer("NXDOMAIN", (), "rewrite")
    fixed = view_of(render_coredns_custom(FORMS["make target, Service made"]), "compute")
    assert answer(fixed, pod, "A") == Answer("NOERROR", ("10.100.0.10",), "rewrite")


def _configmap(*stanzas: str, key: str = CONFIGMAP_KEY) -> dict:
    return {"data": {f"{i}-{key}": text for i, text in enumerate(stanzas)}}


# The evaluator reads text, so it is checked on hand-written Corefile snippets as well.
EVALUATOR_CASES = [
    # snippet(s), qname, expected
    (
        ["rewrite name regex ^(.+)\\.a\\.test\\.$ svc.ns.svc.cluster.local answer auto"],
        "x.a.test",
        "svc.ns.svc.cluster.local",
    ),
    (["rewrite stop name exact old.test new.test"], "OLD.test.", "new.test"),
    (["rewrite name old.test new.test"], "old.test", "new.test"),
    (["rewrite stop name exact old.test new.test"], "x.old.test", None),
    (["rewrite name suffix .a.test .b.test"], "x.y.a.test", "x.y.b.test"),
    (["rewrite name regex ^([^.]+)\\.a\\.test\\.$ {1}.b.test"], "Pod.a.test", "pod.b.test"),
    (["rewrite name regex ^([^.]+)\\.a\\.test\\.$ {1}.b.test"], "x.y.a.test", None),
    (["rewrite continue name exact a.test b.test", "rewrite name exact b.test c.test"], "a.test", "c.test"),
    (["rewrite stop name exact a.test b.test", "rewrite name exact b.test c.test"], "a.test", "b.test"),
    (["# a comment\nlog\nrewrite stop {\n  name exact a.test b.test # trailing\n}\n"], "a.test", "b.test"),
    ([], "a.test", None),
]


@pytest.mark.parametrize(("stanzas", "qname", "expected"), EVALUATOR_CASES)
def test_evaluator_reads_corefile_text(stanzas: list[str], qname: str, expected: str | None) -> None:
    assert evaluate_rewrite(_configmap(*stanzas), qname) == expected


def test_evaluator_ignores_keys_k3s_does_not_import() -> None:
    assert evaluate_rewrite(_configmap("rewrite name exact a.test b.test", key="x.server"), "a.test") is None


@pytest.mark.parametrize(
    "stanza",
    [
        "rewrite type ANY HINFO",
        "rewrite name prefix a. b.",
        "rewrite name regex ^a\\.test\\.$ b.test answer name ^b\\.test\\.$ a.test",
        'rewrite name exact "a.test b.test',  # an unterminated quote
        'template IN A {\n  match ^a\\.test\\.$\n  answer "{{ .Name }} 5 IN A 10.0.0.1"\n}\n',  # no fallthrough
        "template IN MX {\n  match ^a\\.test\\.$\n  rcode NOERROR\n  fallthrough\n}\n",
        "rewrite stop {\n  name exact a.test b.test\n",
    ],
)
def test_evaluator_refuses_what_it_does_not_understand(stanza: str) -> None:
    with pytest.raises(ValueError):
        evaluate_rewrite(_configmap(stanza), "a.test")
