"""pytest fixtures for your own ncpsim tests: a real stack on loopback per test, always torn down.

Enable with ``-p scenarios.pytest_plugin`` (or the ``pytest11`` entry point once installed), then::

    def test_public_frontend(ncpsim_stack):
        stack = ncpsim_stack("public-frontend-cert")        # catalogue name or YAML path
        traces = stack.invoke("http-echo", count=3)
        assert all(t.outcome == "success" for t in traces)
        assert stack.events("attach.get", status=200)

    def test_my_values(ncpsim_stack):
        stack = ncpsim_stack(values={"workerCallbackProxy": {"enabled": True, "service": {"type": "LoadBalancer"}}},
                             topology={"computeClusters": [{"workers": [{"count": 1, "trust": "stack"}]}]})
        print(stack.status["proxy"]["http"])                # the `ncpsim status --json` contract

    def test_catalogue_entry(ncpsim_replay):
        assert ncpsim_replay("wrong-path").ok               # a failure prints the scenario's failures

    def test_faults(ncpsim_stack_module):                 # one stack for the module (or _session)
        stack = ncpsim_stack_module(topology={"invocationReplicas": 1})  # the rest of the topology: defaults
        stack.fault({"kill": "invocation-service-0"})
        stack.rotate("frontend")
        assert stack.status()["running"]                   # the status now; stack.status[...] as it came up

Each stack gets a unique name and a state folder under pytest's temporary directory; the fixture stops
every process it started when the test ends (or, module- and session-scoped, when the module or the run
ends), whether it passed, failed or raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clusters.local import LocalBackend, LocalStack
from scenarios.engine import Replay, run_scenario
from scenarios.load import load_scenario, scenario_from_data
from scenarios.result import ScenarioResult, StepResult
from scenarios.spec import Scenario, Step, probe_from, wait_from
from scenarios.trace import CallTrace
from sim.model.events import read_events
from sim.model.topology import Topology
from sim.proxy.access_log import read_access_log
from sim.proxy.component import ACCESS_LOG

DEFAULT_TOPOLOGY = {
    "invocationReplicas": 2,
    "grpcProxyReplicas": 0,
    "computeClusters": [{"workers": [{"count": 2, "trust": "stack"}]}],
}
_names = itertools.count(1)


class Status(dict[str, Any]):
    """The `status --json` contract as the stack came up (`stack.status["proxy"]`); called, as it is now."""

    def __init__(self, stack: LocalStack, first: dict[str, Any]):
        super().__init__(first)
        self._stack = stack

    def __call__(self) -> dict[str, Any]:
        return self._stack.status() or {}


class SimStack:
    """A running stack: its status, and helpers to call it, break it and read what it recorded."""

    def __init__(self, scenario: Scenario, stack: LocalStack):
        self.scenario, self._stack = scenario, stack
        self.status = Status(stack, {})
        self._replay: Replay | None = None
        self._steps = itertools.count(1)

    @property
    def name(self) -> str:
        return self._stack.name

    @property
    def state_dir(self) -> Path:
        return self._stack.state_dir

    @property
    def topology(self) -> Topology:
        return self._running().topology

    def up(self) -> SimStack:
        topology = self.scenario.build_topology(self._stack.name)
        self.status = Status(self._stack, self._stack.up(topology, self.scenario.name).status() or {})
        self._replay = Replay(self.scenario, self._stack)
        return self

    def _running(self) -> Replay:
        if self._replay is None:
            raise RuntimeError(f"stack {self.name} is not up")
        return self._replay

    def _step(self, name: str, **parts: Any) -> Step:
        return Step(index=next(self._steps), name=name, **parts)

    def invoke(self, function: str = "http-echo", count: int = 1, **spec: Any) -> list[CallTrace]:
        """Invoke `count` times (spread over the pods, as a load balancer would); one trace per call."""
        step = self._step(f"invoke {function}", invoke={"function": function, "count": count, **spec})
        return asyncio.run(self._running().invoke(step))

    def probe(self, *targets: str, cluster: str | None = None) -> list[CallTrace]:
        """Send crafted forward-proxy requests through the proxy (see scenarios.probe for placeholders)."""
        raw: dict[str, Any] = {"targets": list(targets), **({"cluster": cluster} if cluster else {})}
        step = self._step("probe", probe=probe_from(raw))
        return asyncio.run(self._running().run_step(step)).traces

    def wait(self, **condition: Any) -> StepResult:
        """Wait for an event or listener condition (the scenario `wait:` keys); failures are in the result."""
        return asyncio.run(self._running().run_step(self._step("wait", wait=wait_from(condition))))

    def set_values(self, overrides: dict[str, Any], redeploy: str | None = None) -> None:
        """Change values; running components keep theirs until `redeploy` ("workers", "proxy", ...)."""
        rollout = self._running().rollout
        rollout.set_values(overrides)
        if redeploy:
            rollout.redeploy(redeploy)

    def fault(self, spec: dict[str, Any], wait: dict[str, Any] | None = None) -> StepResult:
        """A fault step, as a scenario writes it: {"kill": NAME}, {"link": {...}}, {"scale": {...}}, ...;
        `wait` (the scenario `wait:` keys) then waits in the same step, counting events from before the fault."""
        parts = {"fault": spec, **({"wait": wait_from(wait)} if wait else {})}
        return asyncio.run(self._running().run_step(self._step("fault", **parts)))

    def rotate(self, kind: str) -> StepResult:
        """Rotate certificates as the runbook does: frontend, pod-certs, stack-ca or public-ca."""
        return asyncio.run(self._running().run_step(self._step(f"rotate {kind}", rotate=kind)))

    def replay(self) -> ScenarioResult:
        """Run the scenario's own steps on this stack and judge its expectations."""
        result = ScenarioResult(self.scenario, status=self.status)
        result.steps = [asyncio.run(self._running().run_step(step)) for step in self.scenario.steps]
        return result

    def events(self, kind: str | None = None, **match: Any) -> list[dict[str, Any]]:
        """Every component's events so far, oldest first, optionally of one kind and with matching fields."""
        return [
            e
            for e in read_events(self.state_dir)
            if (kind is None or e["kind"] == kind) and all(e.get(k) == v for k, v in match.items())
        ]

    def access_log(self) -> list[dict[str, str]]:
        """The proxy's access log, parsed (Envoy's default format)."""
        return read_access_log(self.state_dir / "logs" / ACCESS_LOG)

    def running(self) -> dict[str, int]:
        return self._stack.launcher.running()

    def down(self) -> None:
        if self._replay is not None:
            self._replay.close()
            self._replay = None
        self._stack.down()


