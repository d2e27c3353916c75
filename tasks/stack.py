"""The stack's life and views: up, down, status, logs, certs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from invoke import Exit

from tasks.cli import (
    EXIT_FAILED,
    backend_named,
    existing_stack,
    ncpsim_task,
    optional_positional,
    scenario_arg,
    stack_named,
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
    },
    iterable=["file", "set_", "secret"],
)
@user_errors
def up(c, scenario=None, file=None, set_=None, backend="local", stack="default", json_=False, secret=None):
    """Bring the stack up, replay the scenario once, print the report and endpoints; leave it running.

    Ctrl-C or SIGTERM before the report is out stops everything started so far; once it is out, the
    stack is up and stays up (`invoke down` stops it).

    invoke up [NAME | scenario=NAME | --scenario NAME] [-f FILE ...] [--set key.path=value ...] [--stack S];
    with no scenario, the default topology comes up idle.
    """
    if backend != "local":
        _up(scenario, file, set_, backend, stack, json_, secret)
        return
    from clusters.local.interrupts import InterruptGuard
    from clusters.local.zygote import early_for

    guard = InterruptGuard()  # from now on this process owns a child: Ctrl-C and SIGTERM clean up
    with guard.installed(), early_for(stack, guard):  # the launch's zygote imports while _up does
        _up(scenario, file, set_, backend, stack, json_, secret)


def _up(scenario, file, set_, backend, stack, json_, secret) -> None:
    from clusters.local.interrupts import settle
    from scenarios.devenv import idle_scenario
    from scenarios.engine import run_scenario
    from scenarios.model import load_scenario
    from scenarios.report import endpoints_text, render_text, values_warnings
    from scenarios.result import to_json
    from scenarios.secrets import with_brought_secrets

    chosen = backend_named(backend)
    files, sets = [Path(f) for f in file or []], set_ or []
    # No scenario: the default topology, idle (a dev environment to poke with call, fault, set, ...).
    loaded = (
        load_scenario(scenario_arg(scenario), files, sets=sets) if scenario else idle_scenario(files, sets)
    )
    loaded = with_brought_secrets(loaded, secret or [])
    for warning in values_warnings([loaded]):  # the real chart is silent about them; the warning is the clue
        print(f"warning: {warning}", file=sys.stderr)
    # Ctrl-C or SIGTERM until the report is out: nothing left running. Once it is out, the stack is up.
    with chosen.interruptible(stack):
        result = run_scenario(loaded, chosen, stack, keep=True)
        if json_:
            print(json.dumps(to_json(result), indent=2, default=str))
        else:
            print(render_text(result), end="")
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
    from scenarios.report import endpoints_text

    current = existing_stack(stack, backend).status()
    if current is None:
        if json_:
            print(json.dumps({"stack": stack, "running": []}))
        else:
            flag = "" if stack == "default" else f" --stack {stack}"
            print(f"stack {stack!r} is not up (bring it up with `invoke up{flag}`)")
        raise Exit(code=EXIT_FAILED)
    down, complete = current.get("down") or [], current.get("complete", True)
    if json_:
        print(json.dumps(current, indent=2))
    else:
        if complete:
            print(endpoints_text(current))
        else:
            print(f"stack {stack!r} is partly up: its start did not finish (`invoke down` stops what runs)")
        if "running" in current:
            print(f"  running: {', '.join(current['running']) or 'nothing'}")
        if down:
            print(f"  down: {', '.join(down)}")
    if down or not complete:  # a component of the stack is not running: say so in the exit code too
        raise Exit(code=EXIT_FAILED)


@optional_positional(
    "component",
    help={
        "component": "component name (e.g. worker-callback-proxy, worker-callback-proxy.access, "
        "invocation-service-0), or `all` (the default)",
        "lines": "lines from the end (default 40)",
        "stack": "stack name",
        "backend": "local or k3d",
    },
)
@user_errors
def logs(c, component=None, lines=None, stack="default", backend="local"):
    """Print the last lines of a component's log (the proxy's access log is worker-callback-proxy.access)."""
    from sim.errors import ConfigError

    count = (
        40 if lines is None else whole_number("--lines", lines)
    )  # text: invoke's own int() would traceback
    known = existing_stack(stack, backend).logs()
    paths = [Path(p) for p in known.values()]
    if component and component != "all":
        paths = [Path(known[component])] if component in known else []
        if not paths:
            raise ConfigError(f"no log for {component!r}; known: {', '.join(known) or 'none'}")
    for path in paths:
        text = path.read_text(errors="replace").splitlines()[-count:] if count else []
        print(f"==> {path} <==")
        print("\n".join(text))


@ncpsim_task(help={"stack": "stack name"})
@user_errors
def certs(c, stack="default"):
    """Print each CA's path, SHA-256 fingerprint and expiry."""
    from certs.store import CertStore, describe_text

    store = CertStore(existing_stack(stack).state_dir / "certs")
    store.ensure_cas()
    print(describe_text(store.describe()))
