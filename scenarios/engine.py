"""The replay engine: bring a stack up for a scenario, run its steps, join traces, check expectations."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from certs.store import CertStore
from clusters.stack import Backend, Stack
from clusters.state import create_stack_dir, refuse_link, write_file
from scenarios import calls, origins
from scenarios.actions import fault_later, rotate_step, runbook_step
from scenarios.conditions import wait_until
from scenarios.expect import Facts, check_log, check_refused, evaluate, log_matches
from scenarios.model import Scenario, Step
from scenarios.probe import probe_call
from scenarios.result import ScenarioResult, StepResult, to_json
from scenarios.sequence_html import write_sequence
from scenarios.spec import LogExpect
from scenarios.tail import StackTail
from scenarios.trace import CallTrace, join
from sim.errors import ScenarioError
from sim.model.assumptions import assumptions
from sim.model.events import CALLBACK_RESULT, POD_REQUEST, STEP_START
from sim.model.layering import parse_key
from sim.model.parts import CONTROL_CLUSTER
from sim.model.values import deep_merge, proxy_settings
from sim.model.values_check import check
from sim.runtime.component import Context
from sim.runtime.faults import FaultInjector

SETTLE_TIMEOUT = 5.0  # how long to wait for the last log lines of finished calls
SESSION = "session"  # the scenario a dev-environment command's steps run in (scenarios/devenv.py)
ROLLS_OUT_PROXY = ("proxy", "all")


class Replay:
    """One scenario on one running stack."""

    def __init__(self, scenario: Scenario, stack: Stack):
        self.scenario, self.stack, self.topology = scenario, stack, stack.topology
        topology = self.topology
        self.tail = StackTail(stack.state_dir)
        self.client = Context(stack.state_dir, topology, "client", CONTROL_CLUSTER)
        self.facts = Facts({p.name: p.ip for p in topology.pods}, {w.name: w for w in topology.workers})
        self.rng = random.Random(f"{scenario.seed}:probes")  # probe request ids repeat run to run
        self.faults = FaultInjector(stack, random.Random(f"{scenario.seed}:faults"))

    @property
    def pod_ips(self) -> dict[str, str]:
        return self.facts.pod_ips

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
        notes = self.change_values(step)
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

    def change_values(self, step: Step) -> list[str]:
        """unsetValues, setValues, then the rollout, as `helmfile sync` applies a changed environment."""
        notes = []
        if step.redeploy in ROLLS_OUT_PROXY:  # refused before anything changes: the proxy keeps serving
            self.require_secrets(deep_merge(self.topology.values, step.set_values or {}), step)
        if step.unset_values is not None:
            notes.append(self.unset_values(step.unset_values))
        if step.set_values is not None:
            notes.append(self.set_values(step.set_values, self.origin_label(step)))
        if step.redeploy is not None:
            notes.append(self.redeploy(step.redeploy))
        if step.dns_rewrite is not None or step.dns_records is not None:
            notes.append(self.rewrite_dns(step.dns_rewrite, step.dns_records))
        return notes

    def origin_label(self, step: Step) -> str:
        """Where `ncpsim values` says a step's values came from."""
        if self.scenario.name == SESSION:
            return f"ncpsim {step.name}"
        return f"step {step.index} of {self.scenario.name}"

    def require_secrets(self, values: dict[str, Any], step: Step) -> None:
        """A proxy rollout whose frontend Secret the stack does not hold would never become ready (the
        kubelet cannot mount it): refused, as `kubectl rollout status` would wait forever."""
        secret = proxy_settings(values).frontend_secret
        store = CertStore(self.stack.state_dir / "certs")
        if secret and not (store.secret_dir(secret) / "tls.crt").is_file():
            raise ScenarioError(
                f"{step.label}: Secret {secret!r} (workerCallbackProxy.tls.frontend.existingSecret) is not "
                f"in the stack, so the new proxy pod could not start; the running one keeps serving. Bring it "
                f"first: ncpsim set --secret {secret}=DIR (a folder with tls.crt and tls.key)"
            )

    def unset_values(self, paths: tuple[str, ...]) -> str:
        """Keys back to the chart's defaults (`ncpsim set --unset`); running pods keep theirs."""
        parsed = [parse_key(path) for path in paths]
        before = values = self.topology.values
        for parts in parsed:
            values = origins.unset(values, parts)
        self.apply_values(values)
        origins.forget(self.stack.state_dir, parsed)
        return f"{', '.join(paths)} back to the chart's defaults" + self.restart_callout(before)

    def set_values(self, overrides: dict[str, Any], label: str = "a step") -> str:
        before = self.topology.values
        self.apply_values(deep_merge(self.topology.values, overrides))
        origins.record(self.stack.state_dir, overrides, label)
        said = "values changed (running pods keep what they started with until redeployed)"
        return said + self.restart_callout(before)

    def apply_values(self, values: dict[str, Any]) -> None:
        check(values)
        # Applied now: a `@stack-ca` marker becomes the CA's PEM as it is at this step, and stays that text.
        store = CertStore(self.stack.state_dir / "certs")
        self.topology = replace(self.topology, values=values).with_ca_pem(
            lambda issuer: store.ca_path(issuer).read_text()
        )
        write_file(self.stack.state_dir / "topology.json", self.topology.to_json())

    def restart_callout(self, before: dict[str, Any]) -> str:
        """The chart restarts the auth callout when its mode, webhook URL or logging changes (it reads them
        only at start-up); the rest of the control plane keeps running."""
        from clusters.local.plan import NATS_CALLOUT
        from sim.runbooks.nats_auth import callout_config, callout_restart_reasons

        reasons = callout_restart_reasons(callout_config(before), callout_config(self.topology.values))
        if not reasons:
            return ""
        if self.stack.components is None:
            return f"; {'; '.join(reasons)}: restart the auth callout yourself (no restarts on this backend)"
        self.stack.components.restart(NATS_CALLOUT)
        return f"; {NATS_CALLOUT} restarted ({'; '.join(reasons)})"

    def redeploy(self, what: str) -> str:
        if what in ("workers", "all"):  # new function pods: none of them predates the values any more
            self.topology = self.topology.with_workers_redeployed()
            write_file(self.stack.state_dir / "topology.json", self.topology.to_json())
        self.topology = self.stack.redeploy(self.topology, what)  # k3d pods come back with new IPs
        self.facts = replace(self.facts, pod_ips={p.name: p.ip for p in self.topology.pods})
        return f"redeployed {what}"

    def rewrite_dns(self, rewrite: dict[str, Any] | None, records: list[dict[str, Any]] | None = None) -> str:
        """Every compute cluster's CoreDNS rewrite (and, given, its records) replaced, as `ncpsim dns-rewrite`
        replaces the rewrite on a real cluster: the views are built as at `up` (a `proxy` target is the
        Service's address now) and the resolver restarts with them, as CoreDNS reloads its Corefile."""
        spec = dict(self.scenario.topology)
        changed = {
            **({"dnsRewrite": rewrite} if rewrite is not None else {}),
            **({"dnsRecords": records} if records is not None else {}),
        }
        spec["computeClusters"] = [
            {**{k: v for k, v in c.items() if k != "wildcardDns"}, **changed}
            for c in spec.get("computeClusters", [])
        ]
        self.scenario = replace(self.scenario, topology=spec)  # a later DNS step starts from this one's
        rebuilt = self.scenario.build_topology(self.topology.stack, self.topology.values)
        fresh = {c.name: c for c in rebuilt.clusters if c.kind == "compute"}
        self.topology = replace(
            self.topology, clusters=tuple(fresh.get(c.name, c) for c in self.topology.clusters)
        )
        write_file(self.stack.state_dir / "topology.json", self.topology.to_json())
        self.faults.apply({"restart": "resolver"})
        said = []
        if rewrite is not None:
            said.append("rewrite now {" + ", ".join(f"{k}: {v}" for k, v in rewrite.items()) + "}")
        if records is not None:
            shown = "; ".join(f"{r['kind']} {r['name']} -> {r['target']}" for r in records) or "none"
            said.append(f"records now {shown}")
        return f"compute clusters' DNS {' and '.join(said)}"

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
            result.steps = asyncio.run(replay.run())
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