def _scenario(
    scenario: str | os.PathLike | None,
    values: dict[str, Any] | None,
    topology: dict[str, Any] | None,
    values_file: Path | None,
) -> Scenario:
    if scenario is not None:
        return load_scenario(str(scenario), values_file)
    data = {
        "name": "pytest",
        "summary": "a stack from a pytest fixture",
        "values": values or {},
        "topology": {**DEFAULT_TOPOLOGY, **(topology or {})},  # a partial topology: the rest as the default
        "steps": [{"name": "invoke once", "invoke": {"function": "http-echo"}}],
    }
    return scenario_from_data(data, Path("<ncpsim_stack values>"), {}, values_file)


StackFactory = Callable[..., SimStack]


@contextlib.contextmanager
def _stacks(root: Path) -> Iterator[StackFactory]:
    """A factory of stacks under `root`; every stack it started is stopped when the context ends."""
    started: list[SimStack] = []

    def start(
        scenario: str | os.PathLike | None = None,
        *,
        values: dict[str, Any] | None = None,
        topology: dict[str, Any] | None = None,
        values_file: Path | None = None,
    ) -> SimStack:
        sim = SimStack(
            _scenario(scenario, values, topology, values_file),
            LocalStack(f"pytest-{os.getpid()}-{next(_names)}", root=root),
        )
        started.append(sim)  # before up: a half-started stack is stopped too
        return sim.up()

    try:
        yield start
    finally:
        for sim in started:
            sim.down()


@pytest.fixture
def ncpsim_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackFactory]:
    """Start stacks from a catalogue name, a YAML path or values; each is stopped when the test ends.

    ``ncpsim_stack(scenario=None, *, values=None, topology=None, values_file=None)`` -> SimStack; values
    (and a scenario-style topology section, merged over the default one) make an ad-hoc stack.
    """
    with _stacks(tmp_path_factory.mktemp("ncpsim")) as start:
        yield start


@pytest.fixture(scope="module")
def ncpsim_stack_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackFactory]:
    """As ncpsim_stack, its stacks stopped when the module's tests are done (one stack, many tests)."""
    with _stacks(tmp_path_factory.mktemp("ncpsim-module")) as start:
        yield start


@pytest.fixture(scope="session")
def ncpsim_stack_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackFactory]:
    """As ncpsim_stack, its stacks stopped at the end of the run."""
    with _stacks(tmp_path_factory.mktemp("ncpsim-session")) as start:
        yield start


@pytest.fixture
def ncpsim_replay(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., ScenarioResult]:
    """``ncpsim_replay(scenario, values_file=None)`` -> ScenarioResult, on a fresh stack, stopped after."""
    root = tmp_path_factory.mktemp("ncpsim-replay")

    def replay(scenario: str | os.PathLike, values_file: Path | None = None) -> ScenarioResult:
        loaded = load_scenario(str(scenario), values_file, allow_expected_error=True)
        return run_scenario(loaded, LocalBackend(root), f"replay-{os.getpid()}-{next(_names)}", keep=False)

    return replay
