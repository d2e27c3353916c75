"""The stack's life and views: up, down, status, logs, certs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from invoke import Exit

from tasks.cli import (
    EXIT_FAILED,
    backend_named,
    ncpsim_task,
    optional_positional,
    scenario_arg,
    stack_named,
    state_folder,
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
    stack is up and stays up (`invoke down` stops it).

    invoke up [NAME | scenario=NAME | --scenario NAME] [-f FILE ...] [--set key.path=value ...] [--stack S];
    with no scenario, the default topology comes up idle.
    """
    if backend != "local":
        _up(scenario, file, set_, backend, stack, json_, secret, bundle)
        return
    from clusters.local.interrupts import InterruptGuard
    from clusters.local.zygote import early_for

    guard = InterruptGuard()  # from now on this process owns a child: Ctrl-C and SIGTERM clean up
    with guard.installed(), early_for(stack, guard):  # the launch's zygote imports while _up does
        _up(scenario, file, set_, backend, stack, json_, secret, bundle)


def _up(scenario, file, set_, backend, stack, json_, secret, bundle=None) -> None:
    import tempfile

    from sim.errors import ConfigError

    if bundle and scenario:
        raise ConfigError(
            "--bundle brings up the customer's world itself: give a scenario or --bundle, not both"
        )
    with tempfile.TemporaryDirectory(
        prefix="ncpsim-bundle-"
    ) as scratch:  # stand-in Secrets until up copies them
        _up_loaded(scenario, file, set_, backend, stack, json_, secret, bundle, Path(scratch))


def _up_loaded(scenario, file, set_, backend, stack, json_, secret, bundle, scratch) -> None:
    from clusters.local.interrupts import settle
    from scenarios.devenv import idle_scenario
    from scenarios.diagnose.plan import load_bundle_scenario
    from scenarios.engine import run_scenario
    from scenarios.model import load_scenario
    from scenarios.report import endpoints_text, render_text, values_warnings
    from scenarios.result import to_json
    from scenarios.secrets import with_brought_secrets

    chosen = backend_named(backend)
    files, sets = [Path(f) for f in file or []], set_ or []
    # No scenario: the default topology, idle (a dev environment to poke with call, fault, set, ...).
    if bundle:  # the customer's world as the bundle shows it, said where assumed
        loaded, notes = load_bundle_scenario(Path(bundle), scratch, files, sets)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    elif scenario:
        loaded = load_scenario(scenario_arg(scenario), files, sets=sets)
    else:
        loaded = idle_scenario(files, sets)
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
        "stack": "stack name",
        "backend": "local or k3d",
    }
)
@user_errors
def down(c, purge=False, stack="default", backend="local"):
    """Stop every process of the stack (by process group); --purge removes its state folder."""
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
    print(f"stopped {len(stopped)} processes{removed}")


@ncpsim_task(
    help={"json": "print the status contract as JSON", "stack": "stack name", "backend": "local or k3d"}
)
@user_errors
def status(c, json_=False, stack="default", backend="local"):
    """Show the running stack: endpoints, DNS views, CAs, pods and logs."""
    from scenarios.report import endpoints_text

    current = stack_named(stack, backend).status()
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
    known = stack_named(stack, backend).logs()
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
    """Print each CA's path, SHA-256 fingerprint and expiry (creating the CAs if the stack has none yet)."""
    from certs.store import CertStore, describe_text

    store = CertStore(state_folder(stack) / "certs")
    store.ensure_cas()
    print(describe_text(store.describe()))
