"""Bring a customer's world up on the local backend and watch probe workers call back through it.

Each probe worker profile (worker-utils version and trust) gets a fresh stack of its own, so which worker
took which call is never in doubt: the customer's values, two invocation-service pods, one grpc-proxy pod
and one compute cluster whose only worker is that profile. Every callback it makes becomes an
Observation; scenarios.diagnose.judge turns them into findings. On a terminal a live line says which
probe runs; Ctrl-C or SIGTERM stops every probe stack, as `ncpsim up` stops its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from clusters.interrupts import InterruptGuard
from clusters.local import LocalBackend, zygote
from clusters.local.plan import NATS_CALLOUT
from scenarios.diagnose.judge import Observation
from scenarios.diagnose.plan import Probe
from scenarios.diagnose.profiles import BEFORE_PEM, Profile, parse_label
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.replay import Progress
from scenarios.result import ScenarioResult
from scenarios.secrets import with_brought_secrets
from scenarios.trace import CallTrace
from sim.errors import ConfigError
from sim.model.assumptions import Assumption
from sim.model.events import WORKER_NATS_CONNECTED, WORKER_NATS_REFUSED, of_kind, read_events
from sim.model.values import lookup

PARALLEL_PROBES = 2  # probe stacks at once: start-up is CPU-bound, and two cores are the common laptop floor
PROBE_TIMEOUT = (
    2.0  # seconds a probe call waits idle: a healthy callback takes milliseconds, a failed one is told
)
STOP_ROUND = 0.2  # seconds between sweeps of the probe stacks while interrupted probes wind down
STOP_WAIT = 60.0  # seconds an interrupted probe may take to wind down before its stack is purged anyway
FAILED = "Authentication failed"  # the callout's line for a refused login, with its reason


@dataclass(frozen=True)
class Probed:
    """What one probe stack showed: its callbacks, what it played in the customer's place, and whether
    every call of each function arrived."""

    observations: tuple[Observation, ...]
    assumed: tuple[Assumption, ...] = ()
    arrived: tuple[tuple[str, bool], ...] = ()  # (function, every call arrived)


def observe(
    probes: list[Probe],
    root: Path | None,
    scratch: Path,
    progress: TextIO | None = None,
    guard: InterruptGuard | None = None,
) -> list[Probed]:
    """Every probe's stack, PARALLEL_PROBES at a time (each is isolated: own ports, own state folder),
    so a diagnosis with its what-if probes costs about what two stacks cost one after the other. A
    `progress` terminal gets `[n/N] probe ...` as each starts (nothing when it is a pipe). `guard`: the
    command's (SIGTERM as Ctrl-C: both stop the probe stacks, issue 31)."""
    state = root or scratch / "state"
    guard = guard or InterruptGuard()
    backend = LocalBackend(state, guard)
    names = [f"diagnose-{n}" for n in range(len(probes))]
    shown = Progress(len(probes), progress, live_from=1) if progress is not None else None
    started, stopping, lock = iter(range(1, len(probes) + 1)), threading.Event(), threading.Lock()

    def run(name: str, probe: Probe) -> Probed:
        with lock:
            if stopping.is_set():
                return Probed(())
            if shown is not None:
                shown.show(next(started), describe(probe))
        return _probe(backend, scratch, name, probe)

    several = zygote.shared(state) if len(probes) > 1 else contextlib.nullcontext()
    with guard.installed(), several, ThreadPoolExecutor(PARALLEL_PROBES, thread_name_prefix="probe") as pool:
        futures: list[Future[Probed]] = []
        try:
            for name, probe in zip(names, probes, strict=True):
                futures.append(pool.submit(run, name, probe))
            return [future.result() for future in futures]
        except BaseException:
            with guard.held():  # a second Ctrl-C must not cut the stopping short
                with lock:
                    stopping.set()
                _stop_probes(pool, futures, backend, names)
            raise
        finally:
            if shown is not None:
                shown.clear()


def describe(probe: Probe) -> str:
    """The progress line's words for a probe: `probe worker-utils 1.4.0, system roots[, in gpu-1]`."""
    where = f", in compute cluster {probe.context}" if probe.context else ""
    return f"probe {parse_label(probe.label).describe()}{where}"


def _stop_probes(
    pool: ThreadPoolExecutor, futures: list[Future[Probed]], backend: LocalBackend, names: list[str]
) -> None:
    """Start no probe more; stop what the running ones started, round after round, until they have wound
    down (a probe thread may be starting a component as a round sweeps: the next round stops it); then
    stop and purge every probe stack, whatever is left in it."""
    pool.shutdown(wait=False, cancel_futures=True)
    rounds = int(STOP_WAIT / STOP_ROUND)
    while rounds and not all(f.done() for f in futures):
        for name in names:
            with contextlib.suppress(Exception):  # a stack half-started by its thread: the next round
                backend.attach(name).launcher.stop_all()
        wait(futures, timeout=STOP_ROUND)
        rounds -= 1
    for name in names:
        with contextlib.suppress(ConfigError):
            backend.attach(name).down(purge=True)


