"""A dev environment: one scenario step at a time on the running stack (scenarios/devenv.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from invoke import Exit

from tasks.cli import EXIT_FAILED, ncpsim_task, optional_positional, stack_named, terminal, user_errors


def _run_steps(
    stack_name: str,
    backend: str,
    steps: list[dict[str, Any]],
    source: str,
    json_: bool = False,
    origin: dict[str, tuple[str, int]] | None = None,
) -> None:
    from scenarios.devenv import run_steps, session_json, session_text

    session = run_steps(stack_named(stack_name, backend), steps, Path(source), origin)
    width, coloured = terminal(sys.stdout)
    print(session_json(session) if json_ else session_text(session, width, coloured).rstrip("\n"))
    if not session.ok:
        raise Exit(code=EXIT_FAILED)


_ON_STACK = {"stack": "stack name (default: default)", "backend": "local or k3d"}


@ncpsim_task(
    positional=["function"],
    help={
        "function": "http-echo or grpc-echo",
        "count": "how many calls (they run at once)",
        "json": "print the traces as JSON",
        **_ON_STACK,
    },
)
@user_errors
def call(c, function, count=1, json_=False, stack="default", backend="local"):
    """Invoke a function on the running stack; a trace line per callback; exit 1 if any call failed."""
    from scenarios.devenv import call_step

    _run_steps(stack, backend, [call_step(function, int(count))], "ncpsim call", json_)


@optional_positional(
    "action",
    "target",
    help={
        "action": "kill, restart, stop, start (a component), scale (ROLE=N), link (FROM_CLUSTER), "
        "clear-links, expire (frontend|public-frontend|invocation|grpc-proxy)",
        "target": "what the action acts on (see `ncpsim status` for component names)",
        "to": "link: the address or CIDR the cluster's dials go to (default: the proxy's load balancer)",
        "latency_ms": "link: added latency",
        "drop": "link: share lost (0..1): TCP connections and requests on kept-alive ones, UDP datagrams",
        "timeout_ms": "link: how long a lost attempt (TCP dial, DNS query, QUIC handshake) hangs",
        "protocol": "link: tcp, udp (DNS, HTTP/3) or any (default); udp alone is a TCP-only load balancer",
        **_ON_STACK,
    },
)
@user_errors
def fault(
    c,
    action=None,
    target=None,
    to=None,
    latency_ms=0,
    drop=0.0,
    timeout_ms=1000,
    protocol="any",
    stack="default",
    backend="local",
):
    """Inject a fault into the running stack.

    ncpsim fault kill|restart|stop|start COMPONENT, fault scale ROLE=N (e.g. invocation=1, nats=2),
    fault rollout nats (a rolling restart of the NATS servers, reverse ordinal order),
    fault link CLUSTER [--to CIDR] [--latency-ms N] [--drop P] [--timeout-ms N] [--protocol tcp|udp|any],
    fault clear-links,
    fault expire frontend|public-frontend|invocation|grpc-proxy
    """
    from scenarios.devenv import fault_step, link_target
    from sim.errors import ConfigError

    if not action:
        raise ConfigError("fault: name an action, e.g. ncpsim fault kill invocation-service-0 (see --help)")
    if action == "link":
        to = link_target(stack_named(stack, backend), to)
    step = fault_step(action, target, to, int(latency_ms), float(drop), int(timeout_ms), protocol)
    _run_steps(stack, backend, [step], "ncpsim fault")


@ncpsim_task(positional=["kind"], help={"kind": "frontend, pod-certs, stack-ca or public-ca", **_ON_STACK})
@user_errors
def rotate(c, kind, stack="default", backend="local"):
    """Rotate certificates on the running stack, as the runbook does; calls keep working throughout."""
    from scenarios.devenv import rotate_step

    _run_steps(stack, backend, [rotate_step(kind)], "ncpsim rotate")


@optional_positional(
    "assignment",
    more="assignment",
    name="set",
    help={
        "assignment": "key.path=value (YAML-typed: true, 3, null); several may follow",
        "unset": "KEY: back to the chart's default (repeatable)",
        "secret": "NAME=DIR: bring Secret NAME (tls.crt, tls.key[, ca.crt]) into the running stack first "
        "(repeatable), e.g. for a new tls.frontend.existingSecret",
        "redeploy": "then replace workers, proxy, pods or all, as a rollout would",
        **_ON_STACK,
    },
    iterable=["unset", "secret"],
)
@user_errors
def set_(c, assignment=None, unset=None, secret=None, redeploy=None, stack="default", backend="local"):
    """Change values on the running stack (running pods keep theirs until --redeploy replaces them).

    ncpsim set key.path=value [key.path=value ...] [--unset KEY ...] [--secret NAME=DIR ...]
    [--redeploy workers|proxy|pods|all]; a proxy rollout whose frontend Secret the stack lacks is refused
    before it starts, and the running proxy keeps serving.
    """
    from scenarios.devenv import bring_secrets, set_step, unknown_key_warnings

    assignments = assignment if isinstance(assignment, list) else [assignment] if assignment else []
    if not assignments and not unset and secret:  # only bringing Secrets in
        for line in bring_secrets(stack_named(stack, backend), secret):
            print(line)
        return
    step = set_step(assignments, redeploy, unset or [])
    for warning in unknown_key_warnings(step):  # the real chart is silent about them; the warning is the clue
        print(f"warning: {warning}", file=sys.stderr)
    for line in bring_secrets(stack_named(stack, backend), secret or []):
        print(line)
    _run_steps(stack, backend, [step], "ncpsim set")


@ncpsim_task(
    positional=["file"], help={"file": "a YAML step (or `steps: [...]`), `-` for standard input", **_ON_STACK}
)
@user_errors
def step(c, file, stack="default", backend="local"):
    """Run any scenario step on the running stack, with its expectations checked; exit 1 if one fails."""
    from scenarios.devenv import steps_from_file

    steps, path, origin = steps_from_file(file, stack_named(stack, backend).state_dir)
    _run_steps(stack, backend, steps, str(path), origin=origin)


@ncpsim_task(
    help={
        "json": "one JSON object a line (a callback's trace, or a request's access-log record)",
        "grep": "only rows that mention this text (case-insensitive): a worker, a pod, a status, a flag",
        "failed": "only failed callbacks and refused requests",
        **_ON_STACK,
    }
)
@user_errors
def watch(c, json_=False, grep="", failed=False, stack="default", backend="local"):
    """What crosses the running stack: each worker callback and every other request the proxy sees (curl
    included); a live table on a terminal, plain lines (or JSON with --json) otherwise; Ctrl-C stops it."""
    from scenarios.devenv import require_running
    from scenarios.watch import Choice
    from scenarios.watch import watch as show

    running = stack_named(stack, backend)
    require_running(running)

    def still_up() -> bool:
        try:
            return running.status() is not None
        except (OSError, ValueError):  # caught while `ncpsim down` removes its files: look again next time
            return True

    show(running.state_dir, sys.stdout, still_up, choice=Choice(grep, failed), as_json=json_)
