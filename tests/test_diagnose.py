"""`ncpsim diagnose`: the symptom table row by row, the judge from a table of observations, render-time
refusals from customer files, and live probes of a customer's world on the local backend."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cases_support import Cases, asked, cases
from cli_support import ncpsim

from scenarios.diagnose.assemble import write_ticket
from scenarios.diagnose.causes import CAUSES
from scenarios.diagnose.diagnosis import Diagnosis, diagnose
from scenarios.diagnose.judge import Finding, Observation, World, cause_of, judge
from scenarios.diagnose.probe import probe_timeout
from scenarios.diagnose.profiles import default_profiles, parse_workers
from scenarios.diagnose.refusal import RenderFix, render_fix
from scenarios.diagnose.symptoms import SYMPTOMS, rank
from scenarios.diagnose.ticket import FIXES, NO_FIX, STEP_NAME, Ticket, scenario
from scenarios.expect import check_refused
from scenarios.load import load_scenario, scenario_from_data
from scenarios.replay import replay_one
from scenarios.report import render_text
from scenarios.result import ScenarioResult
from scenarios.spec import step_from
from sim.errors import ConfigError, ScenarioError
from sim.model.values import deep_merge
from sim.model.values_check import validate

PROXY = {"enabled": True, "workerDomain": "grpc-worker.example.com", "service": {"type": "LoadBalancer"}}
PEM = {"global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}}}

UNKNOWN_CA = "x509: certificate signed by unknown authority"
# One NATS server, as the catalogue's tickets run where they are not about the NATS cluster (no test here
# is): three elect a JetStream meta leader before the first callback, 0.7 s a stack, and 4-9 s when a vote
# splits (about one start in twenty). The chart's three run in test_bundle_diagnose's command-line tests
# (the healthy bundle's budget, token mode) and the interrupted diagnoses.
ONE_NATS = {"nats": {"config": {"cluster": {"enabled": False}}}}
OUTSIDE_API = "http://api.example.com:8080/v2/nvcf/webhook/nats-auth"


# -- what a worker or client logged -> the documented causes ---------------------------------------------
SYMPTOM_ROWS = [
    ("x509: certificate signed by unknown authority", "worker-ca-missing"),
    (
        "tls: failed to verify certificate: x509: certificate has expired or is not yet valid",
        "frontend-expired",
    ),
    (
        "x509: certificate is valid for *.other.example.com, not invocation.grpc-worker.example.com",
        "frontend-certificate-names",
    ),
    ("ca: no valid PEM certs in $NVCF_PROXY_CA_PEM", "worker-ca-stale"),
    (
        "CRYPTO_ERROR 0x170 (remote): TLS handshake failure (ENCRYPTION_INITIAL) 112: unrecognized name",
        "invocation-proxy-url",
    ),
    ("dial tcp: lookup invocation.grpc-worker.example.com on 10.53.0.10:53: no such host", "rewrite-missing"),
    ("dial tcp 10.100.0.10:10084: i/o timeout", "proxy-unreachable"),
    ("timeout: no recent network activity", "proxy-unreachable"),
    (
        "proxyconnect tcp: CONNECT 10-42-0-11.invocation.nvcf.svc.cluster.local:8443 answered 404",
        "legacy-worker-connect-off",
    ),
    (
        (
            'failed to send GET request: Get "https://10-42-0-11.invocation.nvcf.svc.cluster.local:8443'
            '/v2/nvcf/worker/request-attach": Not Found'
        ),
        "legacy-worker-connect-off",
    ),
    ("GET request failed with status code 404", "legacy-worker-connect-off"),
    ("GET request failed with status code 401", "callback-wrong-pod"),
    (
        (
            "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, "
            "transport failure reason: TLS_error:|268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:"
            "TLS_error_end"
        ),
        "pod-cert-untrusted",
    ),
    (
        (
            "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, "
            "transport failure reason: delayed connect error: 111"
        ),
        "upstream-tls-mismatch",
    ),
    ("nats: Authorization Violation", "nats-auth-rejected"),
    (
        'Authentication failed {"error": "plugin webhook not found for account Worker"}',
        "nats-account-not-read",
    ),
    ("nats.workerAuth must be nkey or token", "nats-auth-mode"),
    ("nats.authCallout.workerTokenAuth.webhookUrl must be set in token mode", "callout-webhook-empty"),
    ("global.workerEndpoints.invocationProxyURL must be covered by *.<workerDomain>", "invocation-proxy-url"),
    ("must be empty when workerCallbackProxy.enabled is true", "split-plane-url"),
    ("podAnnotations: annotation values must be strings", "pod-annotations"),
]


@pytest.mark.parametrize(
    ("symptom", "first"), SYMPTOM_ROWS, ids=[r[1] + ":" + r[0][:30] for r in SYMPTOM_ROWS]
)
def test_symptom_names_its_most_likely_cause_first(symptom: str, first: str) -> None:
    causes = rank(symptom)
    assert causes and causes[0].id == first, [c.id for c in causes]


def test_every_symptom_row_names_known_causes_and_every_row_is_exercised() -> None:
    assert all(c in CAUSES for _, causes in SYMPTOMS for c in causes)
    import re

    hit = {
        pattern
        for pattern, _ in SYMPTOMS
        for text, _ in SYMPTOM_ROWS
        if re.search(pattern, text, re.IGNORECASE)
    }
    assert hit == {pattern for pattern, _ in SYMPTOMS}


def test_an_unknown_symptom_names_nothing() -> None:
    assert rank("the function returned 42") == []


# -- observations -> causes (pure) -------------------------------------------------------------------------
LB, CLUSTER_IP = World(proxy_enabled=True), World(proxy_enabled=True, service_type="ClusterIP")
# The same 503 UF means another cause when the values turned the pod's worker TLS listener off.
POD_503 = Observation(
    "1.4.0:system",
    "http-echo",
    False,
    "get",
    "GET request failed with status code 503: upstream connect error",
    statuses=(503,),
    proxy=((503, "UF"),),
)
OBSERVATION_ROWS = [
    (
        Observation(
            "1.4.0:system",
            "http-echo",
            False,
            "dns",
            "dial tcp: lookup invocation.x on 10.53.0.10:53: no such host",
            "NXDOMAIN",
        ),
        LB,
        "rewrite-missing",
    ),
    (
        Observation(
            "1.4.0:system",
            "http-echo",
            False,
            "connect",
            "dial tcp 10.43.0.30:10084: connect: no route to host",
        ),
        CLUSTER_IP,
        "proxy-unreachable",
    ),
    (
        Observation("1.4.0:system", "http-echo", False, "connect", "dial tcp 10.100.0.10:10084: i/o timeout"),
        LB,
        "rewrite-wrong-address",
    ),
    (
        Observation(
            "1.4.0:system",
            "http-echo",
            False,
            "connect",
            "dial tcp 10.42.0.11:8443: connect: no route to host",
        ),
        World(proxy_enabled=False),
        "proxy-disabled",
    ),
    (
        Observation(
            "1.4.0:system", "http-echo", False, "tls", "tls: failed to verify certificate: " + UNKNOWN_CA
        ),
        LB,
        "worker-ca-missing",
    ),
    (
        Observation(
            "1.4.0:system",
            "http-echo",
            False,
            "tls",
            "tls: failed to verify certificate: x509: certificate is valid for *.other.example.com, not x",
        ),
        LB,
        "frontend-certificate-names",
    ),
    (
        Observation(
            "1.4.0:system", "http-echo", False, "tls", "tls: failed to verify certificate: " + UNKNOWN_CA
        ),
        World(proxy_enabled=True, pem_set=True),
        "worker-ca-stale",
    ),
    (
        Observation(
            "1.4.0:system", "http-echo", False, "tls", "tls: failed to verify certificate: " + UNKNOWN_CA
        ),
        World(proxy_enabled=True, frontend="brought"),
        "frontend-private-ca",
    ),
    (
        Observation(
            "1.4.0:system",
            "http-echo",
            False,
            "tls",
            "x509: certificate has expired or is not yet valid: current",
        ),
        LB,
        "frontend-expired",
    ),
    (
        Observation(
            "1.4.0:system",
            "grpc-echo",
            False,
            "tls",
            "certificate verify failed: Certificate is no longer valid",
        ),
        World(proxy_enabled=True, pem_set=True),
        "frontend-expired",
    ),
    (
        Observation(
            "1.4.0:system",
            "http-echo",
            False,
            "tls",
            "certificate verify failed (Hostname mismatch, certificate "
            "is not valid for 'invocation.grpc-worker.example.com'.)",
        ),
        World(proxy_enabled=True, pem_set=True),
        "frontend-certificate-names",
    ),
    (
        Observation(
            "1.2.9:system",
            "http-echo",
            False,
            "connect",
            'Get "https://10-42-0-11...:8443/v2/nvcf/worker/request-attach": Not Found',
            statuses=(404,),
        ),
        LB,
        "legacy-worker-connect-off",
    ),
    (
        POD_503,
        LB,
        "pod-unreachable",
    ),
    (
        Observation(
            "1.4.0:system",
            "http-echo",
            False,
            "get",
            "CERTIFICATE_VERIFY_FAILED",
            statuses=(503,),
            proxy=((503, "UF"),),
        ),
        LB,
        "pod-cert-untrusted",
    ),
    (
        Observation(
            "1.4.0:system",
            "http-echo",
            False,
            "get",
            "GET request failed with status code 401",
            statuses=(401,),
        ),
        LB,
        "callback-wrong-pod",
    ),
    (
        Observation(
            "1.4.0:system:before-pem",
            "http-echo",
            False,
            "tls",
            "tls: failed to verify certificate: " + UNKNOWN_CA,
            before_pem=True,
        ),
        World(proxy_enabled=True, pem_set=True),
        "pem-not-redeployed",
    ),
    (
        Observation(
            "1.4.0:system:no-nats-account",
            "http-echo",
            False,
            "nats",
            "nats: 'Authorization Violation'; auth callout log: Authentication failed "
            '{"error": "plugin webhook not found for account Worker"}',
        ),
        World(proxy_enabled=True, worker_auth="token"),
        "nats-account-not-read",
    ),
    (
        Observation("1.4.0:system", "http-echo", False, "nats", "nats: 'Authorization Violation'"),
        World(proxy_enabled=True, worker_auth="token"),
        "nats-auth-rejected",
    ),
    (
        POD_503,
        World(proxy_enabled=True, pod_worker_tls=False),
        "upstream-tls-mismatch",
    ),
    (
        Observation(
            "1.4.0:system", "http-echo", False, "dns", "cannot resolve invocation.grpc-worker.example.com"
        ),
        World(proxy_enabled=True, rewrite_to_name=True),
        "rewrite-target-unresolved",
    ),
    (Observation("1.4.0:system", "http-echo", True), LB, None),
]


@pytest.mark.parametrize(("obs", "world", "cause"), OBSERVATION_ROWS)
def test_each_observation_has_its_documented_cause(obs: Observation, world: World, cause: str | None) -> None:
    assert cause_of(obs, world) == cause


def test_judge_gives_each_cause_once_with_all_its_evidence() -> None:
    obs = OBSERVATION_ROWS[0][0]
    findings = judge([], [obs, obs, OBSERVATION_ROWS[4][0]], LB)
    assert [f.cause.id for f in findings] == ["rewrite-missing", "worker-ca-missing"]
    assert len(findings[0].evidence) == 1 and "NXDOMAIN" in findings[0].evidence[0]


# -- render-time refusals: no stack comes up, as in the field ----------------------------------------------
RENDER_ROWS = [
    (
        {
            "workerCallbackProxy": PROXY,
            "global": {"workerEndpoints": {"invocationServiceURL": "http://a:8080"}},
        },
        "split-plane-url",
    ),
    (
        {
            "workerCallbackProxy": PROXY,
            "global": {"workerEndpoints": {"invocationProxyURL": "https://invocation.other.example:10084"}},
        },
        "invocation-proxy-url",
    ),
    ({"nats": {"workerAuth": "password"}}, "nats-auth-mode"),
    (
        {"nats": {"workerAuth": "token", "authCallout": {"workerTokenAuth": {"webhookUrl": ""}}}},
        "callout-webhook-empty",
    ),
    ({"api": {"podAnnotations": {"team": 7}}}, "pod-annotations"),
    ({"invocation": {"workerTls": {"enabled": "yes"}}}, "values-refused"),
]


@pytest.mark.parametrize(("values", "cause"), RENDER_ROWS, ids=[r[1] for r in RENDER_ROWS])
def test_render_refusals_come_first_with_their_fix(tmp_path: Path, values: dict, cause: str) -> None:
    path = tmp_path / "customer.yaml"
    path.write_text(yaml.safe_dump(values))
    found = diagnose([path], root=tmp_path / "state")
    first = found.ranked()[0]
    assert first.cause.id == cause
    assert "render refused: " in first.evidence[0] and "customer.yaml" in first.evidence[0]
    assert not (tmp_path / "state").exists()  # nothing was brought up


@pytest.mark.parametrize(("values", "cause"), RENDER_ROWS, ids=[r[1] for r in RENDER_ROWS])
def test_each_render_refusal_has_its_fix_as_values(tmp_path: Path, values: dict, cause: str) -> None:
    """A ticket for a refused render runs the values as the fix makes them (they deploy) and applies the
    customer's refused keys on top (refused again, with the render's words: the control)."""
    path = tmp_path / "customer.yaml"
    path.write_text(yaml.safe_dump(values))
    found = diagnose([path], root=tmp_path / "state")
    fix = render_fix(found.values, found.refused)
    assert isinstance(fix, RenderFix), fix
    assert validate(fix.values) == []
    again = validate(deep_merge(fix.values, fix.refused))
    assert again and again[0].message == fix.message == found.refusal


BASE = {"workerCallbackProxy": PROXY}
SPLIT = {"global": {"workerEndpoints": {"invocationServiceURL": "http://a:8080"}}}
REFUSED_ROWS = [
    ({"setValues": SPLIT, "expect": {"refused": "must be empty"}}, None),
    ({"setValues": SPLIT, "expect": {"refused": "must be nkey or token"}}, "but the error was"),
    ({"setValues": {"nats": {"workerAuth": "token"}}, "expect": {"refused": "must be empty"}}, "accepted"),
    ({"unsetValues": ["workerCallbackProxy.workerDomain"], "expect": {"refused": "x"}}, "accepted"),
]


@pytest.mark.parametrize(
    ("raw", "problem"), REFUSED_ROWS, ids=["refused", "other-words", "accepted", "unset"]
)
def test_a_refused_change_is_judged_never_applied(raw: dict, problem: str | None) -> None:
    note, failure = check_refused(step_from(1, raw), BASE)
    assert failure is None if problem is None else problem in (failure or ""), (note, failure)


@pytest.mark.parametrize(
    ("step", "error"),
    [
        (
            {"setValues": SPLIT, "invoke": {"function": "http-echo"}, "expect": {"refused": "x"}},
            "changes nothing",
        ),
        ({"invoke": {"function": "http-echo"}, "expect": {"refused": "x"}}, "needs setValues"),
        ({"setValues": SPLIT, "expect": {"refused": "x", "outcome": "failure"}}, "entry of its own"),
    ],
    ids=["with-an-action", "nothing-to-refuse", "with-more"],
)
def test_a_refused_step_stands_alone(tmp_path: Path, step: dict, error: str) -> None:
    data = {"name": "r", "summary": "s", "values": BASE, "steps": [step]}
    with pytest.raises(ScenarioError, match=error):
        scenario_from_data(data, tmp_path / "r.yaml")


@pytest.mark.parametrize("cause", sorted(NO_FIX))
def test_a_cause_whose_fix_is_not_in_the_customers_files_says_so(cause: str) -> None:
    """The ticket replays the failure as the customer saw it and says in one line why no step fixes it;
    a cause with a template gets its fix step (the control)."""
    workers = {"count": 2, "trust": "system", "workerUtils": "1.4.0"}
    for cause_id, fixed in ((cause, False), ("worker-ca-missing", True)):
        data = scenario(Ticket([Finding(CAUSES[cause_id], ("probe worker 1.4.0:system",))], {}, workers))
        assert [s["expect"]["outcome"] for s in data["steps"]] == ["failure", "success"][: 1 + fixed]
        assert ("no fix step: " in data["ticket"]) != fixed and "\n" not in data["ticket"]


def test_bad_worker_spec_is_one_line() -> None:
    with pytest.raises(ConfigError, match="VERSION:TRUST"):
        parse_workers("1.2.9:everything")
    with pytest.raises(ConfigError, match="flags: before-pem, no-nats-account"):
        parse_workers("1.4.0:system:newest")


def test_worker_flags_become_the_scenario_worker_group() -> None:
    (profile,) = parse_workers("1.4.0:system:before-pem:no-nats-account")
    assert profile.label == "1.4.0:system:before-pem:no-nats-account"
    assert profile.worker_group(2) == {
        "count": 2,
        "trust": "system",
        "workerUtils": "1.4.0",
        "createdBeforePem": True,
        "readsNatsAccount": False,
    }


@pytest.mark.parametrize(
    ("world", "what_ifs"),
    [
        (World(proxy_enabled=True), ["1.2.9:system"]),
        (World(proxy_enabled=True, pem_set=True), ["1.2.9:system", "1.4.0:system:before-pem"]),
        (World(proxy_enabled=True, worker_auth="token"), ["1.2.9:system", "1.4.0:system:no-nats-account"]),
    ],
    ids=["plain", "pem-set", "token-mode"],
)
def test_the_default_probes_ask_the_what_ifs_the_values_raise(world: World, what_ifs: list[str]) -> None:
    profiles = default_profiles(world)
    assert [p.label for p in profiles if not p.what_if] == ["1.4.0:system"]
    assert [p.label for p in profiles if p.what_if] == what_ifs


# -- live: the customer's world on the local backend -------------------------------------------------------
def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return ncpsim("diagnose", *args, home=tmp_path / "home", env={"PATH": "/usr/bin:/bin"})


def values_file(tmp_path: Path, values: dict) -> str:
    path = tmp_path / "customer.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_healthy_values_give_no_findings_and_exit_0(tmp_path: Path) -> None:
    values = {"workerCallbackProxy": PROXY, **PEM, **ONE_NATS}
    done = run_cli(tmp_path, "-f", values_file(tmp_path, values), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["findings"] == []
    # stderr is a pipe here: no progress line (on a terminal there is one: test_diagnose_interrupt.py)
    assert "\r" not in done.stderr and "probe worker-utils" not in done.stderr, done.stderr


def test_missing_pem_is_named_first_and_its_ticket_replays(tmp_path: Path) -> None:
    """The same file as the healthy one, less workerCallbackCaPem (the negative control of the test above),
    through the command line: the finding, then `--write-ticket --ticket-id` and `replay scenario=FILE`.
    A Service annotation whose key holds dots and a slash must reach the ticket whole."""
    internal = {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
    values = {
        "workerCallbackProxy": {**PROXY, "service": {"type": "LoadBalancer", "annotations": internal}},
        **ONE_NATS,
    }
    ticket = tmp_path / "tickets" / "sup-1234.yaml"
    ticket.parent.mkdir()
    done = run_cli(
        tmp_path,
        "-f",
        values_file(tmp_path, values),
        "--json",
        "--symptom",
        "x509: certificate signed by unknown authority",
        "--workers",
        "1.4.0:system",
        "--write-ticket",
        str(ticket),
        "--ticket-id",
        "SUP-1234",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    first = json.loads(done.stdout)["findings"][0]
    assert first["id"] == "worker-ca-missing"
    assert "workerCallbackCaPem" in first["fix"] and "redeploy" in first["fix"]
    assert any("failed to verify certificate" in e for e in first["evidence"])
    written = yaml.safe_load(ticket.read_text())
    assert written["name"] == "ticket-sup-1234" and written["ticket"].startswith("SUP-1234; ")
    assert yaml.safe_load(ticket.with_name("sup-1234.values.yaml").read_text()) == values
    assert written["values"]["workerCallbackProxy"]["service"]["annotations"] == internal
    replayed = replay(tmp_path, ticket)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "1/1 scenarios passed" in replayed.stdout


def test_a_ticket_never_overwrites_its_inputs_nor_follows_a_link(tmp_path: Path) -> None:
    customer = values_file(tmp_path, {"workerCallbackProxy": PROXY})
    for ticket in (customer, str(tmp_path / "customer.yaml")):  # the input itself, however named
        done = run_cli(tmp_path, "-f", customer, "--write-ticket", ticket)
        assert done.returncode == 2 and "never overwrites" in done.stderr, done.stderr
    (tmp_path / "planted.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    done = run_cli(tmp_path, "-f", customer, "--write-ticket", str(tmp_path / "planted.yaml"))
    assert done.returncode == 2 and not (tmp_path / "elsewhere.yaml").exists(), done.stderr
    (tmp_path / "t.values.yaml").write_text(
        "mine: 1\n"
    )  # beside a new ticket: its values file would go there
    done = run_cli(tmp_path, "-f", customer, "--write-ticket", str(tmp_path / "t.yaml"))
    assert done.returncode == 2 and (tmp_path / "t.values.yaml").read_text() == "mine: 1\n"
    assert not (tmp_path / "t.yaml").exists()


def replay(tmp_path: Path, scenario: Path) -> subprocess.CompletedProcess[str]:
    return ncpsim("replay", f"scenario={scenario}", home=tmp_path / "home", env={"PATH": "/usr/bin:/bin"})


# -- live, one row per cause: the values (and what else the customer told) make diagnose name it first -----
def corporate_secret(tmp_path: Path, expired: bool = False) -> tuple[str, str]:
    """A frontend certificate from the customer's own corporate CA, as they would bring it; (the --secret
    argument, the CA's PEM as they would paste it into workerCallbackCaPem)."""
    import datetime

    import trustme

    ca = trustme.CA(organization_name="Customer Corp")
    now = datetime.datetime.now(datetime.UTC)
    window = {"not_before": now - datetime.timedelta(days=90), "not_after": now - datetime.timedelta(days=1)}
    leaf = ca.issue_cert("*.grpc-worker.example.com", **(window if expired else {}))
    folder = tmp_path / "worker-public-tls"
    folder.mkdir()
    leaf.private_key_pem.write_to_path(str(folder / "tls.key"))
    (folder / "tls.crt").write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return f"worker-public-tls={folder}", ca.cert_pem.bytes().decode()


