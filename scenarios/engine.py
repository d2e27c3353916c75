"""The replay engine: bring a stack up for a scenario, run its steps, join traces, check expectations.

What a step changes on the stack (values, pods, DNS) is scenarios/rollout.py's; the engine runs the calls,
probes, waits, faults and runbooks, and judges what they show.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from clusters.interrupts import run_cancelled_by_signal
from clusters.stack import Backend, Stack
from clusters.state import create_stack_dir, refuse_link, write_file
from scenarios import calls, origins
from scenarios.actions import fault_later, rotate_step, runbook_step
from scenarios.conditions import wait_until
from scenarios.expect import Facts, check_log, check_refused, evaluate, log_matches
from scenarios.faults import FaultInjector
from scenarios.probe import probe_call
from scenarios.result import ScenarioResult, StepResult, to_json
from scenarios.rollout import Rollout
from scenarios.sequence_html import write_sequence
from scenarios.spec import LogExpect, Scenario, Step
from scenarios.tail import StackTail
from scenarios.trace import CallTrace, join
from sim.errors import ScenarioError
from sim.model.assumptions import assumptions
from sim.model.events import CALLBACK_RESULT, POD_REQUEST, STEP_START
from sim.model.parts import CONTROL_CLUSTER
from sim.model.topology import Topology
from sim.runtime.component import Context

SETTLE_TIMEOUT = 5.0  # how long to wait for the last log lines of finished calls


class Replay:
    """One scenario on one running stack."""

    def __init__(self, scenario: Scenario, stack: Stack):
        self.scenario, self.stack, topology = scenario, stack, stack.topology
        self.tail = StackTail(stack.state_dir)
        self.client = Context(stack.state_dir, topology, "client", CONTROL_CLUSTER)
        self.rng = random.Random(f"{scenario.seed}:probes")  # probe request ids repeat run to run
        self.faults = FaultInjector(stack, random.Random(f"{scenario.seed}:faults"))
        self.rollout = Rollout(scenario, stack, self.faults)

    @property
    def topology(self) -> Topology:
        """The stack's topology as the steps so far have changed it."""
        return self.rollout.topology

    @property
    def facts(self) -> Facts:
        """What the checks know of the stack as the steps left it (a redeploy gives k3d pods new IPs)."""
        topology = self.topology
        return Facts({p.name: p.ip for p in topology.pods}, {w.name: w for w in topology.workers})

    async def run(self) -> list[StepResult]:
        return [await self.run_step(step) for step in self.scenario.steps]

    def close(self) -> None:
        self.client.events.close()

    async def run_step(self, step: Step) -> StepResult:
        self.client.events.emit(STEP_START, step=step.index, name=step.name)
        since, result = time.time(), StepResult(step)
        logs_at = log_sizes(self.stack.logs()) if any(e.log for e in step.expects) else {}
        if step.refused is not None:  # a change expected refused: judged, never applied
            note, problem = check_refused(step, self.topology.values)
            result.note, result.failures = note, [problem] if problem else []
            return result
        notes = self.rollout.change(step)
        if step.rotate is not None:
            notes.append(await rotate_step(self.stack.state_dir, step.rotate, self.topology.worker_domain))
        concurrent_fault = (
            step.fault is not None and step.invoke is not None and step.fault_after_ms is not None
        )
        if step.fault is not None and not concurrent_fault:
            notes.append(self.faults.apply(step.fault))
        if concurrent_fault:
            fault = asyncio.create_task(
                fault_later(self.faults, step.fault or {}, step.fault_after_ms or 0, notes),
                name=f"fault-{step.index}",
            )
            result.traces = await self.invoke(step)
            await fault
        elif step.invoke is not None:
            result.traces = await self.invoke(step)
        elif step.runbook is not None:
            summary, failures = runbook_step(step, self.stack.state_dir, self.scenario.layered_at(step))
            notes.append(summary)
            result.failures += failures
        elif step.probe is not None:
            result.traces = await self.probe(step, since)
        elif step.wait is not None:
            problem = await wait_until(step.wait, self.tail, self.topology, since)
            result.failures += [f"{step.label}: {problem}"] if problem else []
            notes.append(f"waited for {step.wait.describe()}")
        if step.runbook is None:
            result.failures += evaluate(step, result.traces, self.facts)
        for exp in (e.log for e in step.expects if e.log is not None):
            notes.append(self.check_log(exp, step, logs_at, result.failures))
        result.note = "; ".join(notes)
        return result

    def check_log(self, exp: LogExpect, step: Step, sizes: dict[str, int], failures: list[str]) -> str:
        """Judge a log expectation on the lines written since the step started (or the whole log)."""
        logs = self.stack.logs()
        path = logs.get(exp.component)
        lines = (
            None
            if path is None
            else read_lines(Path(path), sizes.get(exp.component, 0) if exp.lines == "step" else 0)
        )
        problem = check_log(step, exp, lines, sorted(logs))
        failures += [problem] if problem else []
        counted = len(log_matches(exp, lines)) if lines is not None else 0
        return f"log {exp.component}: {counted} line(s) counted"

    async def invoke(self, step: Step) -> list[CallTrace]:
        spec = step.invoke or {}
        function, count = spec["function"], spec.get("count", 1)
        role = "invocation" if function == "http-echo" else "grpc-proxy"
        pods = self.topology.pods_of(role)
        if not pods:
            raise ScenarioError(f"{step.label}: {function} needs at least one {role} pod in the topology")
        call = calls.http_call if role == "invocation" else calls.grpc_call
        interval = spec.get("intervalMs", 0) / 1000

        async def nth(i: int) -> CallTrace:
            await asyncio.sleep((i - 1) * interval)  # the scenario's pacing, not a readiness wait
            return await call(self.client, self.tail, step, i, pods[(i - 1) % len(pods)], spec)

        # Calls spread over the replicas in turn, as the client-facing load balancer would spread them.
        traces = await asyncio.gather(*[nth(i) for i in range(1, count + 1)])
        return await self.settle(list(traces))

    async def probe(self, step: Step, since: float) -> list[CallTrace]:
        assert step.probe is not None
        ctx = self.prober(step.probe.cluster)
        try:
            traces = [
                await probe_call(ctx, self.topology, step, i, target, self.rng)
                for i, target in enumerate(step.probe.targets, start=1)
            ]
        finally:
            ctx.events.close()
        traces = await self.settle(traces)
        self.blame_unattributed(traces, since)
        return traces

    def prober(self, cluster: str | None) -> Context:
        names = [c.name for c in self.topology.clusters]
        if cluster is not None and cluster not in names:
            raise ScenarioError(
                f"probe cluster {cluster!r} is not in the topology; it has: {', '.join(names)}"
            )
        where = cluster or next((c.name for c in self.topology.compute_clusters), CONTROL_CLUSTER)
        return Context(self.stack.state_dir, self.topology, "prober", where)

    def blame_unattributed(self, traces: list[CallTrace], since: float) -> None:
        """A pod request during the probes that carries none of their ids counts against every probe."""
        ids = {t.request_id for t in traces}
        stray = [
            e
            for e in self.tail.events
            if e["kind"] == POD_REQUEST and e.get("ts", 0) >= since and e.get("requestId") not in ids
        ]
        for trace in traces:
            trace.pod_legs += [
                {
                    "kind": POD_REQUEST,
                    "pod": e.get("pod"),
                    "status": None,
                    "path": e.get("path"),
                    "reason": "request without a probe's id",
                }
                for e in stray
            ]

    async def settle(self, traces: list[CallTrace]) -> list[CallTrace]:
        """Wait until each finished call's worker result (and its proxy lines) has been written, then join."""

        def recorded() -> bool:
            return all(calls.recorded(t, self.tail) for t in traces if t.request_id is not None)

        await self.tail.wait_for(recorded, SETTLE_TIMEOUT)
        for trace in traces:
            join(trace, self.tail.events, self.tail.access)
        return traces


