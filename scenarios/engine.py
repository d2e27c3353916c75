"""The replay engine: bring a stack up for a scenario, run its steps, join traces, check expectations."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from clusters.stack import LocalStack
from scenarios import calls
from scenarios.expect import evaluate
from scenarios.model import Scenario, Step
from scenarios.tail import StackTail
from scenarios.trace import CallTrace, join
from sim.component import Context
from sim.errors import ScenarioError
from sim.topology import CONTROL_CLUSTER, Topology
from sim.values import check, deep_merge

SETTLE_TIMEOUT = 5.0  # how long to wait for the last log lines of finished calls


@dataclass
class StepResult:
    step: Step
    traces: list[CallTrace] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class ScenarioResult:
    scenario: Scenario
    steps: list[StepResult] = field(default_factory=list)
    up_seconds: float = 0.0
    elapsed: float = 0.0
    first_callback_seconds: float | None = None  # from the start of `up` to the first successful callback
    error: str | None = None
    status: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(s.ok for s in self.steps)

    @property
    def failures(self) -> list[str]:
        return ([self.error] if self.error else []) + [f for s in self.steps for f in s.failures]


class Replay:
    """One scenario on one running stack."""

    def __init__(self, scenario: Scenario, stack: LocalStack, topology: Topology):
        self.scenario, self.stack, self.topology = scenario, stack, topology
        self.tail = StackTail(stack.state_dir)
        self.client = Context(stack.state_dir, topology, "client", CONTROL_CLUSTER)
        self.pod_ips = {p.name: p.ip for p in topology.pods}

    async def run(self) -> list[StepResult]:
        results = []
        for step in self.scenario.steps:
            results.append(await self.run_step(step))
        self.client.events.close()
        return results

    async def run_step(self, step: Step) -> StepResult:
        self.client.events.emit("step.start", step=step.index, name=step.name)
        result = StepResult(step)
        if step.set_values is not None:
            result.note = self.set_values(step.set_values)
        if step.redeploy is not None:
            result.note = (result.note + "; " if result.note else "") + self.redeploy(step.redeploy)
        if step.invoke is not None:
            result.traces = await self.invoke(step)
        result.failures = evaluate(step, result.traces, self.pod_ips)
        return result

    def set_values(self, overrides: dict[str, Any]) -> str:
        values = deep_merge(self.topology.values, overrides)
        check(values)
        self.topology = Topology(**{**self.topology.__dict__, "values": values})
        (self.stack.state_dir / "topology.json").write_text(self.topology.to_json())
        return "values changed (running pods keep what they started with until redeployed)"

    def redeploy(self, what: str) -> str:
        self.stack.launcher.redeploy(self.topology, what)
        return f"redeployed {what}"

    async def invoke(self, step: Step) -> list[CallTrace]:
        spec = step.invoke or {}
        function, count = spec["function"], spec.get("count", 1)
        role = "invocation" if function == "http-echo" else "grpc-proxy"
        pods = self.topology.pods_of(role)
        if not pods:
            raise ScenarioError(f"{step.label}: {function} needs at least one {role} pod in the topology")
        call = calls.http_call if role == "invocation" else calls.grpc_call
        traces = await asyncio.gather(*[
            call(self.client, self.tail, step, i, pods[(i - 1) % len(pods)], spec) for i in range(1, count + 1)])
        await self.settle(traces)
        for trace in traces:
            join(trace, self.tail.events, self.tail.access)
        return list(traces)

    async def settle(self, traces: list[CallTrace]) -> None:
        """Wait until each finished call's worker result (and its proxy lines) has been written."""
        def recorded() -> bool:
            return all(calls.recorded(t, self.tail) for t in traces if t.request_id is not None)

        await self.tail.wait_for(recorded, SETTLE_TIMEOUT)


def run_scenario(scenario: Scenario, stack: LocalStack, keep: bool = True) -> ScenarioResult:
    """Bring the stack up, replay, and leave it running when `keep` (invoke up) or on request."""
    result = ScenarioResult(scenario)
    started = time.monotonic()
    topology = scenario.build_topology(stack.name)
    try:
        result.status = stack.up(topology, scenario.name)
        result.up_seconds = time.monotonic() - started
        replay = Replay(scenario, stack, topology)
        result.steps = asyncio.run(replay.run())
        result.first_callback_seconds = first_callback(replay.tail, started)
    except ScenarioError as exc:
        result.error = str(exc)
    finally:
        result.elapsed = time.monotonic() - started
        if not keep:
            stack.down()
    if stack.state_dir.exists():
        (stack.state_dir / "report.json").write_text(json.dumps(to_json(result), indent=2, default=str))
    return result


def first_callback(tail: StackTail, started_monotonic: float) -> float | None:
    """Seconds from the start of `up` to the first successful worker callback, from event timestamps."""
    tail.refresh()
    oks = [e["ts"] for e in tail.events if e["kind"] == "worker.callback.result" and e.get("ok")]
    if not oks:
        return None
    wall_start = time.time() - (time.monotonic() - started_monotonic)
    return min(oks) - wall_start


def to_json(result: ScenarioResult) -> dict[str, Any]:
    return {
        "scenario": result.scenario.name, "summary": result.scenario.summary, "ok": result.ok,
        "upSeconds": round(result.up_seconds, 3), "elapsedSeconds": round(result.elapsed, 3),
        "firstCallbackSeconds": None if result.first_callback_seconds is None
        else round(result.first_callback_seconds, 3),
        "error": result.error,
        "steps": [{"index": s.step.index, "name": s.step.name, "ok": s.ok, "note": s.note,
                   "failures": s.failures, "calls": [t.to_dict() for t in s.traces]} for s in result.steps],
    }