CAUSE_ROWS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("worker-ca-missing", {"workerCallbackProxy": PROXY}, ()),
    ("legacy-worker-connect-off", {"workerCallbackProxy": PROXY, **PEM}, ("--workers", "1.2.9:system")),
    ("rewrite-missing", {"workerCallbackProxy": PROXY, **PEM}, ("--rewrite", "none")),
    (
        "rewrite-wrong-domain",
        {"workerCallbackProxy": PROXY, **PEM},
        ("--rewrite", "callbacks.other.example=proxy"),
    ),
    (
        "rewrite-wrong-address",
        {"workerCallbackProxy": PROXY, **PEM},
        ("--rewrite", "grpc-worker.example.com=10.100.0.99"),
    ),
    (
        "rewrite-target-unresolved",  # the make target's default rewrite (seed step 2)
        {"workerCallbackProxy": PROXY, **PEM},
        ("--rewrite", "grpc-worker.example.com=worker-callback-proxy.nvcf.svc.cluster.local"),
    ),
    (
        "proxy-unreachable",  # with a Service annotation whose key holds dots: the ticket keeps it whole
        {
            "workerCallbackProxy": {
                **PROXY,
                "service": {
                    "type": "ClusterIP",
                    "annotations": {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"},
                },
            },
            **PEM,
        },
        (),
    ),
    ("proxy-disabled", {"workerCallbackProxy": {"enabled": False}}, ()),
    ("pem-not-redeployed", {"workerCallbackProxy": PROXY, **PEM}, ("--workers", "1.4.0:system:before-pem")),
    (
        "upstream-tls-mismatch",
        {"workerCallbackProxy": PROXY, **PEM, "invocation": {"workerTls": {"enabled": False}}},
        (),
    ),
    (
        "nats-account-not-read",
        {"workerCallbackProxy": PROXY, **PEM, "nats": {"workerAuth": "token"}},
        ("--workers", "1.4.0:system:no-nats-account"),
    ),
    (
        "frontend-private-ca",
        {"workerCallbackProxy": {**PROXY, "tls": {"frontend": {"existingSecret": "worker-public-tls"}}}},
        ("SECRET",),
    ),
    (
        "frontend-expired",  # the corporate CA's PEM is given, so only the expiry is wrong
        {"workerCallbackProxy": {**PROXY, "tls": {"frontend": {"existingSecret": "worker-public-tls"}}}},
        ("EXPIRED",),
    ),
    (
        "nats-auth-rejected",  # token mode, the webhook URL outside the cluster: the callout reaches nothing
        {
            "workerCallbackProxy": PROXY,
            **PEM,
            "nats": {"workerAuth": "token", "authCallout": {"workerTokenAuth": {"webhookUrl": OUTSIDE_API}}},
        },
        (),
    ),
    (
        "split-plane-url",
        {
            "workerCallbackProxy": PROXY,
            "global": {"workerEndpoints": {"invocationServiceURL": "http://a:8080"}},
        },
        (),
    ),
]
OPTIONS = {"--workers": "workers", "--rewrite": "rewrite"}


