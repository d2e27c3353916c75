"""Malformed scenario and values files, as a support engineer would write them from a ticket.

Each goes through the real command line (`ncpsim up scenario=PATH` or `ncpsim replay scenario=PATH`) and
must end with exactly one line on stderr naming the file, the line or key path, and what was expected;
exit code 2; no traceback. No stack starts, so none of these needs a teardown.
"""

from __future__ import annotations

import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_support import REPO, ncpsim

GOOD_HEAD = """\
name: from-a-ticket
summary: reproduce a customer's callback failure
values:
  workerCallbackProxy:
    enabled: true
    workerDomain: grpc-worker.example.com
topology:
  grpcProxyReplicas: 0
  computeClusters:
    - workers: [{count: 1, trust: stack}]
"""
GOOD_STEPS = """\
steps:
  - name: invoke
    invoke: {function: http-echo, count: 2}
    expect: {outcome: success}
"""


@dataclass(frozen=True)
class Case:
    id: str
    scenario: str  # the scenario file's text
    wants: tuple[str, ...]  # besides the file name: the key path (and line) and what was expected
    values: str | None = None  # a customer's values file, given with -f
    command: str = "up"
    names_values_file: bool = False  # the error is in the -f file, so that is the file to name


CATALOGUE = "catalogue:"  # Case.scenario naming a catalogue entry instead of giving a file's text

CASES = [
    Case("yaml-tab", GOOD_HEAD + "steps:\n\t- invoke: {function: http-echo}\n", (":12:", "tabs")),
    Case(
        "unknown-top-key",
        GOOD_HEAD + GOOD_STEPS.replace("steps:", "stpes:"),
        (":11:", "stpes", "unknown key", "steps"),
    ),
    Case(
        "unknown-step-key",
        GOOD_HEAD + GOOD_STEPS.replace("invoke:", "invokee:"),
        (":13:", "steps[0].invokee", "unknown key", "invoke"),
    ),
    Case(
        "wrong-type",
        GOOD_HEAD + GOOD_STEPS.replace("count: 2", 'count: "ten"'),
        (":13:", "steps[0].invoke.count", "integer"),
    ),
    Case(
        "bad-enum",
        GOOD_HEAD + GOOD_STEPS.replace("http-echo", "https-echo"),
        (":13:", "steps[0].invoke.function", "http-echo", "grpc-echo"),
        command="replay",
    ),
    Case(
        "missing-summary",
        GOOD_HEAD.replace("summary: reproduce a customer's callback failure\n", "") + GOOD_STEPS,
        ("summary", "required"),
    ),
    Case(
        "bad-worker-utils",
        GOOD_HEAD.replace("trust: stack", 'trust: stack, workerUtils: "1.3"') + GOOD_STEPS,
        (":10:", "topology.computeClusters[0].workers[0].workerUtils", "expected form"),
    ),
    Case(
        "two-actions",
        GOOD_HEAD + GOOD_STEPS.replace("    expect:", '    probe: {targets: ["http://{pod}/"]}\n    expect:'),
        (":14:", "steps[0].probe", "one action per step"),
    ),
    Case(
        "unknown-placeholder",
        GOOD_HEAD + 'steps:\n  - probe: {targets: ["http://{pdo}:8443/"]}\n',
        (":12:", "steps[0].probe.targets[0]", "{pdo}", "{pod}"),
        command="replay",
    ),
    Case(
        "expect-list-unknown-key",
        GOOD_HEAD + GOOD_STEPS.replace("expect: {outcome: success}", "expect: [{outcom: success}]"),
        (":14:", "steps[0].expect[0].outcom", "unknown key", "outcome"),
    ),
    Case(
        "values-rule",
        GOOD_HEAD.replace("topology:", "  nats:\n    workerAuth: password\ntopology:") + GOOD_STEPS,
        (":8:", "nats.workerAuth must be nkey or token"),
    ),
    Case(
        "set-values-rule",
        GOOD_HEAD + GOOD_STEPS + "  - setValues:\n      workerCallbackProxy:\n"
        "        workerDomain: Bad_Domain\n    redeploy: proxy\n",
        (":17:", "workerCallbackProxy.workerDomain", "not a valid DNS name"),
        command="replay",
    ),
    Case(
        "customer-values-boolean",
        GOOD_HEAD + GOOD_STEPS,
        (":4:", "workerCallbackProxy.invocation.connect.enabled", "true or false"),
        values='workerCallbackProxy:\n  invocation:\n    connect:\n      enabled: "yes"\n',
        names_values_file=True,
    ),
    Case(
        "customer-values-yaml",
        GOOD_HEAD + GOOD_STEPS,
        (":2:", "quoted scalar", "close the quote"),
        values='global:\n  workerEndpoints: {invocationProxyURL: "https://x\n',
        names_values_file=True,
        command="replay",
    ),
    Case("top-level-list", "- name: x\n- summary: y\n", (":1:", "top level must be a mapping")),
    Case(
        "fault-link-protocol",
        GOOD_HEAD
        + "steps:\n  - fault: {link: {from: ncpsim-compute-1, to: 10.100.0.10, drop: 1, protocol: bogus}}\n",
        (":12:", "steps[0].fault.link.protocol", "'tcp', 'udp', 'any'"),
    ),
    Case(
        "fault-link-unknown-key",
        GOOD_HEAD
        + "steps:\n  - fault:\n      link: {from: ncpsim-compute-1, to: 10.100.0.10, latency: 50}\n",
        (":13:", "steps[0].fault.link.latency", "did you mean latencyMs?"),
        command="replay",
    ),
    Case(
        "fault-scale-past-count",
        GOOD_HEAD + "steps:\n  - fault: {scale: {role: invocation, replicas: 3}}\n",
        (
            ":12:",
            "steps[0].fault.scale.replicas",
            "more than the 2 invocation pods",
            "topology.invocationReplicas",
        ),
    ),
    Case(
        "fault-scale-nats",
        GOOD_HEAD + "steps:\n  - fault: {scale: {role: nats, replicas: 7}}\n",
        (":12:", "steps[0].fault.scale.replicas", "more than the 3 nats pods"),
        command="replay",
    ),
    Case(
        "catalogue-split-plane-url",
        CATALOGUE + "split-plane-url-set",
        (":10:", "global.workerEndpoints.invocationServiceURL", "must be empty"),
    ),
    Case(
        "catalogue-bad-proxy-url",
        CATALOGUE + "bad-invocation-proxy-url",
        (":10:", "global.workerEndpoints.invocationProxyURL", "must use https"),
    ),
    Case(
        "error-scenario-accepted",
        GOOD_HEAD + 'expectError: "global.workerEndpoints"\n',
        (":11:", "expectError", "accepted"),
    ),
]


