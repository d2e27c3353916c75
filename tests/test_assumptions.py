"""Nothing stands in silently (issue 26): what ncpsim assumes, and what it accepts but does not model.

Pure: the one function that lists the assumptions, from tables; the values keys accepted, not modelled;
the did-you-mean that keeps the user's levels; the report, `diagnose` and stderr lines built from them.
The end-to-end `up -f FILE` (stderr, report and `status --json`) is in tests/test_precedence.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scenarios.diagnose.diagnosis import Diagnosis
from scenarios.diagnose.report import text
from scenarios.load import load_scenario
from scenarios.report import input_assumptions, render_text, values_warnings
from scenarios.result import ScenarioResult, to_json
from scenarios.secrets import with_brought_secrets
from sim.model.assumptions import ISSUER, SECRET, STAND_IN, WORKER_UTILS, assumptions, frontend_stand_in
from sim.model.layering import Layer, defaults_layer, layer, suggest, unknown_keys
from sim.model.parts import SecretSpec, WorkerSpec
from sim.model.topology import ComputeSpec, build
from sim.model.values import DEFAULTS, deep_merge

DOMAIN = "callbacks.acme.example"
ON = {"workerCallbackProxy": {"enabled": True, "workerDomain": DOMAIN, "service": {"type": "LoadBalancer"}}}


def frontend(**tls: Any) -> dict[str, Any]:
    return deep_merge(ON, {"workerCallbackProxy": {"tls": {"frontend": tls}}})


def topology(values: dict[str, Any], secrets: tuple[SecretSpec, ...] = (), versions: tuple[str, ...] = ()):
    workers = tuple(WorkerSpec(f"w-{n}", "", v) for n, v in enumerate(versions))
    return build("t", deep_merge(DEFAULTS, values), compute=(ComputeSpec(workers),), secrets=secrets)


def kinds(values: dict[str, Any], backend: str = "local", **extra: Any) -> list[str]:
    return [a.kind for a in assumptions(topology(values, **extra), backend)]


@pytest.mark.parametrize(
    ("values", "extra", "backend", "expected"),
    [
        (ON, {}, "local", [STAND_IN, STAND_IN]),  # the stack's own frontend: only the standing stand-ins
        (ON, {}, "k3d", [STAND_IN]),  # k3d runs the real Envoy
        ({}, {}, "local", [STAND_IN]),  # proxy off: no proxy to stand in for
        (frontend(existingSecret="acme-tls"), {}, "local", [SECRET, STAND_IN, STAND_IN]),
        # the proxy off: the Secret is named, but nothing serves it
        (
            deep_merge(frontend(existingSecret="acme-tls"), {"workerCallbackProxy": {"enabled": False}}),
            {},
            "local",
            [STAND_IN],
        ),
        # the seed's own example name, not sent: still a stand-in
        (frontend(existingSecret="worker-public-tls"), {}, "k3d", [SECRET, STAND_IN]),
        # negative controls: declared by the scenario, or brought with --secret
        (frontend(existingSecret="acme-tls"), {"secrets": (SecretSpec("acme-tls"),)}, "k3d", [STAND_IN]),
        (
            frontend(existingSecret="acme-tls"),
            {"secrets": (SecretSpec("acme-tls", source="/x"),)},
            "k3d",
            [STAND_IN],
        ),
        (
            frontend(certificate={"issuerRef": {"kind": "ClusterIssuer", "name": "le"}}),
            {},
            "k3d",
            [ISSUER, STAND_IN],
        ),
        (ON, {"versions": ("1.4.0", "1.2.9", "1.3.1")}, "k3d", [STAND_IN]),  # versions it has profiles for
        (
            ON,
            {"versions": ("2.0.0", "1.4.0", "2.0.0", "0.9.1")},
            "k3d",
            [WORKER_UTILS, WORKER_UTILS, STAND_IN],
        ),
    ],
)
def test_assumptions_from_the_topology(
    values: dict[str, Any], extra: dict[str, Any], backend: str, expected: list[str]
) -> None:
    assert kinds(values, backend, **extra) == expected


def test_a_secret_not_sent_names_the_stand_in_and_how_to_bring_the_real_one() -> None:
    (secret,) = [a for a in assumptions(topology(frontend(existingSecret="acme-tls"))) if a.kind == SECRET]
    assert f"a stand-in certificate for *.{DOMAIN}" in secret.what and "existingSecret" in secret.what
    assert "--secret acme-tls=DIR" in secret.bring and "topology.secrets.acme-tls" in secret.bring
    assert str(secret).startswith("assumed: ") and "\n" not in str(secret) and secret.from_input
    assert frontend_stand_in(topology(frontend(existingSecret="acme-tls"))) == "acme-tls"
    assert frontend_stand_in(topology(frontend(existingSecret="acme-tls"), (SecretSpec("acme-tls"),))) is None


def test_worker_utils_it_has_no_profile_for_says_how_it_is_played() -> None:
    found = assumptions(topology(ON, versions=("0.9.1", "2.0.0", "2.0.0")), "k3d")
    assert [a.what.split(" is ")[0] for a in found[:2]] == [
        "worker-utils 0.9.1 (1 worker(s))",
        "worker-utils 2.0.0 (2 worker(s))",
    ]
    assert "CONNECT tunnels" in found[0].what and "forward-proxy requests" in found[1].what
    assert "--workers" in found[1].bring


# -- accepted, not modelled ------------------------------------------------------------------------
def customer(values: dict[str, Any], lines: dict[str, int]):
    return layer(
        [defaults_layer(), Layer("file", "c.yaml", values, {k: ("c.yaml", n) for k, n in lines.items()})]
    )


@pytest.mark.parametrize(
    ("values", "accepted", "unknown"),
    [
        (
            {"workerCallbackProxy": {"service": {"annotations": {"a.b/internal": "true"}}}},
            ["workerCallbackProxy.service.annotations"],
            [],
        ),
        (
            {"openbao": {"enabled": False}, "certManager": {"enabled": True}},
            ["openbao.enabled", "certManager.enabled"],
            [],
        ),
        (
            {"workerCallbackProxy": {"resources": {"limits": {"cpu": "1"}}, "replicaCount": 3}},
            ["workerCallbackProxy.replicaCount", "workerCallbackProxy.resources"],
            [],
        ),
        # negative control: a misspelling is still unknown, and told the key it missed
        (
            {"workerCallbackProxy": {"service": {"annotationz": {"a": "b"}}}},
            [],
            ["workerCallbackProxy.service.annotationz"],
        ),
    ],
)
def test_accepted_not_modelled(values: dict[str, Any], accepted: list[str], unknown: list[str]) -> None:
    layered = customer(values, {})
    assert sorted(a.path for a in layered.accepted) == sorted(accepted)
    assert [u.path for u in layered.unknown] == unknown


def test_an_accepted_key_names_its_file_line_and_what_the_field_would_do() -> None:
    layered = customer(
        {"workerCallbackProxy": {"service": {"annotations": {"x": "y"}}}},
        {"workerCallbackProxy.service.annotations": 6},
    )
    (key,) = layered.accepted
    assert str(key).startswith("c.yaml:6: workerCallbackProxy.service.annotations: accepted, not modelled (")
    assert key.to_json()["from"] == "c.yaml:6" and "load balancer" in key.why
    assert not unknown_keys({"workerCallbackProxy": {"service": {"annotations": {"x": "y"}}}})


@pytest.mark.parametrize(
    ("path", "suggestion"),
    [
        # the leaf is a known name elsewhere, but the user's levels are not there: no did-you-mean
        ("workerCallbackProxy.tls.podAnnotations", None),
        ("nats.server.annotations", None),
        # a level left out, or the key set too high, keeps the user's levels: still suggested
        ("invocation.connect", "workerCallbackProxy.invocation.connect"),
        ("workerCallbackProxy.existingSecret", "workerCallbackProxy.tls.frontend.existingSecret"),
        ("workerCallbackProxy.service.anotations", "workerCallbackProxy.service.annotations"),
        ("workerCallbackProxy.service.podAnnotations", "workerCallbackProxy.service.annotations"),
    ],
)
def test_did_you_mean_keeps_the_users_levels(path: str, suggestion: str | None) -> None:
    assert suggest(tuple(path.split("."))) == suggestion


# -- where they are said ---------------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def customer_file(tmp_path: Path) -> Path:
    return write(
        tmp_path / "customer.yaml",
        f"workerCallbackProxy:\n  enabled: true\n  workerDomain: {DOMAIN}\n"
        "  service:\n    type: LoadBalancer\n    annotations:\n      a.b/internal: 'true'\n"
        "  tls:\n    frontend:\n      existingSecret: acme-tls\n  workerDomian: typo.example\n",
    )


def test_the_report_says_each_once_in_text_and_json(customer_file: Path) -> None:
    scenario = load_scenario("http-callback", [customer_file])
    result = ScenarioResult(scenario, assumptions=list(assumptions(scenario.build_topology("r"))))
    report = render_text(result)
    for needle in (
        "assumed: Secret acme-tls",
        "workerCallbackProxy.service.annotations: accepted, not modelled",
    ):
        assert report.count(needle) == 1, report
    assert report.count("unknown key workerCallbackProxy.workerDomian") == 1
    data = to_json(result)
    assert [a["kind"] for a in data["assumptions"]] == [SECRET, STAND_IN, STAND_IN]
    assert [a["key"] for a in data["notModelled"]] == ["workerCallbackProxy.service.annotations"]


def test_stderr_lines_are_each_once_and_name_only_what_the_input_caused(customer_file: Path) -> None:
    scenarios = [load_scenario(name, [customer_file]) for name in ("http-callback", "wrong-path")]
    said = input_assumptions(scenarios, "local")
    assert len(said) == 1 and said[0].startswith("assumed: Secret acme-tls")
    warned = values_warnings(scenarios)
    assert len(warned) == 2 and warned[0].startswith("warning: ") and "accepted, not modelled" in warned[1]
    # negative control: the Secret brought with --secret, nothing is assumed for it
    brought = [with_brought_secrets(s, [f"acme-tls={customer_file.parent}"]) for s in scenarios]
    assert input_assumptions(brought, "local") == []


def probe_assumptions(values: dict, brought: tuple[SecretSpec, ...] = ()) -> list:
    """What a probe stack of `values` assumes (a diagnosis reads each probe's from its run)."""
    workers = (WorkerSpec("probe-0", "", "1.4.0"),)
    return list(assumptions(build("diagnose", values, compute=(ComputeSpec(workers),), secrets=brought)))


def test_diagnose_reads_an_unseen_certificate_as_unknown(tmp_path: Path) -> None:
    values = deep_merge(DEFAULTS, frontend(existingSecret="acme-tls"))
    found = probe_assumptions(values)
    accepted = "c.yaml:6: workerCallbackProxy.service.annotations: accepted, not modelled (...)"
    shown = text(Diagnosis([], probes=["1.4.0:system"], assumed=found, not_modelled=[accepted]))
    assert "assumed: Secret acme-tls" in shown and f"\n{accepted}\n" in shown  # a note, not a warning
    assert shown.splitlines()[-1].startswith("but the frontend certificate is unknown")
    # negative control: the customer's own certificate brought, the diagnosis does not call it unknown
    brought = probe_assumptions(values, (SecretSpec("acme-tls", source=str(tmp_path)),))
    assert [a.kind for a in brought] == [STAND_IN, STAND_IN]
    assert "unknown" not in text(Diagnosis([], probes=["1.4.0:system"], assumed=brought))
