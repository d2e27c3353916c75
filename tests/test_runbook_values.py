"""Runbooks on the customer's values: each rehearsal reads the layered values (defaults < scenario < -f <
--set < setValues) it can use, on a fresh or an existing install, and names in one line what it cannot use.
Each case beside its negative control: the same runbook without the value (or on the other install)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_support import ncpsim

from clusters.local import LocalBackend
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.result import ScenarioResult
from sim import runbooks
from sim.model.layering import defaults_layer, layer, parse_set, scenario_layer
from sim.model.values_file import file_layer
from sim.runbooks.admin_runs import STEP_DISABLE, STEP_GATEWAY, STEP_UNINSTALL
from sim.runbooks.given import EXISTING, FRESH, Given
from sim.runbooks.nats_runs import STEP_TOKEN
from sim.runbooks.service_runs import STEP_ANNOTATIONS

BOTH_OFF = "adminIssuerProxy:\n  enabled: false\n  gateway:\n    enabled: false\n"


def given(*sets: str, install: str | None = None) -> Given:
    return Given.of(layer([defaults_layer(), *(parse_set(s) for s in sets)]), install)


# -- Given: what the customer set, and where ---------------------------------------------------------------
def test_given_holds_only_what_was_set_above_the_defaults_with_its_origin(tmp_path: Path) -> None:
    customer = tmp_path / "customer.yaml"
    customer.write_text(BOTH_OFF + "nats:\n  workerAuth: token\n")
    layered = layer(
        [
            defaults_layer(),
            scenario_layer("s", {"ess": {"podAnnotations": {"a.b/c": "x"}}}, {}),
            file_layer(customer),
            parse_set("adminIssuerProxy.gateway.enabled=true"),
        ]
    )
    got = Given.of(layered)
    assert got.leaves == {
        ("ess", "podAnnotations", "a.b/c"): ("x", "scenario s"),
        ("adminIssuerProxy", "enabled"): (False, f"{customer}:2"),
        ("adminIssuerProxy", "gateway", "enabled"): (True, "--set adminIssuerProxy.gateway.enabled=true"),
        ("nats", "workerAuth"): ("token", f"{customer}:6"),
    }
    over = got.over({"adminIssuerProxy": {"enabled": True, "x": 1}}, (("adminIssuerProxy",),))
    assert over == {"adminIssuerProxy": {"enabled": False, "x": 1, "gateway": {"enabled": True}}}
    line = got.unused_line((("adminIssuerProxy",),), "it reads only adminIssuerProxy.*", reads_install=True)
    assert line == (
        f'not used by this runbook: nats.workerAuth ({customer}:6), ess.podAnnotations["a.b/c"] (scenario s): '
        "it reads only adminIssuerProxy.*"
    )
    assert Given.of(layer([defaults_layer()])).leaves == {}  # the chart defaults are nobody's choice


def test_install_is_fresh_or_existing_and_is_named_when_a_runbook_ignores_it() -> None:
    with pytest.raises(ValueError, match="fresh or existing"):
        Given(install="new")
    assert Given(install=FRESH).unused_line((), "why", reads_install=False) == (
        "not used by this runbook: install: fresh: why"
    )
    assert Given(install=EXISTING).unused_line((), "why", reads_install=True) is None


# -- the acceptance: the edge still serving, as the seed says ----------------------------------------------
def replay(tmp_path: Path, name: str, files: list[Path] | None = None) -> ScenarioResult:
    scenario = load_scenario(name, values_files=files)
    return run_scenario(scenario, LocalBackend(tmp_path / "state"), "runbook")


def test_a_file_with_both_switches_off_on_an_existing_install_leaves_the_edge_serving(tmp_path: Path) -> None:
    customer = tmp_path / "customer.yaml"
    customer.write_text(BOTH_OFF)
    result = replay(tmp_path, "admin-issuer-edge-right", [customer])
    assert not result.ok
    note = result.steps[0].note
    assert "edge check: curl exit 0, status 405 (served)" in note
    assert f"adminIssuerProxy.enabled: false ({customer}:2) on an existing install removes nothing" in note
    assert f"fix: {STEP_UNINSTALL}" in note
    # negative control: the runbook's own story (gateway.enabled false only) removes the route
    control = replay(tmp_path / "control", "admin-issuer-edge-right")
    assert control.ok and "status 404 (no-route)" in control.steps[0].note


def test_the_same_file_on_a_fresh_install_installs_nothing() -> None:
    report = runbooks.run(
        "admin-issuer-edge",
        "right",
        None,
        given("adminIssuerProxy.enabled=false", "adminIssuerProxy.gateway.enabled=false", install=FRESH),
    )
    assert report.ok and report.end_state["edge"][0]["outcome"] == "no-route"
    assert "(installs nothing)" in "\n".join(report.steps)


def test_ncpsim_replay_with_f_shows_it(tmp_path: Path) -> None:
    customer = tmp_path / "customer.yaml"
    customer.write_text(BOTH_OFF)

    def replay(*args: str) -> subprocess.CompletedProcess[str]:
        return ncpsim("replay", "admin-issuer-edge-right", *args, home=tmp_path / "home")

    done = replay("-f", str(customer))
    assert done.returncode == 1, done.stderr
    assert "(served)" in done.stdout and "removes nothing" in done.stdout
    assert replay().returncode == 0  # negative control: without the file the runbook's story holds


# -- each runbook family reads its values -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "variant", "sets", "mistake", "fix"),
    [
        # a file that keeps the proxy enabled: the removal does not last past the next sync
        (
            "admin-issuer-removal",
            "right",
            ["adminIssuerProxy.enabled=true"],
            "next sync reinstalls",
            STEP_DISABLE,
        ),
        # gateway.enabled: true keeps the route: the runbook's own fix does not happen
        (
            "admin-issuer-edge",
            "right",
            ["adminIssuerProxy.gateway.enabled=true"],
            "route stays attached",
            STEP_GATEWAY,
        ),
        # nats.workerAuth: nkey in the file: the switch never happens
        ("nats-token-switch", "right", ["nats.workerAuth=nkey"], "never switched to token mode", STEP_TOKEN),
        # a customer's unquoted annotation value fails the render
        (
            "service-annotations",
            "right",
            ["api.podAnnotations.port=8080"],
            "value must be a string",
            STEP_ANNOTATIONS,
        ),
    ],
)
def test_a_customer_value_changes_what_the_runbook_shows(
    name: str, variant: str, sets: list[str], mistake: str, fix: str
) -> None:
    control = runbooks.run(name, variant, None)
    assert control.ok, control.mistake  # negative control: the runbook's own story passes
    report = runbooks.run(name, variant, None, given(*sets))
    assert not report.ok and mistake in (report.mistake or "") and report.fix_step == fix
    assert f"--set {sets[0]}" in "\n".join(report.steps) + (report.mistake or "")  # where the value came from


@pytest.mark.parametrize(
    ("name", "sets", "why"),
    [
        ("ess-mek-rotation", ["ess.podAnnotations.team=a"], "the seeds name no value for ESS's keys"),
        ("openbao-restart", ["openbao.server.annotations.a=b"], "a restart reads no values"),
        ("admin-issuer-edge-cert", ["adminIssuerProxy.enabled=false"], "removes the proxy by hand"),
        ("nats-values", ["adminIssuerProxy.enabled=false"], "it reads only nats.workerAuth"),
    ],
)
def test_what_a_runbook_cannot_use_is_named_in_one_line(name: str, sets: list[str], why: str) -> None:
    report = runbooks.run(name, "right", None, given(*sets))
    assert report.ok
    [note] = report.notes
    key = sets[0].split("=")[0]
    assert note.startswith("not used by this runbook: ") and why in note and "\n" not in note
    assert key.split(".")[0] in note and f"--set {sets[0]}" in note
    assert f"note: {note}" in report.summary()
    assert runbooks.run(name, "right", None).notes == ()  # negative control: nothing given, nothing noted


def test_a_steps_set_values_reach_the_runbook(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nsummary: s\nsteps:\n"
        "  - setValues: {adminIssuerProxy: {enabled: false}}\n"
        "    runbook: {name: admin-issuer-edge, variant: right}\n"
        "    expect: {outcome: failure, error: removes nothing}\n"
    )
    result = run_scenario(load_scenario(str(path)), LocalBackend(tmp_path / "state"), "runbook")
    assert result.ok, result.failures
    assert "adminIssuerProxy.enabled: false (step 1 setValues)" in result.steps[0].note