@pytest.fixture(scope="module")
def diagnosed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cases[str, tuple[Diagnosis, Path]]]:
    """One diagnosis per cause, in-process, shared by the tests that name it and replay its ticket; the
    causes this run's tests ask for, started at once, two at a time (cases_support)."""
    rows = {cause: (values, extra) for cause, values, extra in CAUSE_ROWS}

    def run(cause: str) -> tuple[Diagnosis, Path]:
        folder = tmp_path_factory.mktemp(cause)
        values, extra = rows[cause]
        values = deep_merge(values, ONE_NATS)
        options: dict[str, Any] = {
            "workers": "1.4.0:system"
        }  # one stack, not the default two: the suite's time
        if extra in (("SECRET",), ("EXPIRED",)):
            secret, pem = corporate_secret(folder, expired=extra == ("EXPIRED",))
            options["secrets"] = [secret]
            if extra == ("EXPIRED",):
                values = {**values, "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": pem}}}}
        else:
            options.update({OPTIONS[flag]: arg for flag, arg in zip(extra[::2], extra[1::2], strict=True)})
        path = Path(values_file(folder, values))
        return diagnose([path], root=folder / "state", **options), folder

    with cases(run, waiting_first(asked(request, "cause")), "diagnosis") as held:
        yield held


def waiting_first(causes: list[object]) -> list[str]:
    """The causes whose calls wait out their timeouts (no worker ever takes them: ticket.FIXES says how
    long) first, so the other causes' stacks run meanwhile and none of those waits comes last."""
    return sorted((str(c) for c in causes), key=lambda c: not (c in FIXES and FIXES[c].timeout))


