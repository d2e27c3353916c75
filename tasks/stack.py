"""The stack's life and views: up, down, status, logs, certs."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

from invoke import Exit

from tasks.cli import (
    EXIT_FAILED,
    backend_named,
    colour,
    existing_stack,
    ncpsim_task,
    optional_positional,
    scenario_arg,
    stack_named,
    terminal,
    user_errors,
    whole_number,
)


@optional_positional(
    "scenario",
    help={
        "scenario": "catalogue name or path to a scenario YAML (also as scenario=NAME); "
        "none: the default topology, idle",
        "file": "a customer's values file, above the scenario's values (repeatable: later files win)",
        "set": "key.path=value, YAML-typed, above every file (repeatable)",
        "backend": "local (default: processes on 127.0.0.1) or k3d",
        "stack": "stack name (its state lives in .ncpsim/<stack>/)",
        "json": "print the report as JSON instead of text",
        "secret": "NAME=DIR: Secret NAME holds that folder's tls.crt, tls.key[, ca.crt] as they are "
        "(e.g. the customer's certificate for tls.frontend.existingSecret; repeatable)",
        "bundle": "a support bundle (folder or .tar.gz): bring up the customer's world it shows",
    },
    iterable=["file", "set_", "secret"],
)
@user_errors
def up(
    c,
    scenario=None,
    file=None,
    set_=None,
    backend="local",
    stack="default",
    json_=False,
    secret=None,
    bundle=None,
):
    """Bring the stack up, replay the scenario once, print the report and endpoints; leave it running.

    Ctrl-C or SIGTERM before the report is out stops everything started so far; once it is out, the
    stack is up and stays up (`ncpsim down` stops it).

    ncpsim up [NAME | scenario=NAME | --scenario NAME] [-f FILE ...] [--set key.path=value ...] [--stack S];
    with no scenario, the default topology comes up idle.
    """
    if backend != "local":
        _up(scenario, file, set_, backend, stack, json_, secret, bundle)
        return
    from clusters.interrupts import InterruptGuard
    from clusters.local.zygote import early_for

    guard = InterruptGuard()  # the command's one guard, handed down: Ctrl-C and SIGTERM clean up
    with guard.installed(), early_for(stack, guard):  # the launch's zygote imports while _up does
        _up(scenario, file, set_, backend, stack, json_, secret, bundle, guard)


def _up(scenario, file, set_, backend, stack, json_, secret, bundle=None, guard=None) -> None:
    import tempfile

    from sim.errors import ConfigError

    if bundle and scenario:
        raise ConfigError(
            "--bundle brings up the customer's world itself: give a scenario or --bundle, not both"
        )
    if not bundle:  # no scratch folder: a signal before the guard is in would leave it behind
        _up_loaded(scenario, file, set_, backend, stack, json_, secret, bundle, None, guard)
        return
    with tempfile.TemporaryDirectory(prefix="ncpsim-bundle-") as scratch:  # the bundle's stand-in Secrets
        _up_loaded(scenario, file, set_, backend, stack, json_, secret, bundle, Path(scratch), guard)


def _up_loaded(scenario, file, set_, backend, stack, json_, secret, bundle, scratch, guard) -> None:
    from clusters.interrupts import settle
    from scenarios.engine import run_scenario
    from scenarios.load import load_scenario
    from scenarios.report import endpoints_text, input_assumptions, render_text, values_warnings
    from scenarios.result import to_json
    from scenarios.secrets import with_brought_secrets

    chosen = backend_named(backend, guard)
    files, sets = [Path(f) for f in file or []], set_ or []
    # No scenario: the default topology, idle (a dev environment to poke with call, fault, set, ...).
    if bundle:  # the customer's world as the bundle shows it, said where assumed
        # Imported here, not above: the bundle's readers (tar, the CoreDNS and records parsers, the
        # diagnosis) were 8 % of the command line's work before its first component, for --bundle only.
        from scenarios.diagnose.plan import load_bundle_scenario

        loaded, notes = load_bundle_scenario(Path(bundle), scratch, files, sets)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    elif scenario:
        loaded = load_scenario(scenario_arg(scenario), files, sets=sets)
    else:
        from scenarios.devenv import idle_scenario  # the dev environment's commands, for an idle stack only

        loaded = idle_scenario(files, sets)
    loaded = with_brought_secrets(loaded, secret or [])
    # Once each: the text report holds the values warnings; a stand-in is said before anything starts too.
    notes = (values_warnings([loaded]) if json_ else []) + input_assumptions([loaded], chosen.name)
    for line in notes:
        print(line, file=sys.stderr)
    # Ctrl-C or SIGTERM until the report is out: nothing left running. Once it is out, the stack is up.
    with chosen.interruptible(stack):
        result = run_scenario(loaded, chosen, stack, keep=True)
        if json_:
            print(json.dumps(to_json(result), indent=2, default=str))
        else:
            width, coloured = terminal(sys.stdout)
            print(render_text(result, width=width, colour=coloured), end="")
            if result.status:
                print()
                print(endpoints_text(result.status))
        sys.stdout.flush()
        settle()
    if not result.ok:
        raise Exit(code=EXIT_FAILED)


@ncpsim_task(
    help={
        "purge": "also delete the state folder (certificates, logs, events)",
        "all": "every stack in the state folder (`ncpsim ls` lists them)",
        "stack": "stack name",
        "backend": "local or k3d",
    }
)
@user_errors
def down(c, purge=False, all_=False, stack="default", backend="local"):
    """Stop every process of the stack (by process group); --purge removes its state folder; --all: every stack."""
    if all_:
        from clusters.stacks import stack_names

        for name in stack_names():
            _down_one(name, purge, backend, prefix=f"{name}: ")
        return
    _down_one(stack, purge, backend)


def _down_one(stack: str, purge: bool, backend: str, prefix: str = "") -> None:
    target = stack_named(stack, backend)
    existed = target.state_dir.exists()
    stopped = target.down(purge=purge)
    if backend == "k3d":
        print(
            f"deleted {', '.join(stopped)}"
            if stopped
            else "nothing to delete: no ncpsim k3d clusters or network"
        )
        return
    removed = " and removed the state folder" if purge and existed else ""
    print(f"{prefix}stopped {len(stopped)} processes{removed}")


@ncpsim_task(
    help={
        "all": "every value, the chart's defaults included (helm get values --all)",
        "json": "a list of {key, value, from}",
        "stack": "stack name",
        "backend": "local or k3d",
    }
)
@user_errors
def values(c, all_=False, json_=False, stack="default", backend="local"):
    """The stack's values as they are now, each with where it came from (helm get values, with origins).

    Origins: default, scenario NAME, FILE:LINE (-f), --set key=value, or the `ncpsim set` that changed it.
    """
    from scenarios import origins
    from sim.errors import ConfigError

    target = existing_stack(stack, backend)
    try:
        topology = target.topology
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"stack {stack!r} has no values yet (it never came up)") from None
    shown = origins.effective(topology.values, origins.load(target.state_dir), everything=all_)
    if json_:
        print(json.dumps([v.to_json() for v in shown], indent=2, default=str))
    else:
        print("\n".join(v.text() for v in shown) or "no values set: every value is the chart's default")


@ncpsim_task(help={"json": "one JSON document: a list of {name, state, scenario, stateDir}"})
@user_errors
def ls(c, json_=False):
    """List the stacks in the state folder (./.ncpsim or $NCPSIM_HOME), running or not, with their folders."""
    from clusters.stacks import list_stacks

    stacks = list_stacks()
    if json_:
        print(json.dumps([s.to_json() for s in stacks], indent=2))
        return
    if not stacks:
        print("no stacks here (`ncpsim up` brings one up)")
        return
    width = max(len(s.name) for s in stacks)
    for s in stacks:
        print(f"{s.name:<{width}}  {s.state:<9}  {s.scenario or '-':<28}  {s.state_dir}")


@ncpsim_task(
    help={"json": "print the status contract as JSON", "stack": "stack name", "backend": "local or k3d"}
)
@user_errors
def status(c, json_=False, stack="default", backend="local"):
    """Show the running stack: endpoints, DNS views, CAs, pods and logs."""
    from scenarios import state_view
    from scenarios.report import endpoints_text

    current = existing_stack(stack, backend).status()
    if current is None:
        if json_:
            print(json.dumps({"stack": stack, "running": []}))
        else:
            flag = "" if stack == "default" else f" --stack {stack}"
            print(f"stack {stack!r} is not up (bring it up with `ncpsim up{flag}`)")
        raise Exit(code=EXIT_FAILED)
    down, complete = current.get("down") or [], current.get("complete", True)
    target = existing_stack(stack, backend)
    extra = state_view.live(target, target.components.running() if target.components else None)
    current.update(extra)
    if json_:
        print(json.dumps(current, indent=2))
    else:
        if complete:
            print(endpoints_text(current))
            print("\n".join(state_view.text(extra)))
            for assumed in current.get("assumptions", []):  # what ncpsim filled in (no silent green)
                print(f"  assumed: {assumed['what']}; {assumed['bring']}")
        else:
            print(f"stack {stack!r} is partly up: its start did not finish (`ncpsim down` stops what runs)")
        if "running" in current:
            print(f"  running: {', '.join(current['running']) or 'nothing'}")
        if down:
            print(f"  down: {', '.join(down)}")
        for name, pids in (current.get("orphans") or {}).items():
            print(
                f"  {name}: its supervisor died and left pid {', '.join(map(str, pids))} running "
                f"(`ncpsim fault restart {name}` replaces them; `ncpsim down` stops them)"
            )
    if down or not complete:  # a component of the stack is not running: say so in the exit code too
        raise Exit(code=EXIT_FAILED)


@optional_positional(
    "component",
    more="component",
    help={
        "component": "component names (e.g. worker-callback-proxy, worker-callback-proxy.access, "
        "invocation-service-0; several: one timeline), or `all` (the default)",
        "lines": "lines from the end of each log (default 40)",
        "follow": "keep printing what the logs gain, until Ctrl-C or until the stack is down",
        "stack": "stack name",
        "backend": "local or k3d",
    },
)
@user_errors
def logs(c, component=None, lines=None, follow=False, stack="default", backend="local"):
    """A component's log, or several merged into one timeline with each line's component in front.

    ncpsim logs [COMPONENT ...] [-n LINES] [-f]; the proxy's access log is worker-callback-proxy.access.
    """
    from scenarios import logview
    from sim.errors import ConfigError

    count = (
        40 if lines is None else whole_number("--lines", lines)
    )  # text: invoke's own int() would traceback
    target = existing_stack(stack, backend)
    known = target.logs()
    names = [n for n in (component if isinstance(component, list) else [component]) if n and n != "all"]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"no log for {unknown[0]!r}; known: {', '.join(known) or 'none'}")
    chosen = {n: Path(known[n]) for n in names or known}
    printer = logview.Printer(chosen, sys.stdout, colour=colour(sys.stdout), prefix=len(chosen) > 1)
    for line in logview.timeline(chosen, count):
        printer.show(line)
    if follow:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how following ends
            logview.follow(chosen, printer, lambda: target.status() is not None)


@ncpsim_task(
    help={
        "kind": "only events of this kind, or of a prefix ending in a dot (worker.); repeatable",
        "json": "one JSON object a line, as the components wrote them",
        "follow": "keep printing new events, until Ctrl-C or until the stack is down",
        "stack": "stack name",
        "backend": "local or k3d",
    },
    iterable=["kind"],
)
@user_errors
def events(c, kind=None, json_=False, follow=False, stack="default", backend="local"):
    """The stack's event stream (what the replay engine reads): every component's events, in time order."""
    from scenarios import logview
    from scenarios.tail import StackTail

    target = existing_stack(stack, backend)
    tail = StackTail(target.state_dir)

    def show_new(seen: int) -> int:
        tail.refresh()
        fresh = sorted(tail.events[seen:], key=lambda e: float(e.get("ts") or 0))
        for event in fresh:
            if logview.wanted(event, kind or []):
                print(json.dumps(event, default=str) if json_ else logview.event_line(event), flush=True)
        return len(tail.events)

    seen = show_new(0)
    checked = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):
        while follow:
            time.sleep(logview.FOLLOW_POLL)  # a polling interval between re-reads, not a readiness wait
            seen = show_new(seen)
            if time.monotonic() - checked >= logview.ALIVE_CHECK:
                if target.status() is None:
                    break
                checked = time.monotonic()


@ncpsim_task(help={"stack": "stack name"})
@user_errors
def certs(c, stack="default"):
    """Each CA's and each Secret's certificate: path, names and issuer (Secrets), SHA-256 fingerprint, expiry."""
    from certs.store import CertStore, describe_secrets, describe_text

    store = CertStore(existing_stack(stack).state_dir / "certs")
    store.ensure_cas()
    print(describe_text(store.describe()))
    print("\n".join(describe_secrets(store)))