def _probe(backend: LocalBackend, scratch: Path, name: str, probe: Probe) -> Probed:
    profile = parse_label(probe.label)
    path = scratch / f"{name}.yaml"
    timeout = probe_timeout(os.getloadavg()[0], os.cpu_count() or 1)
    path.write_text(yaml.safe_dump(probe_scenario(probe, profile, timeout), sort_keys=False))
    scenario = with_brought_secrets(load_scenario(str(path)), list(probe.brought))  # the customer's own certs
    stack = backend.attach(name)
    try:
        result = run_scenario(scenario, backend, name, keep=False)
        events = read_events(stack.state_dir)
        # a login refused once and then accepted (timed out on a busy machine) explains nothing
        signed_in = {e.get("worker") for e in of_kind(events, WORKER_NATS_CONNECTED)}
        refused = [e for e in of_kind(events, WORKER_NATS_REFUSED) if e.get("worker") not in signed_in]
        seen = observations_of(result, profile, refused, callout_refusals(stack.logs().get(NATS_CALLOUT)))
        return Probed(tuple(seen), tuple(result.assumptions), arrived(result))
    finally:
        # A start that failed has stopped what it started, and may leave no stack folder to purge: its own
        # error is the one to report (the scratch folder goes with the diagnosis).
        with contextlib.suppress(ConfigError):
            stack.down(purge=True)


def arrived(result: ScenarioResult) -> tuple[tuple[str, bool], ...]:
    """(function, every call of it arrived) for each function the probe called."""
    found: dict[str, bool] = {}
    for trace in (t for step in result.steps for t in step.traces):
        found[trace.function] = found.get(trace.function, True) and trace.outcome == "success"
    return tuple(found.items())


def callout_refusals(log: str | None) -> list[str]:
    """The auth callout's "Authentication failed" lines (from its log file): its reason, which nats-server
    does not pass on to the client (the worker only sees 'Authorization Violation')."""
    if log is None or not Path(log).exists():
        return []
    lines = Path(log).read_text(errors="replace").splitlines()
    return [line[line.index(FAILED) :].strip() for line in lines if FAILED in line]


def probe_timeout(load: float, cores: int) -> float:
    """PROBE_TIMEOUT stretched by the machine's load (its run queue per core, never below 1): at load 10 on
    two cores a healthy gRPC probe ran past 2 s (DEADLINE_EXCEEDED), and the diagnosis named a pod-unreachable
    that was not there. A diagnosis names only what it saw; idle, nothing changes."""
    return PROBE_TIMEOUT * max(1.0, load / max(cores, 1))


def probe_scenario(probe: Probe, profile: Profile, timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
    grpc = lookup(probe.values, ("workerCallbackProxy", "enabled"), False)  # gRPC needs the proxy's H3 front
    call = {"count": 1, "timeout": round(timeout, 1)}
    functions = ("http-echo", "grpc-echo") if grpc else ("http-echo",)
    steps = [
        {
            "name": f"{'HTTP' if function == 'http-echo' else 'gRPC'} callback",
            "invoke": {"function": function, **call},
            "expect": {"outcome": "success"},
        }
        for function in functions
    ]
    return {
        "name": f"diagnose-{profile.worker_utils.replace('.', '-')}-{profile.trust}",
        "summary": "a customer's values, probed by one worker profile",
        "seed": 1,
        "values": probe.values,
        "topology": {
            "invocationReplicas": 2,
            "grpcProxyReplicas": 1 if grpc else 0,
            "computeClusters": [{"workers": [profile.worker_group(1)], **probe.cluster}],
            **({"secrets": probe.secrets} if probe.secrets else {}),
        },
        "steps": steps,
    }


def observations_of(
    result: ScenarioResult,
    profile: Profile,
    refused: Sequence[dict[str, Any]] = (),
    callout: Sequence[str] = (),
) -> list[Observation]:
    """Each call's observation; a worker that NATS refused never took work, so the calls it never took
    are explained by the refusal (its error as the callout and the server gave it), not by a timeout."""
    if result.error and not result.steps:
        return [Observation(profile.label, "-", False, "stack", result.error)]
    traces = [t for step in result.steps for t in step.traces]
    if refused:
        first = refused[0]
        nats = Observation(
            profile.label,
            ",".join(first.get("functions", [])),
            False,
            "nats",
            f"NATS sign-in refused ({first.get('credentials')}): {first.get('error')}"
            + (f"; auth callout log: {callout[0]}" if callout else ""),
        )
        return [nats] + [observation(t, profile) for t in traces if t.worker is not None]
    return [observation(t, profile) for t in traces]


def observation(t: CallTrace, profile: Profile) -> Observation:
    ok = t.outcome == "success"
    proxy = tuple((int(r.get("status", 0) or 0), str(r.get("flags", "-"))) for r in t.proxy)
    rcode = (t.dns or {}).get("rcode")
    return Observation(
        profile.label,
        t.function,
        ok,
        None if ok else t.worker_stage,
        None if ok else t.error,
        rcode if rcode and rcode != "NOERROR" else None,
        tuple(t.worker_statuses),
        proxy,
        BEFORE_PEM in profile.flags,
    )
