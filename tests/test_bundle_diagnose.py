"""`diagnose --bundle`: what a support bundle shows, judged before any probe (scenarios/diagnose/facts.py,
pure, from bundles the collector wrote against stand-in clusters), and the whole command on the local
backend: each of three broken installs named first with its fix and the bundle file it read, a healthy
one exit 0 within its time. Value-level facts for a values file alone: two problems, two findings."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from bundle_support import (
    DOMAIN,
    LB_ADDRESS,
    PROXY_SERVICE,
    Frontend,
    Install,
    collect,
    healthy,
    rewrite_override,
    template_server,
)
from cases_support import Cases, asked, cases
from cli_support import ncpsim, ncpsim_process
from test_diagnose import ONE_NATS
from timeouts import scaled

from scenarios.bundle.archive import read_bundle
from scenarios.bundle.records import replayed_dns
from scenarios.bundle.world import BundleWorld, read_world
from scenarios.diagnose.assemble import write_ticket
from scenarios.diagnose.causes import BLOCKING, CAUSES
from scenarios.diagnose.customer import customer_values
from scenarios.diagnose.diagnosis import Diagnosis, diagnose
from scenarios.diagnose.facts import Customer, judge_facts, names_in_symptom
from scenarios.diagnose.judge import Finding
from scenarios.load import load_scenario
from scenarios.replay import replay_one
from scenarios.report import render_text
from scenarios.result import ScenarioResult
from sim.model.assumptions import DNS, Assumption
from sim.model.values import DEFAULT_WEBHOOK_URL

HEALTHY_BUDGET = scaled(15.0)  # seconds: issue 27's bound for a healthy bundle (idle; stretched by the load)
NOW = datetime.now(UTC)  # the fake clusters mint their certificates against the real clock


def install(kind: str) -> Install:
    """A customer's install, healthy but for `kind`. A broken one runs one NATS server (none of these
    kinds is about NATS: test_diagnose.ONE_NATS says why); the healthy one, the chart's three."""
    frontend = Frontend(names=("*.example.com",)) if kind == "names" else Frontend(expired=kind == "expired")
    more: dict[str, Any] = {} if kind == "healthy" else ONE_NATS
    found = Install(healthy(frontend, **more), frontend=frontend, pod_pem=frontend.ca_pem)
    if kind == "wrong-domain":
        found.custom_dns = template_server("callback.example.com")  # one letter off
    elif kind == "pending":
        found.lb_address = None
    elif kind == "no-pem-on-pods":
        found.pod_pem = None
    elif kind == "legacy":
        found.worker_utils = "1.2.9"
    elif kind == "exact-record":  # a hosts entry for invocation.<workerDomain> alone
        found.custom_dns = {
            "h.override": f"hosts {{\n  {LB_ADDRESS} invocation.{DOMAIN}\n  fallthrough\n}}\n"
        }
    elif kind == "service-name":
        found.custom_dns = rewrite_override()  # the make target's default, before #3257
    elif kind == "forwarded":
        found.custom_dns = {"f.server": f"{DOMAIN}:53 {{\n  forward . 10.0.0.53\n}}\n"}
    elif kind == "old-callout":
        found.callout_log = (
            "[pod/nats-auth-callout-service-0/callout] 2025-05-31T10:00:00Z INFO Authentication failed "
            '{"account": "Worker", "error": "plugin webhook not found for account Worker"}\n'
        )
    return found


@pytest.fixture(scope="module")
def bundle(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cases[str, Path]]:
    """Each kind of install collected once (collect.sh and its fakes: about a second), its bundle shared by
    the tests that read it (none writes into it); the kinds this run's tests ask for, two at a time."""

    def collected(kind: str) -> Path:
        return collect(tmp_path_factory.mktemp(f"bundle-{kind}"), install(kind))[0]

    with cases(collected, [str(k) for k in asked(request, "kind")], "collect") as held:
        yield held


def judged(archive: Path) -> tuple[list[Finding], list[str], list[Assumption], BundleWorld]:
    """What the bundle's files show, before any probe: (findings, notes, assumptions, its world)."""
    world = read_world(read_bundle(archive))
    layered = customer_values([], [], world)
    customer = Customer(layered.values, layered.locations(), NOW, world.certificates, world)
    return (*judge_facts(customer), world)


