"""A dev environment on a running stack: `ncpsim call`, `fault`, `rotate`, `set` and `step`.

Each command is one scenario step, checked by the same schema and rules as a catalogue file and run by
the replay engine (`Replay.run_step`) on the stack as it is now. Nothing here knows a step kind the
engine does not: a command only writes the step a scenario author would have written.
"""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from certs.rotate import KINDS
from certs.store import CertStore
from clusters.certificates import place_secret
from clusters.stack import Stack
from clusters.state import require_room, write_file
from scenarios.engine import Replay
from scenarios.load import scenario_from_data
from scenarios.report import call_row
from scenarios.result import StepResult
from scenarios.rollout import SESSION
from scenarios.secrets import parse_secret_arg
from scenarios.spec import Scenario
from scenarios.terminal import markup, safe
from sim.errors import ConfigError, ScenarioError
from sim.model.layering import parse_key, parse_set, suggest, unknown_keys
from sim.model.parts import SecretSpec
from sim.model.untrusted import MAX_BYTES
from sim.model.values import deep_merge, key_path
from sim.model.values_file import load_values_file

IDLE_SCENARIO = Path(__file__).parent / "idle.yaml"  # what `ncpsim up` brings up when no scenario is named
DEFAULT_STACK = "default"
REDEPLOY = ("workers", "proxy", "pods", "all")
FUNCTIONS = ("http-echo", "grpc-echo")
ROTATIONS = KINDS  # certs.rotate: frontend, pod-certs, stack-ca, public-ca
TRACE_COLUMNS = ("#", "pod holding it / probe", "worker", "DNS", "proxy (access log)", "pod legs", "outcome")


