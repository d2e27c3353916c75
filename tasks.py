"""ncpsim's command line: `invoke up scenario=grpc-callback`, `invoke down`, `invoke status --json`, ...

Thin tasks: each parses its arguments, calls into the packages, and turns a user mistake
(NcpsimError) into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invoke import Exit, Task, task

ROOT = Path(__file__).resolve().parent
EXIT_FAILED, EXIT_USAGE = 1, 2


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map ncpsim's user-facing errors to a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from sim.errors import NcpsimError

        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows here, where it is handled, not at exit as a traceback
            return result
        except NcpsimError as exc:
            raise Exit(f"ncpsim: {exc}", code=EXIT_USAGE) from None
        except BrokenPipeError:  # `invoke scenarios | head`: the reader has all it wanted
            _quiet_stdout()
            raise Exit(code=0) from None
        except KeyboardInterrupt:
            raise Exit("ncpsim: interrupted; the processes started so far were stopped", code=130) from None

    return wrapper


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so nothing more is written to the closed pipe, even at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _closed_pipe_is_quiet(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """invoke's own output (`invoke --list | head`, `invoke replay --help | head`) meets a closed pipe too."""
    if issubclass(kind, BrokenPipeError):
        _quiet_stdout()
        return
    _default_excepthook(kind, exc, tb)


_default_excepthook, sys.excepthook = sys.excepthook, _closed_pipe_is_quiet


def _scenario_arg(scenario: str | None, usage: str = "invoke up scenario=grpc-callback") -> str:
    """Accept `scenario=NAME` (a positional word), `NAME`, and `--scenario NAME` alike."""
    value = (scenario or "").strip()
    value = value.removeprefix("scenario=")
    if not value:
        from sim.errors import ScenarioError

        raise ScenarioError(f"name a scenario: {usage} (see `invoke scenarios`)")
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


def _state_folder(stack: str) -> Path:
    """The stack's folder, created (with its marker) for a task that writes there without bringing it up."""
    from clusters.state import create_stack_dir, state_dir

    folder = state_dir(stack)
    create_stack_dir(folder)
    return folder


def _whole_number(flag: str, text: Any) -> int:
    from sim.errors import ConfigError

    try:
        value = int(str(text).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{flag} {text!r}: give a whole number, e.g. {flag} 100")
    return value


def _out_file(flag: str, out: str) -> Path:
    """A file to write: not a folder, with no file where a folder of its path should be."""
    from sim.errors import ConfigError

    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"{flag} {out}: is a folder; name a file to write")
    _out_folder(str(path.parent), flag=flag, shown=out)
    return path


def _out_folder(out: str, flag: str = "--out", shown: str | None = None) -> Path:
    """`--out DIR`: a folder, or a path where one can be made; a file on the way is one line, not a traceback."""
    from sim.errors import ConfigError

    folder = Path(out)
    for place in (folder, *folder.parents):
        if place.exists() or place.is_symlink():
            if not place.is_dir():
                raise ConfigError(
                    f"{flag} {shown or out}: {place} is a file, not a folder; name a folder to write into"
                )
            break
    return folder


def _bare_words(fn: Callable[..., Any], name: str) -> int:
    """How many bare words follow task `name` on this command line (flag values are not bare words)."""
    takes_value = {
        alias.replace("-", "_"): arg.takes_value
        for arg in Task(fn, positional=[]).get_arguments()
        for alias in arg.names
    }
    if name not in sys.argv[1:]:
        return 0
    words, skip = 0, False
    for token in sys.argv[sys.argv.index(name, 1) + 1 :]:
        if skip:
            skip = False
        elif token.startswith("-"):
            flag = token.lstrip("-")
            skip = "=" not in flag and takes_value.get(flag.replace("-", "_"), False)
        else:
            words += 1
    return words


def optional_positional(*names: str, more: str | None = None, **task_options: Any) -> Callable[..., Task]:
    """@task whose positional arguments may be left out, which invoke itself does not allow.

    Each name is positional only when the command line holds a bare word for it, so `invoke up`,
    `invoke up NAME` and `invoke up --help` all parse. With `more`, the last name takes every further
    word too (`invoke set a=1 b=2`): invoke reads a task's signature, so they become parameters.
    """

    def decorate(fn: Callable[..., Any]) -> Task:
        given = _bare_words(fn, task_options.get("name") or fn.__name__.strip("_"))
        body = fn
        if more and given > len(names):
            body = _taking_more(fn, more, given - len(names) + 1)
        extra = [f"{more}_{n}" for n in range(2, given - len(names) + 2)] if more else []
        return task(positional=[*names, *extra][:given], **task_options)(body)

    return decorate


