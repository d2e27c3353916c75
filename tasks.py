"""ncpsim's command line: `invoke up scenario=grpc-callback`, `invoke down`, `invoke status --json`, ...

Thin tasks: each parses its arguments, calls into the packages, and turns a user mistake
(NcpsimError) into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invoke import Exit, task

ROOT = Path(__file__).resolve().parent
EXIT_FAILED, EXIT_USAGE = 1, 2


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map ncpsim's user-facing errors to a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from sim.errors import NcpsimError

        try:
            return fn(*args, **kwargs)
        except NcpsimError as exc:
            raise Exit(f"ncpsim: {exc}", code=EXIT_USAGE) from None
        except KeyboardInterrupt:
            raise Exit("ncpsim: interrupted; the processes started so far were stopped", code=130) from None

    return wrapper


def _scenario_arg(scenario: str | None) -> str:
    """Accept `scenario=NAME` (a positional word), `NAME`, and `--scenario NAME` alike."""
    value = (scenario or "").strip()
    value = value.removeprefix("scenario=")
    if not value:
        from sim.errors import ScenarioError

        raise ScenarioError("name a scenario: invoke up scenario=grpc-callback (see `invoke scenarios`)")
    return value


def _backend(name: str):
    """The one place a backend is chosen; every task then drives the Stack it returns."""
    from sim.errors import ConfigError

    if name == "local":
        from clusters.local import LocalBackend

        return LocalBackend()
    if name == "k3d":
        from clusters.k3d.stack import K3dBackend

        return K3dBackend()
    raise ConfigError(f"--backend {name!r}: choose local or k3d")


def _stack(name: str, backend: str = "local"):
    return _backend(backend).attach(name)


@task(positional=["scenario"],
      help={"scenario": "catalogue name or path to a scenario YAML (also as scenario=NAME)",
            "file": "a customer's values file, layered under the scenario's values",
            "backend": "local (default: processes on 127.0.0.1) or k3d",
            "stack": "stack name (its state lives in .ncpsim/<stack>/)",
            "json": "print the report as JSON instead of text"})
@user_errors
def up(c, scenario=None, file=None, backend="local", stack="default", json_=False):
    """Bring the stack up, replay the scenario once, print the report and endpoints; leave it running."""
    from scenarios.engine import run_scenario
    from scenarios.model import load_scenario
    from scenarios.report import endpoints_text, render_text
    from scenarios.result import to_json

    chosen = _backend(backend)
    loaded = load_scenario(_scenario_arg(scenario), Path(file) if file else None)
    with chosen.interruptible(stack):  # Ctrl-C or SIGTERM at any moment: nothing left running
        result = run_scenario(loaded, chosen, stack, keep=True)
    if json_:
        print(json.dumps(to_json(result), indent=2, default=str))
    else:
        print(render_text(result), end="")
        if result.status:
            print()
            print(endpoints_text(result.status))
    if not result.ok:
        raise Exit(code=EXIT_FAILED)


@task(help={"purge": "also delete the state folder (certificates, logs, events)",
            "stack": "stack name", "backend": "local or k3d"})
@user_errors
def down(c, purge=False, stack="default", backend="local"):
    """Stop every process of the stack (by process group); --purge removes its state folder."""
    stopped = _stack(stack, backend).down(purge=purge)
    if backend == "k3d":
        print(f"deleted {', '.join(stopped)}" if stopped else "nothing to delete: no ncpsim k3d clusters or network")
        return
    print(f"stopped {len(stopped)} processes" + (" and removed the state folder" if purge else ""))


@task(help={"json": "print the status contract as JSON", "stack": "stack name", "backend": "local or k3d"})
@user_errors
def status(c, json_=False, stack="default", backend="local"):
    """Show the running stack: endpoints, DNS views, CAs, pods and logs."""
    from scenarios.report import endpoints_text

    current = _stack(stack, backend).status()
    if current is None:
        if json_:
            print(json.dumps({"stack": stack, "running": []}))
        else:
            print(f"stack {stack!r} is not up (invoke up scenario=grpc-callback)")
        raise Exit(code=EXIT_FAILED)
    if json_:
        print(json.dumps(current, indent=2))
    else:
        print(endpoints_text(current))
        if "running" in current:
            print(f"  running: {', '.join(current['running']) or 'nothing'}")


@task(positional=["component"],
      help={"component": "component name (e.g. worker-callback-proxy, worker-callback-proxy.access, "
                         "invocation-service-0), or `all`", "lines": "lines from the end",
            "stack": "stack name", "backend": "local or k3d"})
@user_errors
def logs(c, component=None, lines=40, stack="default", backend="local"):
    """Print the last lines of a component's log (the proxy's access log is worker-callback-proxy.access)."""
    from sim.errors import ConfigError

    known = _stack(stack, backend).logs()
    paths = [Path(p) for p in known.values()]
    if component and component != "all":
        paths = [Path(known[component])] if component in known else []
        if not paths:
            raise ConfigError(f"no log for {component!r}; known: {', '.join(known) or 'none'}")
    for path in paths:
        text = path.read_text(errors="replace").splitlines()[-int(lines):]
        print(f"==> {path} <==")
        print("\n".join(text))


@task(help={"stack": "stack name"})
@user_errors
def certs(c, stack="default"):
    """Print each CA's path, SHA-256 fingerprint and expiry (creating the CAs if the stack has none yet)."""
    from certs.store import CertStore, describe_text

    store = CertStore(_stack(stack).state_dir / "certs")
    store.ensure_cas()
    print(describe_text(store.describe()))