def run_scenario(scenario: Scenario, backend: Backend, stack_name: str, keep: bool = True) -> ScenarioResult:
    """Bring a stack up on `backend`, replay, and leave it running when `keep` (ncpsim up)."""
    if scenario.expect_error is not None:
        return judge_refusal(scenario)
    if scenario.stackless:
        return run_stackless(scenario, backend.attach(stack_name).state_dir)
    result = ScenarioResult(scenario)
    started = time.monotonic()
    topology = scenario.build_topology(stack_name)
    result.assumptions = list(assumptions(topology, backend.name))
    stack: Stack | None = None
    try:
        stack = backend.up(topology, scenario.name)
        if scenario.layering is not None:
            origins.save(stack.state_dir, scenario.layering)
        result.status = stack.status()
        result.up_seconds = time.monotonic() - started
        replay = Replay(scenario, stack)
        try:
            result.steps = run_cancelled_by_signal(replay.run())
        finally:
            replay.close()
        result.first_callback_seconds = first_callback(replay.tail, started)
        result.status = stack.status()  # as the steps left it: a redeployed proxy or resolver has new ports
        # and what the steps' setValues made ncpsim assume too (an issuerRef switched to, ...)
        found = dict.fromkeys([*result.assumptions, *assumptions(replay.topology, backend.name)])
        result.assumptions = sorted(found, key=lambda a: not a.from_input)  # the input's first
    except ScenarioError as exc:
        result.error = str(exc)
    finally:
        result.elapsed = time.monotonic() - started
        if stack is not None:
            stack.close()
            if not keep:
                stack.down()
    folder = backend.attach(stack_name).state_dir
    if folder.exists():
        write_artifacts(result, folder)
    return result