def _taking_more(fn: Callable[..., Any], name: str, count: int) -> Callable[..., Any]:
    """`fn` with `count` words for parameter `name` (a list): parameters name_2..name_N gather them."""
    signature = inspect.signature(fn)
    extra = [
        inspect.Parameter(f"{name}_{n}", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
        for n in range(2, count + 1)
    ]

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        words = [kwargs.pop(f"{name}_{n}", None) for n in range(2, count + 1)]
        kwargs[name] = [kwargs.get(name), *words]
        return fn(*args, **kwargs)

    body.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *extra]
    )
    return body


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

    chosen = _backend(backend)
    files, sets = [Path(f) for f in file or []], set_ or []
    # No scenario: the default topology, idle (a dev environment to poke with call, fault, set, ...).
    loaded = (
        load_scenario(_scenario_arg(scenario), files, sets=sets) if scenario else idle_scenario(files, sets)
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


@task(
    help={
        "purge": "also delete the state folder (certificates, logs, events)",
        "stack": "stack name",
        "backend": "local or k3d",
    }
)
@user_errors
def down(c, purge=False, stack="default", backend="local"):
    """Stop every process of the stack (by process group); --purge removes its state folder."""
    target = _stack(stack, backend)
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
        40 if lines is None else _whole_number("--lines", lines)
    )  # text: invoke's own int() would traceback
    known = _stack(stack, backend).logs()
    paths = [Path(p) for p in known.values()]
    if component and component != "all":
        paths = [Path(known[component])] if component in known else []
        if not paths:
            raise ConfigError(f"no log for {component!r}; known: {', '.join(known) or 'none'}")
    for path in paths:
        text = path.read_text(errors="replace").splitlines()[-count:] if count else []
        print(f"==> {path} <==")
        print("\n".join(text))


@task(help={"stack": "stack name"})
@user_errors
def certs(c, stack="default"):
    """Print each CA's path, SHA-256 fingerprint and expiry (creating the CAs if the stack has none yet)."""
    from certs.store import CertStore, describe_text

    store = CertStore(_state_folder(stack) / "certs")
    store.ensure_cas()
    print(describe_text(store.describe()))


@task
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
    },
    iterable=["file", "set_"],
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
):
    """Replay scenarios, each on a fresh stack; exit 1 if any expectation fails.

    invoke replay NAME|scenario=NAME [--stack S] | --all [-j N|auto] [--junit FILE] [--keep]
    """
    from scenarios.replay import jobs_arg, replay_many

    names = None if all_ else [_scenario_arg(scenario, "invoke replay scenario=grpc-callback, or --all")]
    if junit:  # checked first: a folder or a file in the way must not cost a whole replay, then a traceback
        _out_file("--junit", junit)
    ok = replay_many(
        names,
        values_file=[Path(f) for f in file or []],
        sets=set_ or [],
        junit=Path(junit) if junit else None,
        keep=keep,
        as_json=json_,
        stack=stack,
        jobs=jobs_arg(jobs),
    )
    if not ok:
        raise Exit(code=EXIT_FAILED)


