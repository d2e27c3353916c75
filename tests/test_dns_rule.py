"""Table tests for the pure DNS rule (dns.rule)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dns.rule import Answer, DnsRecord, View, answer, dashed_ip, normalize_name, undash, wildcard

WORKER_DOMAIN = "grpc-worker.example.com"
PROXY_LB_IP = "10.100.0.10"
RULE = wildcard(WORKER_DOMAIN, PROXY_LB_IP)

# Every name below is asked of the wildcard record and, in test_dns_coredns.py, of the rendered
# CoreDNS config: (name, covered by *.<workerDomain>). Shared so the two cannot drift apart.
WORKER_DOMAIN_NAMES: list[tuple[str, bool]] = [
    (f"invocation.{WORKER_DOMAIN}", True),  # the HTTP callback proxy address
    (f"10-42-0-17.{WORKER_DOMAIN}", True),  # an invocation-service pod
    (f"10-42-0-21.{WORKER_DOMAIN}", True),  # a grpc-proxy pod (gRPC callback host)
    (f"a.b.10-42-0-17.{WORKER_DOMAIN}", True),  # deeper names are still under the wildcard
    (f"{WORKER_DOMAIN}.{WORKER_DOMAIN}", True),
    (f"*.{WORKER_DOMAIN}", True),  # a literal '*' label is just a label
    (f"INVOCATION.{WORKER_DOMAIN.upper()}", True),
    (f"10-42-0-17.{WORKER_DOMAIN}.", True),
    ("Invocation.Grpc-Worker.Example.Com.", True),
    (WORKER_DOMAIN, False),  # the apex is not under itself
    (f"{WORKER_DOMAIN}.", False),
    (WORKER_DOMAIN.upper(), False),
    ("example.com", False),
    (f"x{WORKER_DOMAIN}", False),  # same suffix, different label
    ("a.grpc-workerxexample.com", False),  # proves the rendered regex escapes its dots
    ("a.grpc-worker.examplexcom.", False),
    (f"10-42-0-17{WORKER_DOMAIN}", False),
    (f"10-42-0-17.{WORKER_DOMAIN}.evil.test", False),
    ("10-42-0-17.grpc-worker.example.org", False),
    ("10-42-0-11.invocation.nvcf.svc.cluster.local", False),
    ("", False),
    (".", False),
    (f"a..{WORKER_DOMAIN}", False),  # empty labels cannot come off the wire
    (f".{WORKER_DOMAIN}", False),
    (f"a.{WORKER_DOMAIN}..", False),
    (f"a b.{WORKER_DOMAIN}", False),  # whitespace is never a usable name
    (f"a\n.{WORKER_DOMAIN}", False),
]

CP_HOSTS = (
    ("10-42-0-11.invocation.nvcf.svc.cluster.local", "10.42.0.11"),
    ("10-42-0-21.grpc-headless.nvcf.svc.cluster.local", "10.42.0.21"),
)
CONTROL = View("ncpsim-cp", hosts=CP_HOSTS)
COMPUTE = View("ncpsim-compute-1", hosts=((f"pinned.{WORKER_DOMAIN}", "10.52.0.99"),), records=(RULE,))
COMPUTE_WITHOUT_REWRITE = View("ncpsim-compute-2")

PROXY = (PROXY_LB_IP,)
ANSWER_CASES = [
    # view, qname, qtype, expected answer
    (COMPUTE, f"invocation.{WORKER_DOMAIN}", "A", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"10-42-0-17.{WORKER_DOMAIN}", "A", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"10-42-0-21.{WORKER_DOMAIN}", "A", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"a.b.10-42-0-17.{WORKER_DOMAIN}", "A", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"10-42-0-17.{WORKER_DOMAIN.upper()}", "A", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"10-42-0-17.{WORKER_DOMAIN}.", "A", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"invocation.{WORKER_DOMAIN}", "ANY", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"invocation.{WORKER_DOMAIN}", "a", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"invocation.{WORKER_DOMAIN}", "AAAA", Answer("NOERROR", (), "record")),
    (COMPUTE, f"10-42-0-17.{WORKER_DOMAIN}", "TXT", Answer("NOERROR", (), "record")),
    (COMPUTE, f"10-42-0-17.{WORKER_DOMAIN}", "MX", Answer("NOERROR", (), "record")),
    # CoreDNS's template plugin answers before the cluster's own names (the kubernetes plugin)
    (COMPUTE, f"pinned.{WORKER_DOMAIN}", "A", Answer("NOERROR", PROXY, "record")),
    (COMPUTE, f"PINNED.{WORKER_DOMAIN}.", "AAAA", Answer("NOERROR", (), "record")),
    (COMPUTE, WORKER_DOMAIN, "A", Answer("NXDOMAIN", (), "none")),
    (COMPUTE, f"{WORKER_DOMAIN}.", "AAAA", Answer("NXDOMAIN", (), "none")),
    (COMPUTE, "example.com", "A", Answer("NXDOMAIN", (), "none")),
    (COMPUTE, f"10-42-0-17.{WORKER_DOMAIN}.evil.test", "A", Answer("NXDOMAIN", (), "none")),
    # the compute cluster cannot resolve control-plane pod names: it has no such records
    (COMPUTE, "10-42-0-11.invocation.nvcf.svc.cluster.local", "A", Answer("NXDOMAIN", (), "none")),
    (
        CONTROL,
        "10-42-0-11.invocation.nvcf.svc.cluster.local",
        "A",
        Answer("NOERROR", ("10.42.0.11",), "host"),
    ),
    (
        CONTROL,
        "10-42-0-21.grpc-headless.nvcf.svc.cluster.local",
        "A",
        Answer("NOERROR", ("10.42.0.21",), "host"),
    ),
    (
        CONTROL,
        "10-42-0-11.INVOCATION.nvcf.svc.cluster.local.",
        "A",
        Answer("NOERROR", ("10.42.0.11",), "host"),
    ),
    (CONTROL, "10-42-0-11.invocation.nvcf.svc.cluster.local", "AAAA", Answer("NOERROR", (), "host")),
    (CONTROL, "10-42-0-99.invocation.nvcf.svc.cluster.local", "A", Answer("NXDOMAIN", (), "none")),  # no pod
    (CONTROL, "10-42-0-21.invocation.nvcf.svc.cluster.local", "A", Answer("NXDOMAIN", (), "none")),
    (CONTROL, "invocation.nvcf.svc.cluster.local", "A", Answer("NXDOMAIN", (), "none")),
    (CONTROL, f"10-42-0-17.{WORKER_DOMAIN}", "A", Answer("NXDOMAIN", (), "none")),
    (COMPUTE_WITHOUT_REWRITE, f"invocation.{WORKER_DOMAIN}", "A", Answer("NXDOMAIN", (), "none")),
    (COMPUTE_WITHOUT_REWRITE, f"10-42-0-17.{WORKER_DOMAIN}", "A", Answer("NXDOMAIN", (), "none")),
    (COMPUTE_WITHOUT_REWRITE, f"10-42-0-21.{WORKER_DOMAIN}", "AAAA", Answer("NXDOMAIN", (), "none")),
    (CONTROL, "", "A", Answer("NXDOMAIN", (), "none")),
    (CONTROL, ".", "NS", Answer("NXDOMAIN", (), "none")),
]


@pytest.mark.parametrize(("view", "qname", "qtype", "expected"), ANSWER_CASES)
def test_answer(view: View, qname: str, qtype: str, expected: Answer) -> None:
    assert answer(view, qname, qtype) == expected


def covers(record: DnsRecord, qname: str) -> bool:
    name = normalize_name(qname)
    return name is not None and record.matches(name)


@pytest.mark.parametrize(("qname", "covered"), WORKER_DOMAIN_NAMES)
def test_wildcard_matches(qname: str, covered: bool) -> None:
    assert covers(RULE, qname) is covered


@pytest.mark.parametrize(("qname", "covered"), WORKER_DOMAIN_NAMES)
def test_wildcard_answer_agrees_with_matches(qname: str, covered: bool) -> None:
    result = answer(View("compute", records=(RULE,)), qname, "A")
    assert result == (Answer("NOERROR", PROXY, "record") if covered else Answer("NXDOMAIN", (), "none"))


def test_wildcard_domain_in_any_case_or_with_dot() -> None:
    record = wildcard("GRPC-Worker.Example.COM.", PROXY_LB_IP)
    assert record == DnsRecord("suffix", f".{WORKER_DOMAIN}", PROXY_LB_IP)
    assert covers(record, f"invocation.{WORKER_DOMAIN}")
    assert not covers(record, WORKER_DOMAIN)


def test_every_record_of_a_name_is_answered_in_order() -> None:
    view = View(
        "cp", hosts=(("svc.nvcf", "10.42.0.1"), ("other.nvcf", "10.42.0.9"), ("SVC.nvcf.", "10.42.0.2"))
    )
    assert answer(view, "svc.nvcf", "A").addresses == ("10.42.0.1", "10.42.0.2")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: wildcard("", PROXY_LB_IP), "workerDomain"),
        (lambda: wildcard("*.grpc-worker.example.com", PROXY_LB_IP), "workerDomain"),
        (lambda: wildcard("https://grpc-worker.example.com", PROXY_LB_IP), "workerDomain"),
        (lambda: wildcard("a..b", PROXY_LB_IP), "workerDomain"),
        (lambda: wildcard(WORKER_DOMAIN, "10.100.0"), "must be an IPv4 address such as 10.100.0.10"),
        (lambda: wildcard(WORKER_DOMAIN, "fd00::10"), "must be proxy, an IPv4 address"),
        (lambda: View("cp", hosts=(("pod.nvcf", "10.42.0.300"),)), "host record pod.nvcf"),
        (lambda: View("cp", hosts=(("bad name", "10.42.0.3"),)), "host record name"),
        (lambda: View("cp", ttl=-1), "ttl"),
    ],
)
def test_bad_configuration_is_refused_at_construction(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    ("ip", "label"),
    [
        ("10.42.0.17", "10-42-0-17"),
        ("10.42.0.21", "10-42-0-21"),
        ("10.52.3.4", "10-52-3-4"),
        ("0.0.0.0", "0-0-0-0"),
        ("255.255.255.255", "255-255-255-255"),
    ],
)
def test_dashed_ip_and_back(ip: str, label: str) -> None:
    assert dashed_ip(ip) == label
    assert undash(label) == ip


@pytest.mark.parametrize(
    "ip", ["", "10.42.0", "10.42.0.17.1", "256.0.0.1", "10.042.0.1", "::1", "10-42-0-17", " 10.42.0.1"]
)
def test_dashed_ip_refuses_what_is_not_ipv4(ip: str) -> None:
    with pytest.raises(ValueError, match="pod IP"):
        dashed_ip(ip)


@pytest.mark.parametrize(
    "label",
    [
        "",
        "invocation",
        "10-42-0",
        "10-42-0-17-1",
        "10.42.0.17",
        "256-0-0-1",
        "010-42-0-1",  # leading zeros would make two labels name one pod
        "-10-42-0-1",
        "10--42-0-1",
        "10-42-0-17 ",
        "a-b-c-d",
        "\u0661\u0660-42-0-1",  # Arabic-Indic digits are digits to str.isdigit, not to DNS
        "1000-0-0-1",
    ],
)
def test_undash_refuses_what_is_not_a_dashed_ipv4(label: str) -> None:
    assert undash(label) is None
