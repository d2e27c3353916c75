"""The scenario catalogue: list it, replay it, render it for k3d."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Exit

from tasks.cli import (
    EXIT_FAILED,
    ncpsim_task,
    optional_positional,
    out_file,
    out_folder,
    scenario_arg,
    state_folder,
    user_errors,
)


@ncpsim_task
@user_errors
def scenarios(c):
    """List the scenario catalogue with one-line summaries."""
    from scenarios.lookup import catalogue

    entries = catalogue()
    width = max((len(name) for name, _ in entries), default=0)  # every name whole, the summaries lined up
    for name, summary in entries:
        print(f"{name:<{width}}  {summary}")


@optional_positional(
    "scenario",
    more="scenario",
    help={
        "scenario": "catalogue names, YAML paths or globs (nats-*), several at once (also as scenario=NAME)",
        "all": "replay the whole catalogue",
        "stack": "the stack to replay on (with several: NAME-<scenario>); default replay-<scenario>",
        "junit": "write a JUnit XML report to this file",
        "keep": "leave a failed scenario's stack running",
        "file": "a customer's values file, above each scenario's values (repeatable: later files win)",
        "set": "key.path=value, YAML-typed, above every file (repeatable)",
        "json": "print one JSON document: {ok, passed, total, seconds, scenarios: [report, ...]}",
        "jsonl": "print one JSON report a line, as each scenario ends",
        "quiet": "print only failing reports and the summary",
        "jobs": "replays at a time, each on its own isolated stack (a number, or auto: one more than cores)",
        "secret": "NAME=DIR: Secret NAME holds that folder's tls.crt, tls.key[, ca.crt] (repeatable)",
        "bundle": "a support bundle (folder or .tar.gz): replay the customer's world it shows",
    },
    iterable=["file", "set_", "secret"],
)
@user_errors
def replay(
    c,
    scenario=None,
    all_=False,
    jobs=None,  # before junit, so `-j` is --jobs, as with make
    junit=None,
    keep=False,
    file=None,
    set_=None,
    json_=False,
    jsonl=False,
    quiet=False,
    stack=None,
    secret=None,
    bundle=None,
):
    """Replay scenarios, each on a fresh stack; exit 1 if any expectation fails.

    ncpsim replay NAME... | 'GLOB' | --all | --bundle B [-j N|auto] [--junit FILE] [--keep] [--quiet]
    [--json|--jsonl]; a live [n/N] line on a terminal.
    """
    import tempfile

    from clusters.interrupts import InterruptGuard
    from scenarios.diagnose.plan import load_bundle_scenario
    from scenarios.replay import jobs_arg, replay_many, scenario_names
    from sim.errors import ConfigError

    words = [w for w in (scenario if isinstance(scenario, list) else [scenario]) if w]
    if json_ and jsonl:
        raise ConfigError("--json and --jsonl: choose one")
    usage = "ncpsim replay NAME..., --all, or --bundle B"
    names = (
        None
        if all_
        else []
        if bundle and not words
        else scenario_names([scenario_arg(w, usage) for w in words or [""]])
    )
    if junit:  # checked first: a folder or a file in the way must not cost a whole replay, then a traceback
        out_file("--junit", junit)
    with tempfile.TemporaryDirectory(prefix="ncpsim-bundle-") as scratch:  # the bundle's stand-in Secrets
        files = [Path(f) for f in file or []]
        loaded, notes = (
            load_bundle_scenario(Path(bundle), Path(scratch), files, set_ or []) if bundle else (None, [])
        )
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        ok = replay_many(
            names,
            values_file=files,
            sets=set_ or [],
            junit=Path(junit) if junit else None,
            keep=keep,
            output="json" if json_ else "jsonl" if jsonl else "quiet" if quiet else "text",
            stack=stack,
            jobs=jobs_arg(jobs),
            secrets=secret or [],
            loaded=[loaded] if loaded is not None else [],
            guard=InterruptGuard(),  # the command's one: its launches and its cleanup share it
        )
    if not ok:
        raise Exit(code=EXIT_FAILED)


@ncpsim_task(
    help={
        "out": "folder to write into",
        "scenario": "catalogue name or YAML path (default: the default topology, as `ncpsim up` has it)",
        "file": "a customer's values file, above the scenario's values (repeatable: later files win)",
        "set": "key.path=value, YAML-typed, above every file (repeatable)",
        "secret": "NAME=DIR: Secret NAME holds that folder's tls.crt, tls.key[, ca.crt] as they are (repeatable)",
        "backend": "k3d (only k3d renders files)",
        "stack": "stack whose certificates to use (created if missing, so a later k3d `up` applies the same "
        "Secrets)",
    },
    iterable=["file", "set_", "secret"],
)
@user_errors
def render(c, out, scenario=None, file=None, set_=None, secret=None, backend="k3d", stack="default"):
    """Write every k3d config, Kubernetes manifest and the Envoy config for the customer's values; run nothing.

    ncpsim render --out DIR [-f values.yaml ...] [--set key=value ...] [--secret NAME=DIR ...] [--scenario S]:
    as `helm template` renders a release from its values, with ncpsim's precedence (defaults < scenario < -f <
    --set).
    """
    from scenarios.devenv import idle_scenario
    from scenarios.load import load_scenario
    from scenarios.report import input_assumptions, values_warnings
    from scenarios.secrets import with_brought_secrets
    from sim.errors import ConfigError

    if backend != "k3d":
        raise ConfigError("--backend: only k3d renders files (the local backend runs processes)")
    from clusters.k3d.tasks import render as k3d_render

    files, sets = [Path(f) for f in file or []], set_ or []
    loaded = (
        load_scenario(scenario_arg(scenario), files, sets=sets) if scenario else idle_scenario(files, sets)
    )
    loaded = with_brought_secrets(loaded, secret or [])
    for line in values_warnings([loaded]) + input_assumptions([loaded], "k3d"):
        print(line, file=sys.stderr)
    state_folder(
        stack
    )  # the certificates are kept there: an unusable NCPSIM_HOME is one line, not a traceback
    try:
        code = k3d_render(out_folder(out), loaded.build_topology(stack), loaded.name)
    except OSError as exc:  # a full disk, a read-only folder: name the file, no traceback
        raise ConfigError(
            f"--out {out}: cannot write {exc.filename or out} ({exc.strerror or exc}); "
            f"name a folder you can write"
        ) from None
    raise Exit(code=code)
