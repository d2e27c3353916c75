"""The pytest plugin as a user's test suite would use it (pytester), including teardown after a failure."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from clusters.local.launcher import Launcher

pytest_plugins = ["pytester"]

# Once pyproject.toml registers the pytest11 entry point, the plugin loads by itself; -p would load it twice.
AUTOLOADED = any(ep.value == "scenarios.pytest_plugin" for ep in entry_points(group="pytest11"))
PLUGIN_ARGS = () if AUTOLOADED else ("-p", "scenarios.pytest_plugin")

# The user's stacks run one NATS server, as the catalogue's scenarios not about the NATS cluster: the chart's
# three wait for JetStream's first leader, and 4-9 s when the first vote splits (2 launches in 20).
USER_TESTS = """
import json
from pathlib import Path

ONE_NATS = {"nats": {"config": {"cluster": {"enabled": False}}}}

def test_catalogue_stack(ncpsim_stack):
    stack = ncpsim_stack("http-callback")
    Path("state.txt").write_text(str(stack.state_dir))
    assert stack.status["scenario"] == "http-callback" and stack.status["proxy"]["http"]["port"]
    traces = stack.invoke("http-echo", count=2)
    assert [t.outcome for t in traces] == ["success", "success"]
    assert {t.pod for t in traces} == {"invocation-service-0", "invocation-service-1"}
    assert len(stack.events("attach.post", status=200)) == 2
    assert [r["status"] for r in stack.access_log()].count("200") == 4
    probe, = stack.probe("http://{pod}:8443/v2/nvcf/pexec/functions/x")
    assert probe.proxy[0]["status"] == "404" and probe.pod_legs == []

def test_values_stack_then_failure(ncpsim_stack):
    # The stack's defaults neither enable the proxy nor expose it (seed step 1 does both).
    stack = ncpsim_stack(values={"workerCallbackProxy": {"enabled": True, "service": {"type": "LoadBalancer"}},
                                 **ONE_NATS},
                         topology={"grpcProxyReplicas": 0,
                                   "computeClusters": [{"workers": [{"trust": "system"}]}]})
    Path("state2.txt").write_text(str(stack.state_dir))
    trace, = stack.invoke()
    assert trace.outcome == "failure" and "x509: certificate signed by unknown authority" in trace.error
    raise RuntimeError("the user's test fails after starting a stack")

def test_replay_fixture(ncpsim_replay):
    result = ncpsim_replay("wrong-path")
    assert result.ok, result.failures
    assert ncpsim_replay("split-plane-url-set").ok

def test_module_stack_with_a_partial_topology(ncpsim_stack_module):
    stack = ncpsim_stack_module(values=ONE_NATS, topology={"invocationReplicas": 1})  # the rest: the defaults
    Path("state3.txt").write_text(str(stack.state_dir))
    assert [p["name"] for p in stack.status["pods"]] == ["invocation-service-0"]
    assert stack.fault({"kill": "invocation-service-0"}).ok
    assert "invocation-service-0" in stack.status()["down"]  # called: the status now
    assert stack.fault({"restart": "invocation-service-0"}).ok and stack.rotate("frontend").ok
    assert "invocation-service-0" in stack.status()["running"]

def test_a_failed_replay_shows_its_failures(ncpsim_replay):
    Path("must-fail.yaml").write_text(MUST_FAIL)
    assert ncpsim_replay("must-fail.yaml").ok

MUST_FAIL = '''
name: must-fail
summary: a scenario whose expectation cannot hold
values: {workerCallbackProxy: {enabled: true}, nats: {config: {cluster: {enabled: false}}}}
topology: {invocationReplicas: 1, grpcProxyReplicas: 0, computeClusters: [{workers: [{count: 1}]}]}
steps:
  - name: a direct call that goes through the proxy
    invoke: {function: http-echo}
    expect: {via: direct}
'''
"""


def test_fixtures_in_a_users_suite_and_teardown_even_on_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_inprocess(*PLUGIN_ARGS, "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*RuntimeError: the user's test fails after starting a stack*"])
    # A failed replay's assertion prints the verdict and each failure, not the dataclass's repr.
    result.stdout.fnmatch_lines(
        ["*<FAIL must-fail:*", "*- step 1 (a direct call that goes through the proxy)*"]
    )
    assert "ScenarioResult(scenario=" not in result.stdout.str()
    for name in ("state.txt", "state2.txt", "state3.txt"):
        state = Path(pytester.path / name).read_text()
        assert Path(state, "topology.json").exists()
        assert not Launcher(Path(state)).running(), f"{state}: processes left after the test"


def test_fixture_is_documented_in_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(*PLUGIN_ARGS, "--fixtures", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["*ncpsim_stack*", "*from a catalogue name, a YAML path or values*", "*ncpsim_replay*"]
    )