@dataclass(frozen=True)
class Outcome:
    done: subprocess.CompletedProcess
    scenario: Path  # the file the error must name (unless it is in the values file)
    values: Path | None
    state: Path  # NCPSIM_HOME of the run: nothing may have started there


def _run(case: Case, tmp_path: Path) -> Outcome:
    folder = tmp_path / case.id
    folder.mkdir()
    if case.scenario.startswith(CATALOGUE):  # a catalogue error scenario: `up` must refuse its values
        name = case.scenario[len(CATALOGUE) :]
        scenario, ref = REPO / "scenarios" / "catalogue" / f"{name}.yaml", name
    else:
        scenario = ref = folder / "ticket-1234.yaml"
        scenario.write_text(textwrap.dedent(case.scenario))
    args = [case.command, f"scenario={ref}"]
    values = None
    if case.values is not None:
        values = folder / "customer-values.yaml"
        values.write_text(case.values)
        args += ["-f", str(values)]
    if case.command == "up":
        args += ["--stack", f"bad-{case.id}"[:40]]
    done = ncpsim(*args, home=folder / "state", env={"PATH": "/usr/bin:/bin", "HOME": str(folder)})
    return Outcome(done, scenario, values, folder / "state")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """All cases, each through the command line (in-process: a case costs its parse, not an interpreter)."""
    root = tmp_path_factory.mktemp("malformed")
    return {case.id: _run(case, root) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_file_gets_one_line_naming_file_and_key(case: Case, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[case.id]
    done = outcome.done
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    named = outcome.values if case.names_values_file else outcome.scenario
    assert str(named) in line, line
    for want in case.wants:
        assert want in line, f"{want!r} not in {line!r}"
    assert not any(outcome.state.rglob("*.pid")), "a malformed scenario must not start anything"


def test_there_are_at_least_ten_kinds() -> None:
    assert len({c.id for c in CASES}) >= 10
