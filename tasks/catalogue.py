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
    from scenarios.model import catalogue

    entries = catalogue()
    width = max((len(name) for name, _ in entries), default=0)  # every name whole, the summaries lined up
    for name, summary in entries:
        print(f"{name:<{width}}  {summary}")


@optional_positional(
    "scenario",
    help={
        "scenario": "catalogue name or YAML path (also as scenario=NAME)",
        "all": "replay the whole catalogue",
        "stack": "the stack to replay on (with --all: NAME-<scenario>); default replay-<scenario>",
        "junit": "write a JUnit XML report to this file",
        "keep": "leave a failed scenario's stack running",
        "file": "a customer's values file, above each scenario's values (repeatable: later files win)",
        "set": "key.path=value, YAML-typed, above every file (repeatable)",
        "json": "print JSON reports",
        "jobs": "replays at a time, each on its own isolated stack (a number, or auto: one per core)",
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
    stack=None,
    secret=None,
    bundle=None,
):
    """Replay scenarios, each on a fresh stack; exit 1 if any expectation fails.

    invoke replay NAME|scenario=NAME [--stack S] | --all [-j N|auto] | --bundle B [--junit FILE] [--keep]
    """
    import tempfile

    from scenarios.diagnose.plan import load_bundle_scenario
    from scenarios.replay import jobs_arg, replay_many

    usage = "invoke replay scenario=grpc-callback, --all, or --bundle B"
    names = None if all_ else [] if bundle and not scenario else [scenario_arg(scenario, usage)]
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
            values_file=[Path(f) for f in file or []],
            sets=set_ or [],
            junit=Path(junit) if junit else None,
            keep=keep,
            as_json=json_,
            stack=stack,
            jobs=jobs_arg(jobs),
            secrets=secret or [],
            loaded=[loaded] if loaded is not None else [],
        )
    if not ok:
        raise Exit(code=EXIT_FAILED)


@ncpsim_task(
    help={
        "out": "folder to write into",
        "scenario": "catalogue name or YAML path",
        "backend": "k3d (only k3d renders files)",
        "stack": "stack whose certificates to use",
    }
)
@user_errors
def render(c, out, scenario="http-callback", backend="k3d", stack="default"):
    """Write every k3d config, Kubernetes manifest and the Envoy config; run nothing."""
    from scenarios.model import load_scenario
    from sim.errors import ConfigError

    if backend != "k3d":
        raise ConfigError("--backend: only k3d renders files (the local backend runs processes)")
    from clusters.k3d.tasks import render as k3d_render

    loaded = load_scenario(scenario_arg(scenario))
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
