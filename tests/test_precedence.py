"""Helm's precedence and each key's origin: defaults < scenario values < each -f FILE < --set < step setValues.

Pure tables first (sim.model.layering), then the command line end to end: `ncpsim up -f ... --set ...`
on a real local stack, `ncpsim status --json`, the JSON report, and `ncpsim down --purge`.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cli_support import ncpsim

from scenarios.load import load_scenario, scenario_from_data
from sim.errors import ConfigError
from sim.model.layering import (
    SCENARIO,
    STEP,
    Layer,
    defaults_layer,
    layer,
    parse_set,
    scenario_layer,
    suggest,
    then,
    unknown_keys,
)
from sim.model.values_file import file_layer

WDP = "workerCallbackProxy.workerDomain"
ENABLED = "workerCallbackProxy.enabled"


def nested(path: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- the precedence table -------------------------------------------------------------------------------
ORDER = ("scenario", "file1", "file2", "set", "step")  # lowest first; the defaults sit under all of them


def _layers(tmp_path: Path, setters: tuple[str, ...]) -> tuple[list[Layer], Layer]:
    """Each layer in `setters` sets the workerDomain to `<layer>.example`; file layers are real files."""

    def domain(name: str) -> dict[str, Any]:
        return nested(WDP, f"{name}.example") if name in setters else {}

    files = []
    for name in ("file1", "file2"):
        body = f"workerCallbackProxy:\n  workerDomain: {name}.example\n" if name in setters else "{}\n"
        files.append(file_layer(write(tmp_path / f"{name}.yaml", "# customer\n" + body)))
    sets = [parse_set(f"{WDP}=set.example")] if "set" in setters else []
    lines = {WDP: ("ticket.yaml", 7)} if "scenario" in setters else {}
    layers = [defaults_layer(), scenario_layer("ticket", domain("scenario"), lines), *files, *sets]
    return layers, Layer(
        STEP, "step 2", domain("step"), {WDP: ("ticket.yaml", 20)} if "step" in setters else {}
    )


def _expected_origin(winner: str | None, tmp_path: Path) -> str:
    return {
        None: "default",
        "scenario": "scenario ticket",
        "file1": f"{tmp_path / 'file1.yaml'}:3",
        "file2": f"{tmp_path / 'file2.yaml'}:3",
        "set": f"--set {WDP}=set.example",
        "step": "step 2 setValues",
    }[winner]


SUBSETS = [s for n in range(len(ORDER) + 1) for s in itertools.combinations(ORDER, n)]


@pytest.mark.parametrize("setters", SUBSETS, ids=["+".join(s) or "defaults only" for s in SUBSETS])
def test_each_layer_beats_the_ones_below(tmp_path: Path, setters: tuple[str, ...]) -> None:
    layers, step = _layers(tmp_path, setters)
    layered = then(layer(layers), step)
    winner = setters[-1] if setters else None
    assert layered.values["workerCallbackProxy"]["workerDomain"] == (
        f"{winner}.example" if winner else "grpc-worker.example.com"
    )
    assert str(layered.origins[WDP]) == _expected_origin(winner, tmp_path)
    # A scenario value is "overridden" only by what the customer brings (files, --set), never by a step.
    customer = [s for s in setters if s in ("file1", "file2", "set")]
    overridden = "scenario" in setters and bool(customer)
    assert [o.path for o in layered.overrides] == ([WDP] if overridden else [])
    if overridden:
        assert str(layered.overrides[0].by) == _expected_origin(customer[-1], tmp_path)


def test_origins_per_key_and_the_overrides_listed(tmp_path: Path) -> None:
    """Each layer sets a key of its own and they share one: every key names the layer that set it."""
    scenario = {
        "workerCallbackProxy": {
            "enabled": True,
            "workerDomain": "grpc-worker.example.com",
            "invocation": {"connect": {"enabled": False}},
        }
    }
    customer = write(
        tmp_path / "customer.yaml",
        "workerCallbackProxy:\n  workerDomain: callbacks.customer.example\n"
        "  invocation:\n    upstreamTls:\n      enabled: false\n",
    )
    layered = layer(
        [
            defaults_layer(),
            scenario_layer("http-callback", scenario, {}),
            file_layer(customer),
            parse_set("workerCallbackProxy.invocation.connect.enabled=true"),
        ]
    )
    origins = {
        path: str(layered.origins[path])
        for path in (
            WDP,
            ENABLED,
            "workerCallbackProxy.invocation.upstreamTls.enabled",
            "workerCallbackProxy.invocation.connect.enabled",
            "nats.workerAuth",
        )
    }
    assert origins == {
        WDP: f"{customer}:2",
        ENABLED: "scenario http-callback",
        "workerCallbackProxy.invocation.upstreamTls.enabled": f"{customer}:5",
        "workerCallbackProxy.invocation.connect.enabled": "--set workerCallbackProxy.invocation.connect.enabled=true",
        "nats.workerAuth": "default",
    }
    assert [(o.path, o.scenario_value, o.value, str(o.by)) for o in layered.overrides] == [
        (WDP, "grpc-worker.example.com", "callbacks.customer.example", f"{customer}:2"),
        (
            "workerCallbackProxy.invocation.connect.enabled",
            False,
            True,
            "--set workerCallbackProxy.invocation.connect.enabled=true",
        ),
    ]
    assert layered.overrides[0].to_json() == {
        "key": WDP,
        "value": "callbacks.customer.example",
        "from": f"{customer}:2",
        "scenarioValue": "grpc-worker.example.com",
        "scenario": "scenario http-callback",
    }


def test_a_customer_value_in_place_of_a_scenario_mapping_overrides_all_under_it() -> None:
    scenario = {"workerCallbackProxy": {"tls": {"frontend": {"existingSecret": "worker-public-tls"}}}}
    layered = layer(
        [
            defaults_layer(),
            scenario_layer("s", scenario, {}),
            parse_set("workerCallbackProxy.tls.frontend=null"),
        ]
    )
    assert layered.values["workerCallbackProxy"]["tls"]["frontend"] is None
    assert "workerCallbackProxy.tls.frontend.existingSecret" not in layered.origins
    (override,) = layered.overrides
    assert (override.path, override.value, str(override.by)) == (
        "workerCallbackProxy.tls.frontend.existingSecret",
        None,
        "--set workerCallbackProxy.tls.frontend=null",
    )


def test_later_files_win_in_the_order_given(tmp_path: Path) -> None:
    a = write(tmp_path / "a.yaml", "workerCallbackProxy:\n  workerDomain: a.example\n  enabled: true\n")
    b = write(tmp_path / "b.yaml", "workerCallbackProxy:\n  workerDomain: b.example\n")
    for first, second, domain in ((a, b, "b.example"), (b, a, "a.example")):
        scenario = load_scenario("http-callback", [first, second])
        assert scenario.values["workerCallbackProxy"]["workerDomain"] == domain
        assert scenario.layering is not None
        assert str(scenario.layering.origins[WDP]) == f"{second}:2"


# -- validation errors name the layer that set the key ---------------------------------------------------
def test_validation_errors_name_the_winning_layer(tmp_path: Path) -> None:
    ticket = tmp_path / "ticket.yaml"
    data = {
        "name": "t",
        "summary": "s",
        "values": nested(ENABLED, True),
        "steps": [{"invoke": {"function": "http-echo"}}],
    }
    origin = {"values.workerCallbackProxy.enabled": (str(ticket), 4)}
    with pytest.raises(ConfigError, match=rf"^--set {WDP}=Bad_Domain: {WDP}: "):
        scenario_from_data(data, ticket, origin, sets=[f"{WDP}=Bad_Domain"])
    bad = write(tmp_path / "customer.yaml", "workerCallbackProxy:\n  workerDomain: Bad_Domain\n")
    with pytest.raises(ConfigError, match=rf"^{bad}:2: {WDP}: "):
        scenario_from_data(data, ticket, origin, [bad])
    # The file's bad domain is hidden by a --set above it, as Helm would render it.
    scenario = scenario_from_data(data, ticket, origin, [bad], sets=[f"{WDP}=ok.example"])
    assert scenario.values["workerCallbackProxy"]["workerDomain"] == "ok.example"


# -- unknown keys ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "suggestion"),
    [
        ("workerCallbackProxy.workerDomian", WDP),
        ("workerCallbackProxy.workerdomain", WDP),
        ("workerCallbackProxy.enable", ENABLED),
        ("workerDomain", WDP),  # at the wrong level
        ("workerCallbackProxy.connect", "workerCallbackProxy.invocation.connect"),
        ("workerCallbackProxy.invocation.upstreamTLS", "workerCallbackProxy.invocation.upstreamTls"),
        ("global.workerEndpoint", "global.workerEndpoints"),
        ("nats.workerAuh", "nats.workerAuth"),
        ("cassandra", None),
        ("workerCallbackProxy.replicaCount", None),
        ("nats.replicas", "nats.config.cluster.replicas"),  # the StatefulSet's replicas, at the wrong level
    ],
)
def test_suggestion(path: str, suggestion: str | None) -> None:
    assert suggest(tuple(path.split("."))) == suggestion


@pytest.mark.parametrize(
    ("values", "unknown"),
    [
        (
            {"workerCallbackProxy": {"workerDomian": "x", "enabled": True}},
            ["workerCallbackProxy.workerDomian"],
        ),
        ({"cassandra": {"replicas": 3, "image": {"tag": "x"}}}, ["cassandra"]),  # once, not per key under it
        (nested("api.podAnnotations", {"example.com/scrape": "true"}), []),  # the user's own keys
        (nested("invocation.env", {"LOG_LEVEL": "debug"}), []),
        (nested("workerCallbackProxy.image", {"pullPolicy": "Always"}), []),  # image.* (DESIGN.md)
        (nested("nats.image", {"tag": "2.12-alpine"}), []),  # read by the k3d render
        (nested("nats.imag", {"tag": "2.12-alpine"}), ["nats.imag"]),
        (nested("nats.jetstream.ackWaitSeconds", 2), []),  # read by sim/nats
        (nested("nats.jetstream.publishTimeoutSeconds", 0.5), []),
        (nested("natsAuthCalloutService.serviceConfig.logging", {"level": "debug"}), []),
        (
            nested("natsAuthCalloutService.serviceConfig", {"port": 1}),
            ["natsAuthCalloutService.serviceConfig.port"],
        ),
        ({"openbao": {"enabled": True}, "certManager": {"enabled": True}}, []),  # real keys the seeds name
        (
            nested(
                "workerCallbackProxy.tls.frontend.certificate.issuerRef",
                {"kind": "ClusterIssuer", "name": "le"},
            ),
            [],
        ),
    ],
)
def test_unknown_keys(values: dict[str, Any], unknown: list[str]) -> None:
    assert [".".join(parts) for parts in unknown_keys(values)] == unknown


def test_misspelt_customer_key_is_one_warning_with_file_line_and_suggestion(tmp_path: Path) -> None:
    customer = write(
        tmp_path / "customer.yaml",
        "workerCallbackProxy:\n  enabled: true\n  workerDomian: callbacks.customer.example\n",
    )
    scenario = load_scenario("http-callback", [customer])
    assert scenario.layering is not None
    assert [str(u) for u in scenario.layering.unknown] == [
        f"{customer}:3: unknown key workerCallbackProxy.workerDomian (did you mean {WDP}?)"
    ]
    # The real chart ignores the key: the scenario's workerDomain stays, which is the field bug to see.
    assert scenario.values["workerCallbackProxy"]["workerDomain"] == "grpc-worker.example.com"


def test_a_refused_render_names_the_misspelling_that_caused_it(tmp_path: Path) -> None:
    """The proxy on, the domain emptied, and the real one under a misspelt key: one line says both."""
    customer = write(
        tmp_path / "customer.yaml",
        "workerCallbackProxy:\n  enabled: true\n  workerDomain: ''\n"
        "  workerDomian: callbacks.customer.example\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_scenario("http-callback", [customer])
    message = str(caught.value)
    assert message.startswith(f"{customer}:3: {WDP}: must be set")
    assert message.endswith(
        f"(also: {customer}:4: unknown key workerCallbackProxy.workerDomian (did you mean {WDP}?))"
    )
    assert "\n" not in message and [i.path for i in caught.value.issues] == [WDP]


def test_catalogue_values_hold_no_unknown_keys_and_name_what_they_need() -> None:
    from scenarios.lookup import catalogue

    for name, _ in catalogue():
        scenario = load_scenario(name, allow_expected_error=True)
        assert scenario.layering is not None and not scenario.layering.unknown, name
        if scenario.topology.get("computeClusters"):  # callbacks cross clusters: the proxy is asked for
            enabled = scenario.layering.origins[ENABLED]
            assert (enabled.kind, scenario.values["workerCallbackProxy"]["enabled"]) == (SCENARIO, True), name
            # Exposed to the compute clusters (LoadBalancer), or not, as the scenario says: never by default.
            assert scenario.layering.origins["workerCallbackProxy.service.type"].kind == SCENARIO, name


# -- --set typing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("workerCallbackProxy.enabled=true", nested(ENABLED, True)),
        ("workerCallbackProxy.enabled=false", nested(ENABLED, False)),
        ("a.port=8080", nested("a.port", 8080)),
        ("a.ratio=0.5", nested("a.ratio", 0.5)),
        (f"{WDP}=callbacks.customer.example", nested(WDP, "callbacks.customer.example")),
        ('a.b="true"', nested("a.b", "true")),  # quoted: the string
        ("a.b=[x, y]", nested("a.b", ["x", "y"])),
        ("a.b=[1, true]", nested("a.b", [1, True])),
        ("a.b={k: v}", nested("a.b", {"k": "v"})),
        ("a.b=null", nested("a.b", None)),
        ("a.b=", nested("a.b", "")),
        ("a.b=x=y", nested("a.b", "x=y")),
        ("a.b=[unclosed", nested("a.b", "[unclosed")),  # not YAML: the text as given
        (
            'api.podAnnotations["example.com/scrape"]="true"',
            {"api": {"podAnnotations": {"example.com/scrape": "true"}}},
        ),
        (
            r"api.podAnnotations.example\.com/scrape=x",
            {"api": {"podAnnotations": {"example.com/scrape": "x"}}},
        ),
    ],
)
def test_set_is_yaml_typed(text: str, values: dict[str, Any]) -> None:
    assert parse_set(text).values == values


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("workerCallbackProxy.enabled", "expected key.path=value"),
        ("=true", "expected key.path=value"),
        ("a.list[0]=x", "list indexes are not supported"),
        ("a..b=x", "cannot read the key"),
        ("a.=x", "cannot read the key"),
    ],
)
def test_set_mistakes_are_one_line(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_set(text)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"--set {text}: ")


# -- end to end: the command line on a real local stack -----------------------------------------------------
def test_customer_file_wins_end_to_end(tmp_path: Path) -> None:
    customer = write(
        tmp_path / "customer.yaml",
        "workerCallbackProxy:\n"
        "  workerDomain: callbacks.customer.example\n"
        "  invocation:\n    upstreamTls:\n      enabled: false\n"
        "  tls:\n    frontend:\n      existingSecret: customer-tls\n",
    )  # undeclared: public-style
    typo = write(tmp_path / "typo.yaml", "workerCallbackProxy:\n  workerDomian: elsewhere.example\n")
    env = {**os.environ, "NCPSIM_HOME": str(tmp_path / "home")}
    try:
        up = ncpsim(
            "up",
            "-f",
            str(customer),
            "-f",
            str(typo),
            "--set",
            "workerCallbackProxy.image.tag=v1.32",
            "scenario=http-callback",
            "--stack",
            "prec-test",
            env=env,
        )
        assert up.returncode == 0, up.stdout + up.stderr
        # The misspelling once, in the report; the stand-in for the Secret nobody sent on stderr too.
        warning = f"warning: {typo}:2: unknown key workerCallbackProxy.workerDomian (did you mean {WDP}?)"
        assert (up.stdout + up.stderr).count(warning) == 1 and warning in up.stdout
        assert [line.split(":")[0] for line in up.stderr.splitlines()] == ["assumed"]
        assert "Secret customer-tls" in up.stderr and "--secret customer-tls=DIR" in up.stderr
        assert f'{WDP}: "callbacks.customer.example" from {customer}:2' in up.stdout
        shown = ncpsim("status", "--json", "--stack", "prec-test", env=env)
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert status["workerDomain"] == "callbacks.customer.example"
        assert status["proxy"]["http"]["name"] == "invocation.callbacks.customer.example"
        targets = [p["target"] for p in status["pods"] if p["role"] == "invocation"]
        assert targets and all(
            t.startswith("http://") and t.endswith(".invocation.nvcf.svc.cluster.local:8080") for t in targets
        ), targets
        report = json.loads((Path(status["stateDir"]) / "reports" / "report.json").read_text())
        assert report["ok"] and report["overrides"] == [
            {
                "key": WDP,
                "value": "callbacks.customer.example",
                "from": f"{customer}:2",
                "scenarioValue": "grpc-worker.example.com",
                "scenario": "scenario http-callback",
            }
        ]
        assert report["warnings"] == [
            f"{typo}:2: unknown key workerCallbackProxy.workerDomian (did you mean {WDP}?)"
        ]
        assert [a["kind"] for a in report["assumptions"]][:1] == ["secret"]
        assert [a["what"] for a in status["assumptions"]] == [a["what"] for a in report["assumptions"]]
    finally:
        down = ncpsim("down", "--stack", "prec-test", "--purge", env=env)
    assert down.returncode == 0, down.stderr
    assert not (tmp_path / "home" / "prec-test").exists()


def test_replay_takes_repeated_files_and_sets_and_warns_once(tmp_path: Path) -> None:
    typo = write(tmp_path / "typo.yaml", "workerCallbackProxy:\n  workerDomian: elsewhere.example\n")
    later = write(tmp_path / "later.yaml", "workerCallbackProxy:\n  workerDomain: later.example\n")
    env = {**os.environ, "NCPSIM_HOME": str(tmp_path / "home")}
    done = ncpsim(
        "replay",
        "scenario=wrong-path",
        "-f",
        str(typo),
        "-f",
        str(later),
        "--set",
        f"{WDP}=set.example",
        "--json",
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"warning: {typo}:2: unknown key workerCallbackProxy.workerDomian (did you mean {WDP}?)"
    ]
    (report,) = json.loads(done.stdout)["scenarios"]  # replay --json is one document (issue 29)
    assert [(o["key"], o["value"], o["from"]) for o in report["overrides"]] == [
        (WDP, "set.example", f"--set {WDP}=set.example")
    ]