def run_stackless(scenario: Scenario, state: Path) -> ScenarioResult:
    """Runbook scenarios rehearse control-plane operations on their own models: no cluster to bring up."""
    result = ScenarioResult(scenario)
    started = time.monotonic()
    create_stack_dir(state)  # with its marker, so `ncpsim down --purge` and the next replay may remove it
    (state / "events").mkdir(parents=True, exist_ok=True)
    try:
        for step in scenario.steps:
            summary, failures = runbook_step(step, state, scenario.layered_at(step))
            result.steps.append(StepResult(step, note=summary, failures=failures))
    except ScenarioError as exc:
        result.error = str(exc)
    result.elapsed = time.monotonic() - started
    write_artifacts(result, state)
    return result


def judge_refusal(scenario: Scenario) -> ScenarioResult:
    """An error scenario passes when loading refused its values with the expected text (no stack starts)."""
    result = ScenarioResult(scenario, refused=scenario.config_error)
    want = scenario.expect_error or ""
    if scenario.config_error is None:
        result.error = f"expected the values to be refused with {want!r}, but they were accepted"
    elif want not in scenario.config_error:
        result.error = (
            f"expected the values to be refused with {want!r}, but the error was: {scenario.config_error}"
        )
    return result


def write_artifacts(result: ScenarioResult, state_dir: Path) -> None:
    reports = state_dir / "reports"
    refuse_link(reports)  # links planted after `up` checked the folder are refused too
    reports.mkdir(parents=True, exist_ok=True)
    result.artifacts.update(write_sequence(result, reports))
    result.artifacts["json"] = str(reports / "report.json")
    write_file(reports / "report.json", json.dumps(to_json(result), indent=2, default=str))


def log_sizes(logs: dict[str, str]) -> dict[str, int]:
    """Each log's length now: a step's own lines are those written past it."""
    return {name: Path(path).stat().st_size for name, path in logs.items() if Path(path).exists()}


def read_lines(path: Path, offset: int) -> list[str]:
    """The complete lines from `offset` on (a line still being written is left for the next reader)."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            data = log.read()
    except FileNotFoundError:
        return []
    return data[: data.rfind(b"\n") + 1].decode(errors="replace").splitlines()


def first_callback(tail: StackTail, started_monotonic: float) -> float | None:
    """Seconds from the start of `up` to the first successful worker callback, from event timestamps."""
    tail.refresh()
    oks = [float(e["ts"]) for e in tail.events if e["kind"] == CALLBACK_RESULT and e.get("ok")]
    if not oks:
        return None
    wall_start = time.time() - (time.monotonic() - started_monotonic)
    return min(oks) - wall_start