@task(
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

    loaded = load_scenario(_scenario_arg(scenario))
    _state_folder(
        stack
    )  # the certificates are kept there: an unusable NCPSIM_HOME is one line, not a traceback
    try:
        code = k3d_render(_out_folder(out), loaded.build_topology(stack), loaded.name)
    except OSError as exc:  # a full disk, a read-only folder: name the file, no traceback
        raise ConfigError(
            f"--out {out}: cannot write {exc.filename or out} ({exc.strerror or exc}); "
            f"name a folder you can write"
        ) from None
    raise Exit(code=code)


@task(
    help={
        "context": "kubectl context of the compute cluster",
        "domain": "workerCallbackProxy.workerDomain",
        "proxy_service": "NAME (namespace nvcf), NAME.NS.svc.cluster.local, or a DNS name",
        "proxy_address": "proxy load-balancer IP, when the Service must be created",
        "dry_run": "print what would be applied",
        "yes": "switch the kubectl context without asking",
    }
)
@user_errors
def dns_rewrite(
    c, context, domain, proxy_service="worker-callback-proxy", proxy_address=None, dry_run=False, yes=False
):
    """Add the *.<workerDomain> CoreDNS rewrite (and the proxy's selectorless Service) to a compute cluster."""
    from clusters.k3d.tasks import dns_rewrite as run

    raise Exit(code=run(context, domain, proxy_service, dry_run, yes, proxy_address))


@task
@user_errors
def doctor(c):
    """What this laptop has and lacks for each backend (local, k3d), with the fix for each."""
    from clusters.k3d.tasks import doctor as run

    raise Exit(code=run())


# -- a dev environment: one scenario step at a time on the running stack (scenarios/devenv.py) ---------------
def _run_steps(
    stack_name: str,
    backend: str,
    steps: list[dict[str, Any]],
    source: str,
    json_: bool = False,
    origin: dict[str, tuple[str, int]] | None = None,
) -> None:
    from scenarios.devenv import run_steps, session_json, session_text

    session = run_steps(_stack(stack_name, backend), steps, Path(source), origin)
    print(session_json(session) if json_ else session_text(session).rstrip("\n"))
    if not session.ok:
        raise Exit(code=EXIT_FAILED)


_ON_STACK = {"stack": "stack name (default: default)", "backend": "local or k3d"}


@task(
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

    _run_steps(stack, backend, [call_step(function, int(count))], "invoke call", json_)


@optional_positional(
    "action",
    "target",
    help={
        "action": "kill, restart, stop, start (a component), scale (ROLE=N), link (FROM_CLUSTER), "
        "clear-links, expire (frontend|public-frontend|invocation|grpc-proxy)",
        "target": "what the action acts on (see `invoke status` for component names)",
        "to": "link: the address or CIDR the cluster's dials go to (default: the proxy's load balancer)",
        "latency_ms": "link: added latency",
        "drop": "link: share of connections (and of requests on kept-alive ones) lost (0..1)",
        "timeout_ms": "link: how long a lost connection hangs",
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
    stack="default",
    backend="local",
):
    """Inject a fault into the running stack.

    invoke fault kill|restart|stop|start COMPONENT, fault scale ROLE=N (e.g. invocation=1),
    fault link CLUSTER [--to CIDR] [--latency-ms N] [--drop P] [--timeout-ms N], fault clear-links,
    fault expire frontend|public-frontend|invocation|grpc-proxy
    """
    from scenarios.devenv import fault_step, link_target
    from sim.errors import ConfigError

    if not action:
        raise ConfigError("fault: name an action, e.g. invoke fault kill invocation-service-0 (see --help)")
    if action == "link":
        to = link_target(_stack(stack, backend), to)
    step = fault_step(action, target, to, int(latency_ms), float(drop), int(timeout_ms))
    _run_steps(stack, backend, [step], "invoke fault")


@task(positional=["kind"], help={"kind": "frontend, pod-certs, stack-ca or public-ca", **_ON_STACK})
@user_errors
def rotate(c, kind, stack="default", backend="local"):
    """Rotate certificates on the running stack, as the runbook does; calls keep working throughout."""
    from scenarios.devenv import rotate_step

    _run_steps(stack, backend, [rotate_step(kind)], "invoke rotate")


@optional_positional(
    "assignment",
    more="assignment",
    name="set",
    help={
        "assignment": "key.path=value (YAML-typed: true, 3, null); several may follow",
        "redeploy": "then replace workers, proxy, pods or all, as a rollout would",
        **_ON_STACK,
    },
)
@user_errors
def set_(c, assignment=None, redeploy=None, stack="default", backend="local"):
    """Change values on the running stack (running pods keep theirs until --redeploy replaces them).

    invoke set key.path=value [key.path=value ...] [--redeploy workers|proxy|pods|all]
    """
    from scenarios.devenv import set_step, unknown_key_warnings

    assignments = assignment if isinstance(assignment, list) else [assignment] if assignment else []
    step = set_step(assignments, redeploy)
    for warning in unknown_key_warnings(step):  # the real chart is silent about them; the warning is the clue
        print(f"warning: {warning}", file=sys.stderr)
    _run_steps(stack, backend, [step], "invoke set")


@task(
    positional=["file"], help={"file": "a YAML step (or `steps: [...]`), `-` for standard input", **_ON_STACK}
)
@user_errors
def step(c, file, stack="default", backend="local"):
    """Run any scenario step on the running stack, with its expectations checked; exit 1 if one fails."""
    from scenarios.devenv import steps_from_file

    steps, path, origin = steps_from_file(file, _stack(stack, backend).state_dir)
    _run_steps(stack, backend, steps, str(path), origin=origin)


@task(help=_ON_STACK)
@user_errors
def watch(c, stack="default", backend="local"):
    """Callbacks as they cross the running stack: a live table on a terminal, plain lines otherwise."""
    from scenarios.devenv import require_running
    from scenarios.watch import watch as show

    running = _stack(stack, backend)
    require_running(running)

    def still_up() -> bool:
        try:
            return running.status() is not None
        except (OSError, ValueError):  # caught while `invoke down` removes its files: look again next time
            return True

    show(running.state_dir, sys.stdout, still_up)


@task(
    help={
        "file": "a customer's values file (repeat: later files win)",
        "set": "key.path=value (repeatable)",
        "symptom": "what a worker or client logged, e.g. 'x509: certificate signed by unknown authority'",
        "workers": "probe workers as VERSION:TRUST,..., e.g. 1.2.9:system,1.4.0:stack",
        "json": "print the findings as JSON",
        "write_ticket": "write a scenario reproducing the top finding (and its values beside it)",
        "rewrite": "what the compute cluster's DNS holds: DOMAIN=TARGET (proxy, none or an IPv4 address)",
        "secret": "NAME=DIR: the customer's Secret NAME (tls.crt, tls.key[, ca.crt]) as they have it",
    },
    iterable=["file", "set", "secret"],
)
@user_errors
def diagnose(
    c,
    file=None,
    set=None,
    symptom=None,
    workers=None,
    json_=False,
    write_ticket=None,
    rewrite=None,
    secret=None,
):
    """Bring the customer's values up on the local backend, probe them, and rank the documented causes."""
    from scenarios.diagnose.probe import diagnose as run
    from scenarios.diagnose.probe import text
    from scenarios.diagnose.probe import write_ticket as write
    from sim.errors import ConfigError

    if not file and not set:
        raise ConfigError("give the customer's values: invoke diagnose -f values.yaml [--symptom TEXT]")
    if write_ticket:
        _out_file("--write-ticket", write_ticket)
    found = run(
        [Path(f) for f in file or []], set or [], symptom, workers, rewrite=rewrite, secrets=secret or []
    )
    print(json.dumps(found.to_json(), indent=2) if json_ else text(found))
    if write_ticket and found.findings:
        written = write(found, Path(write_ticket))
        print(
            f"ticket: {written[0]} (values: {written[1]}); replay it: invoke replay scenario={written[0]}",
            file=sys.stderr if json_ else sys.stdout,
        )
    if found.findings:
        raise Exit(code=EXIT_FAILED)


@task(
    help={
        "quick": "short run (< 2 min): 2 warm runs, no catalogue, 1,000-callback scale run",
        "install_peers": "install nginx and dnsmasq first if missing (apt-get or brew); without them, "
        "their comparisons are skipped",
    }
)
def bench(c, quick=False, install_peers=False):
    """Start-up, relays (vs direct, vs nginx), QUIC, scale, DNS (vs dnsmasq): docs/benchmarks.md and .json."""
    import bench as benchmarks  # the task's name shadows the package here

    raise Exit(code=benchmarks.run(quick, install_peers=install_peers))


@task(help={"k": "only tests matching this expression (pytest -k)", "long": "include long-running tests"})
def test(c, k=None, long=False):
    """Run the test suite (the same command CI runs)."""
    cmd = [sys.executable, "-m", "pytest", "-q"]
    if k:
        cmd += ["-k", k]
    if long:
        cmd += ["-m", "long or not long"]
    raise Exit(code=subprocess.call(cmd, cwd=ROOT, env={**os.environ}))