@dataclass
class Session:
    """What a command did on the stack: the step results, in order."""

    steps: list[StepResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(step_ok(s) for s in self.steps)


def step_ok(result: StepResult) -> bool:
    """A step's expectations hold; without expectations, every call it made succeeded."""
    if result.step.expects:
        return result.ok
    return result.ok and all(t.outcome == "success" for t in result.traces)


def idle_scenario(values_files: Path | Sequence[Path] | None = None, sets: Sequence[str] = ()) -> Scenario:
    """The default topology with no steps, for `ncpsim up` without a scenario; values layer as for any other.

    The schema asks every scenario file for steps (a catalogue entry without any is a mistake), so the
    check runs with one that changes nothing, and the scenario keeps none.
    """
    data, origin = load_values_file(IDLE_SCENARIO)
    checked = scenario_from_data(
        {**data, "steps": [{"name": "nothing", "setValues": {}}]},
        IDLE_SCENARIO,
        origin,
        values_files,
        sets=sets,
    )
    return replace(checked, steps=())


def stack_flag(stack: str) -> str:
    """The `--stack NAME` a printed command needs to act on this stack (nothing for the default one)."""
    return "" if stack == DEFAULT_STACK else f" --stack {stack}"


def require_running(stack: Stack) -> None:
    if stack.status() is None:
        raise ScenarioError(
            f"stack {stack.name!r} is not up; start it with `ncpsim up{stack_flag(stack.name)}`"
        )


def run_steps(
    stack: Stack,
    raw_steps: list[dict[str, Any]],
    source: Path,
    origin: dict[str, tuple[str, int]] | None = None,
) -> Session:
    """Check the steps as a scenario file's would be checked, then run them on the running stack."""
    require_running(stack)
    require_room(stack.state_dir)
    with stack.changing():  # one command at a time: each reads the values the one before it left
        return _run_steps(stack, raw_steps, source, origin)


def _run_steps(
    stack: Stack, raw_steps: list[dict[str, Any]], source: Path, origin: dict[str, tuple[str, int]] | None
) -> Session:
    topology = stack.topology
    # A fresh seed each time: a probe's request id must not repeat one an earlier command left in the events.
    data = {
        "name": SESSION,
        "summary": f"steps on stack {stack.name}",
        "values": topology.values,
        "steps": raw_steps,
        "seed": secrets.randbelow(2**31),
    }
    scenario = scenario_from_data(data, source, origin, topology=topology)
    replay = Replay(scenario, stack)
    session = Session()

    async def run_all() -> None:
        for step in scenario.steps:
            session.steps.append(await replay.run_step(step))

    try:
        asyncio.run(run_all())
    finally:
        replay.close()
        stack.close()
    return session


# -- the steps each command writes ---------------------------------------------------------------------
def call_step(function: str, count: int) -> dict[str, Any]:
    if function not in FUNCTIONS:
        raise ConfigError(f"call {function!r}: choose one of {', '.join(FUNCTIONS)}")
    if count < 1:
        raise ConfigError(f"--count {count}: make at least one call")
    return {"name": f"call {function} x{count}", "invoke": {"function": function, "count": count}}


def fault_step(
    action: str,
    target: str | None,
    to: str | None = None,
    latency_ms: int = 0,
    drop: float = 0.0,
    timeout_ms: int = 1000,
    protocol: str = "any",
) -> dict[str, Any]:
    """`ncpsim fault ACTION [TARGET]` as the fault step a scenario would hold (checked as a scenario's is)."""
    usage = {
        "kill": "COMPONENT",
        "restart": "COMPONENT",
        "stop": "COMPONENT",
        "start": "COMPONENT",
        "scale": "ROLE=REPLICAS (e.g. invocation=1, nats=2)",
        "rollout": "nats",
        "link": "FROM_CLUSTER [--to CIDR] [--latency-ms N] [--drop P] [--timeout-ms N] [--protocol tcp|udp|any]",
        "expire": "frontend|public-frontend|invocation|grpc-proxy",
        "clear-links": "",
    }
    if action not in usage:
        raise ConfigError(f"fault {action!r}: choose one of {', '.join(usage)}")
    if action == "clear-links":
        return {"name": "clear links", "fault": {"clear-links": True}}
    if not target:
        raise ConfigError(f"fault {action} needs {usage[action]}: ncpsim fault {action} {usage[action]}")
    if action == "scale":
        role, _, replicas = target.partition("=")
        if not replicas.isdigit():
            raise ConfigError(f"fault scale {target!r}: write ROLE=REPLICAS, e.g. invocation=1")
        return {"name": f"scale {role}", "fault": {"scale": {"role": role, "replicas": int(replicas)}}}
    if action == "link":
        link: dict[str, Any] = {
            "from": target,
            "to": to,
            "latencyMs": latency_ms,
            "drop": drop,
            "timeoutMs": timeout_ms,
            "protocol": protocol,
        }
        return {"name": f"link from {target}", "fault": {"link": link}}
    return {"name": f"{action} {target}", "fault": {action: target}}


def link_target(stack: Stack, to: str | None) -> str:
    """A link fault's default target: the proxy's load-balancer address, where compute clusters dial."""
    return to or stack.topology.proxy_lb_ip


def rotate_step(kind: str) -> dict[str, Any]:
    if kind not in ROTATIONS:
        raise ConfigError(f"rotate {kind!r}: choose one of {', '.join(ROTATIONS)}")
    return {"name": f"rotate {kind}", "rotate": kind}


def set_step(assignments: list[str], redeploy: str | None, unset: Sequence[str] = ()) -> dict[str, Any]:
    """`key.path=value` pairs, read as `--set` reads them (YAML-typed values), as one setValues step;
    `--unset KEY` puts keys back to the chart's defaults first."""
    if not assignments and not unset:
        raise ConfigError(
            "set: give at least one key.path=value, e.g. workerCallbackProxy.invocation.connect.enabled=true"
            " (or --unset KEY)"
        )
    if redeploy is not None and redeploy not in REDEPLOY:
        raise ConfigError(f"--redeploy {redeploy!r}: choose one of {', '.join(REDEPLOY)}")
    for key in unset:
        try:
            parse_key(key)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(f"--set {key}", f"--unset {key}")) from None
    overrides: dict[str, Any] = {}
    for assignment in assignments:
        try:
            change = parse_set(assignment).values
        except ConfigError as exc:  # worded for `ncpsim up --set`; here the command is `ncpsim set`
            raise ConfigError(str(exc).replace("--set ", "set ")) from None
        if _clashes(overrides, change):
            raise ConfigError(
                f"set {assignment}: an earlier assignment gives part of this key path a value; "
                f"it cannot also hold keys"
            )
        overrides = deep_merge(overrides, change)
    words = [*assignments, *(f"--unset {key}" for key in unset)]
    step: dict[str, Any] = {"name": "set " + " ".join(words)}
    if unset:
        step["unsetValues"] = list(unset)
    if assignments:
        step["setValues"] = overrides
    if redeploy:
        step["redeploy"] = redeploy
    return step


def bring_secrets(stack: Stack, args: Sequence[str]) -> list[str]:
    """`set --secret NAME=DIR`: the user's Secret placed in the running stack as it is (as `kubectl create
    secret tls` would), and kept in its topology, so a later rollout naming it finds it."""
    if not args:
        return []
    require_running(stack)
    with stack.changing():
        return _bring(stack, args)