@pytest.mark.parametrize("cause", [r[0] for r in CAUSE_ROWS])
def test_each_cause_is_named_first_with_its_fix(
    diagnosed: Cases[str, tuple[Diagnosis, Path]], cause: str
) -> None:
    found, _ = diagnosed(cause)
    first = found.ranked()[0]
    assert first.cause.id == cause, [f.cause.id for f in found.ranked()]
    assert first.cause.section.startswith(("worker-callback-proxy.md", "control-plane-operations.md"))


def test_old_workers_with_connect_off(diagnosed: Cases[str, tuple[Diagnosis, Path]]) -> None:
    """Workers before 1.3 and connect off: the finding as `diagnose --json` prints it, its fix and the
    workers' 404 NR. The diagnosis is the cause's row (the same values and workers); the command line's
    JSON and exit code for a finding are test_missing_pem_is_named_first_and_its_ticket_replays'."""
    found, _ = diagnosed("legacy-worker-connect-off")
    first = found.to_json()["findings"][0]
    assert first["id"] == "legacy-worker-connect-off" and "connect.enabled: true" in first["fix"]
    assert any("404 NR" in e for e in first["evidence"])


@dataclass(frozen=True)
class Replayed:
    """A cause's ticket as written (the scenario, the files beside it) and its replay on a fresh stack."""

    found: Diagnosis
    folder: Path
    path: Path
    written: list[Path]
    result: ScenarioResult