FACT_ROWS = [
    ("healthy", [], None),
    ("wrong-domain", ["rewrite-wrong-domain"], "coredns.yaml:39: template"),
    ("pending", ["proxy-lb-pending"], "control-plane/services.yaml:19"),
    ("names", ["frontend-certificate-names"], "control-plane/secrets.yaml:6"),
    ("expired", ["frontend-expired"], "control-plane/secrets.yaml:6"),
    ("no-pem-on-pods", ["pem-not-redeployed"], "pods.yaml:9"),
    ("legacy", ["legacy-worker-connect-off"], "pods.yaml:9"),
    ("old-callout", ["nats-account-not-read"], "nats-auth-callout-service.log:1"),
]


@pytest.mark.parametrize(("kind", "causes", "cited"), FACT_ROWS, ids=[r[0] for r in FACT_ROWS])
def test_the_bundle_shows_each_cause_citing_its_file(
    bundle: Cases[str, Path], kind: str, causes: list, cited: str
) -> None:
    ranked = Diagnosis(judged(bundle(kind))[0]).ranked()
    assert [f.cause.id for f in ranked] == causes
    if cited:
        assert any(cited in e for e in ranked[0].evidence), ranked[0].evidence


def test_a_rewrite_to_a_service_the_compute_cluster_lacks(bundle: Cases[str, Path]) -> None:
    found, _, _, _ = judged(bundle("service-name"))
    assert [f.cause.id for f in found] == ["rewrite-target-unresolved"]
    assert "worker-callback-proxy.nvcf.svc.cluster.local" in found[0].evidence[0]


def test_a_forwarded_domain_is_an_assumption_not_a_guess(bundle: Cases[str, Path]) -> None:
    found, _, _, world = judged(bundle("forwarded"))
    assert found == []
    (said,) = replayed_dns(world.compute[0], DOMAIN, world.service).assumed
    assert said.kind == DNS and f"forwards *.{DOMAIN} to 10.0.0.53" in said.what and "nslookup" in said.bring


def test_an_exact_record_alone_is_a_finding_for_grpc(bundle: Cases[str, Path]) -> None:
    """The customer's hosts entry for invocation.<workerDomain> only: HTTP resolves, gRPC's names do not."""
    found, _, assumed, _ = judged(bundle("exact-record"))
    assert [f.cause.id for f in found] == ["rewrite-missing"] and assumed == []
    assert (
        f"only invocation.{DOMAIN} has a rule" in found[0].evidence[0]
        and "coredns.yaml:" in found[0].evidence[0]
    )


# -- values alone: facts whether or not a probe reaches their layer ---------------------------------------
PROXY = {"enabled": True, "workerDomain": "grpc-worker.example.com", "service": {"type": "LoadBalancer"}}


def value_facts(values: dict, symptom: str | None = None) -> list[str]:
    customer = Customer(values, {}, NOW, symptom=symptom)
    return [f.cause.id for f in Diagnosis(judge_facts(customer)[0]).ranked()]