@task
@user_errors
def scenarios(c):
    """List the scenario catalogue with one-line summaries."""
    from scenarios.model import catalogue

    for name, summary in catalogue():
        print(f"{name:<36} {summary}")


# invoke has no optional positional arguments: `scenario` is positional (so `invoke replay scenario=NAME`
# works) except when `--all` is given and no scenario is needed.
@task(positional=[] if "--all" in sys.argv else ["scenario"],
      help={"scenario": "catalogue name or YAML path (also as scenario=NAME)", "all": "replay the whole catalogue",
            "junit": "write a JUnit XML report to this file", "keep": "leave a failed scenario's stack running",
            "file": "a customer's values file, layered under each scenario", "json": "print JSON reports"})
@user_errors
def replay(c, scenario=None, all_=False, junit=None, keep=False, file=None, json_=False):
    """Replay scenarios, each on a fresh stack; exit 1 if any expectation fails."""
    from scenarios.replay import replay_many

    names = None if all_ else [_scenario_arg(scenario)]
    ok = replay_many(names, values_file=Path(file) if file else None, junit=Path(junit) if junit else None,
                     keep=keep, as_json=json_)
    if not ok:
        raise Exit(code=EXIT_FAILED)


@task(help={"out": "folder to write into", "scenario": "catalogue name or YAML path",
            "backend": "k3d (only k3d renders files)", "stack": "stack whose certificates to use"})
@user_errors
def render(c, out, scenario="http-callback", backend="k3d", stack="default"):
    """Write every k3d config, Kubernetes manifest and the Envoy config; run nothing."""
    from scenarios.model import load_scenario
    from sim.errors import ConfigError

    if backend != "k3d":
        raise ConfigError("--backend: only k3d renders files (the local backend runs processes)")
    from clusters.k3d.tasks import render as k3d_render

    loaded = load_scenario(_scenario_arg(scenario))
    raise Exit(code=k3d_render(out, loaded.build_topology(stack), loaded.name))


@task(help={"context": "kubectl context of the compute cluster", "domain": "workerCallbackProxy.workerDomain",
            "proxy_service": "NAME (namespace nvcf), NAME.NS.svc.cluster.local, or a DNS name",
            "proxy_address": "proxy load-balancer IP, when the Service must be created",
            "dry_run": "print what would be applied", "yes": "switch the kubectl context without asking"})
@user_errors
def dns_rewrite(c, context, domain, proxy_service="worker-callback-proxy", proxy_address=None,
                dry_run=False, yes=False):
    """Add the *.<workerDomain> CoreDNS rewrite (and the proxy's selectorless Service) to a compute cluster."""
    from clusters.k3d.tasks import dns_rewrite as run

    raise Exit(code=run(context, domain, proxy_service, dry_run, yes, proxy_address))


@task
@user_errors
def doctor(c):
    """What this laptop has and lacks for each backend (local, k3d), with the fix for each."""
    from clusters.k3d.tasks import doctor as run

    raise Exit(code=run())


@task(help={"quick": "short run (< 2 min): 2 warm runs, no catalogue, 1,000-callback scale run"})
def bench(c, quick=False):
    """Start-up, relays (vs direct, vs nginx), QUIC, scale, DNS (vs dnsmasq): docs/benchmarks.md and .json."""
    import bench as benchmarks  # the task's name shadows the package here

    raise Exit(code=benchmarks.run(quick))


@task(help={"k": "only tests matching this expression (pytest -k)", "long": "include long-running tests"})
def test(c, k=None, long=False):
    """Run the test suite (the same command CI runs)."""
    cmd = [sys.executable, "-m", "pytest", "-q"]
    if k:
        cmd += ["-k", k]
    if long:
        cmd += ["-m", "long or not long"]
    raise Exit(code=subprocess.call(cmd, cwd=ROOT, env={**os.environ}))