@pytest.fixture(scope="module")
def replayed(
    request: pytest.FixtureRequest, diagnosed: Cases[str, tuple[Diagnosis, Path]]
) -> Iterator[Cases[str, Replayed]]:
    """Each asked-for cause's ticket, written and replayed, two at a time (cases_support)."""

    def run(cause: str) -> Replayed:
        found, folder = diagnosed(cause)
        path = folder / "ticket" / f"ticket-{cause}.yaml"
        path.parent.mkdir()
        written = write_ticket(found, path)
        result = replay_one(load_scenario(str(path)), root=folder / "replay")
        return Replayed(found, folder, path, written, result)

    with cases(run, waiting_first(asked(request, "cause")), "replay") as held:
        yield held


@pytest.mark.parametrize("cause", [r[0] for r in CAUSE_ROWS])
def test_each_causes_ticket_replays_as_seen_then_fixed(replayed: Cases[str, Replayed], cause: str) -> None:
    """The written ticket replays on a fresh stack: its first step fails as the customer saw it (a render
    refusal: refused, as their helmfile sync was), its last applies the fix and passes. Secrets go as
    stand-ins, PEM as a block."""
    done = replayed(cause)
    path, result = done.path, done.result
    assert (
        yaml.safe_load(done.written[1].read_text()) == done.found.values
    )  # the customer's values round-trip
    data = yaml.safe_load(path.read_text())
    for step in data.get("steps", []):
        assert len(step["name"]) <= STEP_NAME and (
            step["name"].endswith("…") or not step["name"].endswith(" ")
        )
    if cause in ("frontend-private-ca", "frontend-expired"):
        assert "workerCallbackCaPem: |" in path.read_text()  # the stand-in CA, pasted as a block
        customer_key = (done.folder / "worker-public-tls" / "tls.key").read_bytes().strip()
        tickets = [p.read_bytes() for p in path.parent.rglob("*") if p.is_file()]
        assert len(tickets) > 2 and not any(customer_key in t for t in tickets)  # stand-ins, never their key
    assert result.ok, render_text(result)
    first, last = result.steps[0], result.steps[-1]
    if first.step.refused is not None:
        assert first.note.startswith("refused") and not first.traces
    else:
        assert first.traces and not any(t.outcome == "success" for t in first.traces)
    assert last.traces and all(t.outcome == "success" for t in last.traces)


@pytest.mark.parametrize(
    ("load", "cores", "seconds"),
    [(0.3, 2, 2.0), (2.0, 2, 2.0), (10.0, 2, 10.0), (6.0, 4, 3.0), (4.0, 0, 8.0)],
)
def test_a_probe_call_waits_longer_on_a_loaded_machine_and_no_less_idle(
    load: float, cores: int, seconds: float
) -> None:
    """A healthy gRPC probe ran past 2 s at load 10 on two cores, and the diagnosis named a cause it had not
    seen; the probe's deadline grows with the run queue per core, never below 2 s."""
    assert probe_timeout(load, cores) == pytest.approx(seconds)
