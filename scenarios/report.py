"""Replay reports for people: a pass/fail headline, each step, and a trace line per callback."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scenarios.paste import try_commands
from scenarios.result import ScenarioResult
from scenarios.spec import Scenario
from scenarios.terminal import markup, safe
from scenarios.trace import CallTrace
from sim.model.assumptions import assumptions

if TYPE_CHECKING:  # rich itself is imported where the report is drawn (render_text)
    from rich.console import Console
    from rich.table import Table

ARTIFACT_NAMES = {
    "html": "sequence diagram (HTML)",
    "mermaid": "sequence diagram (Mermaid)",
    "json": "JSON report",
}


def call_row(t: CallTrace) -> list[str]:
    dns = f"{t.dns.get('name', '-')} -> {t.lookup}" if t.dns else t.lookup
    proxy = (
        ", ".join(f"{r['method']} {r['status']} {r['flags']} -> {r['upstream_host']}" for r in t.proxy) or "-"
    )
    refused = [d["reason"] for d in t.decisions if d.get("decision") == "Reject" and d.get("reason")]
    proxy += f" ({'; '.join(refused)})" if refused else ""
    legs = ", ".join(f"{leg['kind'].split('.')[-1]} {leg['status']}@{leg['pod']}" for leg in t.pod_legs)
    legs = legs or "-"
    outcome = "ok" if t.outcome == "success" else f"FAILED: {t.error}"
    holder = f"{t.method} {t.target}" if t.kind == "probe" else t.pod
    return [str(t.index), holder, t.worker or "-", dns, proxy, legs, outcome]


def render_text(
    result: ScenarioResult,
    console: Console | None = None,
    traces: bool = True,
    width: int | None = None,
    colour: bool = False,
) -> str:
    """Rich text on a terminal, plain text otherwise (rich decides from the console it writes to); without a
    console, `width` (a terminal's, else 160) and `colour` say how the text is drawn."""
    # rich is imported here, as the report is drawn: `ncpsim up` needs it only once its scenario has run,
    # and its import was 6 % of the command line's work before the stack's first component.
    from rich.console import Console

    buffer = io.StringIO()
    console = console or Console(
        file=buffer, force_terminal=colour, width=width or 160, no_color=not colour, highlight=False
    )
    head = "PASS" if result.ok else "FAIL"
    style = "bold green" if result.ok else "bold red"
    console.print(f"[{style}]{head}[/] {markup(result.scenario.name)}: {markup(result.scenario.summary)}")
    if result.scenario.expect_error is None:
        console.print(
            f"  stack up in {result.up_seconds:.2f}s, scenario {result.elapsed:.2f}s"
            + (
                f", first callback {result.first_callback_seconds:.2f}s after `up` started"
                if result.first_callback_seconds is not None
                else ""
            )
        )
    for line in [f"  {a}" for a in result.assumptions] + values_lines(result.scenario):
        console.print(safe(line, one_line=True), markup=False, soft_wrap=True)
    if result.refused and result.ok:
        console.print(f"  values refused as expected: {safe(result.refused, one_line=True)}", markup=False)
    if result.error:
        console.print(f"  [red]error:[/] {markup(result.error)}")
    for step in result.steps:
        mark = "[green]✓[/]" if step.ok else "[red]✗[/]"
        ok = sum(1 for t in step.traces if t.outcome == "success")
        calls = f" — {ok}/{len(step.traces)} calls succeeded" if step.traces else ""
        note = f" ({markup(step.note)})" if step.note else ""
        console.print(f"  {mark} {markup(step.step.label)}{calls}{note}")
        for failure in step.failures:
            console.print(f"      [red]{markup(failure)}[/]")
        if traces and step.traces:
            console.print(_trace_table(step.traces))
    for kind in ("html", "mermaid", "json"):
        if kind in result.artifacts:
            console.print(f"  {ARTIFACT_NAMES[kind]}: {result.artifacts[kind]}", markup=False, soft_wrap=True)
    return buffer.getvalue()


def values_lines(scenario: Scenario) -> list[str]:
    """The scenario values a customer file or --set replaced, and the keys the stack does not know."""
    layering = scenario.layering
    if layering is None:
        return []
    lines = (
        ["  scenario values overridden (Helm's order: later files and --set win):"]
        if layering.overrides
        else []
    )
    lines += [f"    {override}" for override in layering.overrides]
    lines += [f"  warning: {unknown}" for unknown in layering.unknown]
    lines += [f"  {accepted}" for accepted in layering.accepted]
    return lines


def values_warnings(scenarios: Iterable[Scenario]) -> list[str]:
    """Each unknown-key warning and accepted-not-modelled key once, though every scenario of a replay
    carries the customer's files."""
    seen: dict[str, None] = {}
    for scenario in scenarios:
        layering = scenario.layering
        for line in (
            [f"warning: {u}" for u in layering.unknown] + [str(a) for a in layering.accepted]
            if layering
            else []
        ):
            seen.setdefault(line)
    return list(seen)


def input_assumptions(scenarios: Iterable[Scenario], backend: str) -> list[str]:
    """The assumptions the scenarios' values and topology make ncpsim take (a Secret nobody brought, a
    worker-utils it has no profile for), each once: said on stderr before anything starts, and again in
    the report, because a run that passes on a stand-in must not be read as the field passing."""
    seen: dict[str, None] = {}
    for scenario in scenarios:
        if scenario.expect_error is None and not scenario.stackless:
            topology = scenario.build_topology("assumed")
            for assumption in assumptions(topology, backend):
                if assumption.from_input:
                    seen.setdefault(str(assumption))
    return list(seen)


def _trace_table(traces: list[CallTrace]) -> Table:
    from rich.table import Table  # with the report (render_text)

    table = Table(box=None, padding=(0, 1), show_edge=False)
    columns = ("#", "pod holding it / probe", "worker", "DNS", "proxy (access log)", "pod legs", "outcome")
    for column in columns:
        table.add_column(column, overflow="fold")
    for trace in traces:
        table.add_row(*(markup(cell) for cell in call_row(trace)))
    return table


def endpoints_text(status: dict[str, Any]) -> str:
    """Ready-to-paste commands against the running stack."""
    proxy = status.get("proxy") or {}  # null when workerCallbackProxy.enabled is false
    http = proxy.get("http") or {}
    ca = status["ca"]["stack"]
    lines = [
        f"Stack {status['stack']} ({status['backend']}), state in {status['stateDir']}",
        f"  proxy HTTP front  {http['url']}  ->  {http['host']}:{http['port']}"
        if http.get("port")
        else "  proxy             off (workerCallbackProxy.enabled is false): workers call pods directly",
    ]
    h3 = proxy.get("h3") or {}
    if h3.get("port"):
        lines.append(f"  proxy HTTP/3 front {h3['url']} (UDP)  ->  {h3['host']}:{h3['port']}")
    for cluster, addr in status["dns"].items():
        lines.append(
            f"  DNS view {cluster:<18} {addr['host']}:{addr['port']} (UDP and TCP)"
            if addr.get("port")
            else f"  DNS view {cluster:<18} inside the cluster only (kubectl context {addr.get('context')})"
        )
    nats = status.get("nats") or {}
    servers = [s for s in nats.get("servers") or [] if s.get("port")]
    for server in servers or ([{"name": "nats-server", **nats}] if nats.get("port") else []):
        lines.append(  # each pod of the nats StatefulSet behind the load balancer workers dial
            f"  {server['name']:<17} {nats['url']}  ->  {server['host']}:{server['port']}  "
            f"(monitor {server['monitor']}, no credentials, as upstream's)"
        )
    lines.append(f"  stack CA {ca}\n  public-style CA {status['ca']['public']}")
    lines += ["", "Try it:", *(f"  {command}" for command in try_commands(status))]
    return "\n".join(lines)