def _bring(stack: Stack, args: Sequence[str]) -> list[str]:
    topology = stack.topology
    store = CertStore(stack.state_dir / "certs")
    brought = {}
    for arg in args:
        name, folder = parse_secret_arg(arg)
        place_secret(store, SecretSpec(name, source=str(folder)), topology.worker_domain)
        brought[name] = SecretSpec(name, source=str(folder))
    kept = tuple(s for s in topology.secrets if s.name not in brought) + tuple(brought.values())
    write_file(stack.state_dir / "topology.json", replace(topology, secrets=kept).to_json())
    return [f"Secret {name} brought from {spec.source}" for name, spec in brought.items()]


def _clashes(before: Mapping[str, Any], change: Mapping[str, Any]) -> bool:
    """Does `change` put keys under something `before` set to a plain value (or the other way round)?"""
    for key, value in change.items():
        if key in before:
            if isinstance(value, Mapping) != isinstance(before[key], Mapping):
                return True
            if isinstance(value, Mapping) and _clashes(before[key], value):
                return True
    return False


def unknown_key_warnings(step: dict[str, Any]) -> list[str]:
    """Keys the stack does not know, with the closest known one: the chart would accept them silently."""
    warnings = []
    for parts in unknown_keys(step.get("setValues") or {}):
        hint = suggest(parts)
        warnings.append(f"unknown key {key_path(parts)}" + (f" (did you mean {hint}?)" if hint else ""))
    return warnings


def steps_from_file(
    ref: str, state_dir: Path
) -> tuple[list[dict[str, Any]], Path, dict[str, tuple[str, int]]]:
    """`ncpsim step FILE|-`: one step (a mapping), or `steps: [...]`; `-` reads standard input."""
    if ref == "-":
        path = state_dir / "step-stdin.yaml"  # kept, so a mistake's FILE:LINE points at real text
        raw = sys.stdin.buffer.read(MAX_BYTES + 1)  # bounded: `ncpsim step - < /dev/zero` ends
        if len(raw) > MAX_BYTES:
            raise ConfigError(
                f"standard input: more than {MAX_BYTES:,} bytes is too large for a step; "
                f"is it the right input?"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError("standard input: not UTF-8 text; give the step as UTF-8") from None
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot keep standard input in {path} ({exc.strerror or exc}); "
                f"set NCPSIM_HOME to a folder you can write, or give the step as a file"
            ) from None
        write_file(path, text)  # not through a link planted there; load_values_file then judges the text
    else:
        path = Path(ref)
        if not path.is_file():
            raise ConfigError(
                f"{ref}: no such step file (write one step in YAML, or `-` to read standard input)"
            )
    data, origin = load_values_file(path, "step file")
    if not data:
        raise ConfigError(
            f"{path}: no step; write one step (e.g. invoke: {{function: http-echo}}) or steps: [...]"
        )
    if "steps" in data and len(data) == 1:
        if not isinstance(data["steps"], list):
            raise ConfigError(f"{path}: steps: expected a list of steps")
        return data["steps"], path, origin
    return [data], path, {f"steps[0].{k}": v for k, v in origin.items()}


# -- what a command prints -----------------------------------------------------------------------------
def session_text(session: Session, width: int | None = None, colour: bool = False) -> str:
    """Each step with its note and failures, and the per-callback trace table (as replay reports draw it);
    `width` the terminal's (the table folds its cells to fit), `colour` green passes and red failures."""
    buffer = io.StringIO()
    console = Console(
        file=buffer, force_terminal=colour, width=width or 160, no_color=not colour, highlight=False
    )
    for result in session.steps:
        ok = step_ok(result)
        passed = sum(1 for t in result.traces if t.outcome == "success")
        calls = f" — {passed}/{len(result.traces)} calls succeeded" if result.traces else ""
        note = f" ({result.note})" if result.note else ""
        line = safe(f"{'✓' if ok else '✗'} {result.step.name}{calls}{note}", one_line=True)
        console.print(line, markup=False, soft_wrap=True, style="green" if ok else "bold red")
        for failure in result.failures:
            console.print(f"    {safe(failure, one_line=True)}", markup=False, soft_wrap=True, style="red")
        if result.traces:
            table = Table(box=None, padding=(0, 1), show_edge=False)
            for column in TRACE_COLUMNS:
                table.add_column(column, overflow="fold")
            for trace in result.traces:
                table.add_row(
                    *(markup(cell) for cell in call_row(trace)),
                    style=None if trace.outcome == "success" else "red",
                )
            console.print(table)
    return buffer.getvalue()


def session_json(session: Session) -> str:
    return json.dumps(
        {
            "ok": session.ok,
            "steps": [
                {
                    "step": r.step.name,
                    "ok": step_ok(r),
                    "note": r.note,
                    "failures": r.failures,
                    "calls": [t.to_dict() for t in r.traces],
                }
                for r in session.steps
            ],
        },
        indent=2,
        default=str,
    )