def test_two_problems_in_a_values_file_are_two_findings_most_blocking_first() -> None:
    both = {"workerCallbackProxy": {**PROXY, "service": {"type": "ClusterIP"}}}
    assert value_facts(both) == ["proxy-unreachable", "worker-ca-missing"]
    pem = {"global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}}}
    assert value_facts({"workerCallbackProxy": PROXY, **pem}) == []  # the control: both fixed


@pytest.mark.parametrize(
    ("symptom", "causes"),
    [
        (
            (
                "tls: failed to verify certificate: x509: certificate is valid for *.example.com, example.com, "
                "not invocation.grpc-worker.example.com"
            ),
            ["frontend-certificate-names"],
        ),
        ("x509: certificate is valid for *.grpc-worker.example.com, not callbacks.other.example", []),
    ],
    ids=["one-label-too-high", "names-cover-the-domain"],
)
def test_a_symptoms_names_are_judged_against_the_worker_domain(symptom: str, causes: list) -> None:
    pem = {"global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}}}
    assert value_facts({"workerCallbackProxy": PROXY, **pem}, symptom) == causes
    assert names_in_symptom(symptom) is not None


def test_every_cause_has_a_blocking_rank() -> None:
    assert set(BLOCKING) == set(CAUSES) and len(BLOCKING) == len(CAUSES)


@pytest.mark.parametrize(
    ("url", "api", "where"),
    [
        ("http://api.nvcf-api.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth", {}, "api.nvcf-api:8080"),
        (DEFAULT_WEBHOOK_URL, {}, "api.nvcf:8080"),
        ("http://api.example.com:8080/v2/nvcf/webhook/nats-auth", {}, "api.nvcf:8080"),  # not in the cluster
        (
            "http://api.nvcf-api.svc.cluster.local:8080/v2/other",
            {},
            "api.nvcf:8080",
        ),  # not the webhook's path
        # the values say where the API runs: a URL with another port does not move it (connection refused)
        (
            "http://api.nvcf-api.svc.cluster.local:9999/v2/nvcf/webhook/nats-auth",
            {"namespace": "nvcf-api"},
            "api.nvcf-api:8080",
        ),
    ],
)
def test_the_api_runs_where_the_values_say(url: str, api: dict[str, str], where: str) -> None:
    from dataclasses import replace

    from scenarios.load import load_scenario

    topology = load_scenario("http-callback").build_topology("t")
    values = {
        **topology.values,
        "api": api,
        "nats": {"authCallout": {"workerTokenAuth": {"webhookUrl": url}}},
    }
    service = replace(topology, values=values).api_service
    assert f"{service.name}.{service.namespace}:{service.port}" == where


# -- the command, on the local backend ---------------------------------------------------------------------
def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return ncpsim(*args, home=tmp_path / "home", env={"PATH": "/usr/bin:/bin"})


def run_cli(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`ncpsim diagnose ARGS` as a user runs it (a process: its time is theirs, interpreter start included)."""
    started = time.monotonic()
    done = ncpsim_process("diagnose", *args, home=tmp_path / "home", env={"PATH": "/usr/bin:/bin"})
    return done, time.monotonic() - started


BUNDLE_CAUSES = [
    ("wrong-domain", "rewrite-wrong-domain", "coredns.yaml:39"),
    ("pending", "proxy-lb-pending", "services.yaml:19"),
    ("names", "frontend-certificate-names", "secrets.yaml:6"),
    ("service-name", "rewrite-target-unresolved", "coredns.yaml:"),
    ("exact-record", "rewrite-missing", "coredns.yaml:"),
]


AS_FOUND = {  # the compute cluster's DNS in the ticket, exactly as its Corefile answers
    "wrong-domain": {"dnsRewrite": {"domain": "callback.example.com", "target": "proxy"}},
    "pending": {"dnsRewrite": {"target": "203.0.113.10"}},  # an address the load balancer does not have
    "names": {"dnsRewrite": {"target": "proxy"}},
    "service-name": {  # a Service the compute cluster does not have: NXDOMAIN, as there
        "dnsRecords": [{"kind": "regex", "name": r"(.*)\.callbacks\.example\.com", "target": PROXY_SERVICE}]
    },
    "exact-record": {"dnsRecords": [{"kind": "exact", "name": f"invocation.{DOMAIN}", "target": "proxy"}]},
}


@pytest.fixture(scope="module")
def diagnosed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, bundle: Cases[str, Path]
) -> Iterator[Cases[str, tuple[Diagnosis, Path]]]:
    """One in-process `diagnose --bundle` per broken install, shared by the tests that read it; two at a
    time (cases_support)."""

    def run(kind: str) -> tuple[Diagnosis, Path]:
        folder = tmp_path_factory.mktemp(kind)
        return diagnose([], bundle=bundle(kind), root=folder / "state"), folder

    with cases(run, [str(k) for k in asked(request, "kind")], "diagnosis") as held:
        yield held


@pytest.fixture(scope="module")
def replayed(
    request: pytest.FixtureRequest, diagnosed: Cases[str, tuple[Diagnosis, Path]]
) -> Iterator[Cases[str, tuple[Path, ScenarioResult]]]:
    """Each broken install's ticket, written (`--ticket-id SUP-42`) and replayed: (the ticket, its replay)."""

    def run(kind: str) -> tuple[Path, ScenarioResult]:
        found, folder = diagnosed(kind)
        path = folder / "tickets" / "sup-42.yaml"
        path.parent.mkdir()
        write_ticket(found, path, "SUP-42")
        return path, replay_one(load_scenario(str(path)), root=folder / "replay")

    with cases(run, [str(k) for k in asked(request, "kind")], "replay") as held:
        yield held


@pytest.mark.parametrize(("kind", "cause", "cited"), BUNDLE_CAUSES, ids=[r[0] for r in BUNDLE_CAUSES])
def test_diagnose_bundle_names_the_cause_first(
    diagnosed: Cases[str, tuple[Diagnosis, Path]], kind: str, cause: str, cited: str
) -> None:
    found, _ = diagnosed(kind)
    first = found.ranked()[0]
    assert first.cause.id == cause, [f.cause.id for f in found.ranked()]
    assert any(cited in e for e in first.evidence), first.evidence
    assert len(found.findings) == 1  # one problem, one finding: what it brings about is said under it


@pytest.mark.parametrize(("kind", "cause", "cited"), BUNDLE_CAUSES, ids=[r[0] for r in BUNDLE_CAUSES])
def test_a_bundles_ticket_replays_as_seen_then_fixed(
    replayed: Cases[str, tuple[Path, ScenarioResult]], kind: str, cause: str, cited: str
) -> None:
    path, result = replayed(kind)
    assert result.ok, render_text(result)
    failing = [s for s in result.steps if s.step.expect and s.step.expect.outcome == "failure"]
    assert failing and not any(t.outcome == "success" for t in failing[0].traces)
    assert result.steps[-1].traces and all(t.outcome == "success" for t in result.steps[-1].traces)
    assert "--bundle" in path.read_text().splitlines()[0]
    cluster = yaml.safe_load(path.read_text())["topology"]["computeClusters"][0]
    assert {k: v for k, v in cluster.items() if k != "workers"} == AS_FOUND[kind]
    if kind == "exact-record":  # HTTP callbacks arrive as the customer's do; gRPC's fail, then the fix
        assert [s.step.invoke["function"] for s in result.steps] == ["http-echo", "grpc-echo", "grpc-echo"]
        assert result.steps[0].traces and all(t.outcome == "success" for t in result.steps[0].traces)
        assert all(t.dns and t.dns.get("rcode") == "NXDOMAIN" for t in result.steps[1].traces)


def test_a_healthy_bundle_exits_0_within_its_budget(tmp_path: Path, bundle: Cases[str, Path]) -> None:
    """The negative control of the three above: the same install with nothing broken."""
    done, seconds = run_cli(tmp_path, "--bundle", str(bundle("healthy")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no findings" in done.stdout
    assert seconds <= HEALTHY_BUDGET, seconds


def test_a_healthy_token_mode_file_whose_api_runs_elsewhere_gives_no_finding(tmp_path: Path) -> None:
    values = {
        "workerCallbackProxy": PROXY,
        "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}},
        "nats": {
            "workerAuth": "token",
            "authCallout": {
                "workerTokenAuth": {
                    "webhookUrl": "http://api.nvcf-api.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth"
                }
            },
        },
    }
    path = tmp_path / "customer.yaml"
    path.write_text(yaml.safe_dump(values))
    done = run(tmp_path, "diagnose", "-f", str(path), "--workers", "1.4.0:system", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout)
    assert found["findings"] == []
    assert any("the NVCF API serves at" in a["what"] and a["kind"] == "api" for a in found["assumed"])


# -- up --bundle, replay --bundle, replay --secret -------------------------------------------------------
def test_replay_bundle_replays_the_customers_world(tmp_path: Path, bundle: Cases[str, Path]) -> None:
    """The install with its frontend one label too high fails as the customer's does (a healthy bundle's
    world passing is test_up_bundle_brings_the_customers_world_up's)."""
    done = run(tmp_path, "replay", "--bundle", str(bundle("names")))
    assert done.returncode == 1 and "0/1 scenarios passed" in done.stdout, done.stdout + done.stderr
    assert "stand-in" in done.stderr  # said, not silent: the certificate served is not theirs


def test_up_bundle_brings_the_customers_world_up(tmp_path: Path, bundle: Cases[str, Path]) -> None:
    """A healthy bundle's world comes up and its callbacks arrive (exit 0)."""
    try:
        done = ncpsim("up", "--bundle", str(bundle("healthy")), "--stack", "bundled", home=tmp_path / "home")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"invocation.{DOMAIN}" in done.stdout  # the customer's workerDomain, as their values say
    finally:
        assert run(tmp_path, "down", "--stack", "bundled", "--purge").returncode == 0


def test_replay_takes_a_secret_folder(tmp_path: Path) -> None:
    """A scenario naming an existingSecret it does not declare: with --secret the customer's corporate
    certificate is served and workers reject it; without, a stand-in from the public-style CA (control)."""
    from test_diagnose import corporate_secret

    scenario = tmp_path / "brought.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "brought",
                "summary": "the customer's own frontend certificate",
                "values": {
                    "workerCallbackProxy": {
                        **PROXY,
                        "tls": {"frontend": {"existingSecret": "worker-public-tls"}},
                    },
                    **ONE_NATS,
                },
                "topology": {
                    "grpcProxyReplicas": 0,
                    "computeClusters": [{"workers": [{"count": 1, "trust": "system"}]}],
                },
                "steps": [
                    {
                        "invoke": {"function": "http-echo"},
                        "expect": {
                            "outcome": "failure",
                            "error": "x509: certificate signed by unknown authority",
                        },
                    }
                ],
            }
        )
    )
    secret, _ = corporate_secret(tmp_path)
    done = run(tmp_path, "replay", f"scenario={scenario}", "--secret", secret)
    assert done.returncode == 0, done.stdout + done.stderr
    assert run(tmp_path, "replay", f"scenario={scenario}").returncode == 1
