"""`ncpsim bench [--quick]`: every measurement in turn, then docs/benchmarks.json and docs/benchmarks.md.

Each section runs on its own and records an error instead of ending the run. Everything the benchmark
starts lives under one temporary NCPSIM_HOME; at the end (also on an error, Ctrl-C or SIGTERM) every
stack found there is stopped, and nginx and dnsmasq are stopped by their own `with` blocks.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import (
    as_filed,
    calibration,
    dnsload,
    machine,
    peers,
    quic,
    redelivery,
    relay,
    report,
    scale,
    startup,
)
from bench.stacks import running, topology, unique_name
from bench.targets import judge
from clusters.local import LocalStack
from clusters.state import state_root

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


@dataclass(frozen=True)
class Plan:
    startup_runs: int
    catalogue: bool
    catalogue_timeout: float
    keepalive_calls: int
    newconn_calls: int
    quic_calls: int
    scale_clusters: int
    scale_workers: int
    scale_callbacks: int
    scale_concurrency: int
    scale_deadline: float  # seconds of driving; past it no new invocations start
    dns_queries: int
    dns_seconds: float
    redelivery_invocations: int
    # Rounds of `up` in turns with the tree as filed. Its first callback and this checkout's are under a tenth
    # apart, and one round's ratio moves by as much on 2 cores: five rounds read 0.94 in one run and 1.00 in
    # the next, ten alternated by hand 0.91 and 0.92.
    as_filed_rounds: int


# The full run's scale is issue 17's fleet (10 compute clusters, 10,000 workers, 100,000 callbacks); past
# its 300 s target no new invocation starts, so a miss shows as "deadline hit", not as an endless run.
FULL = Plan(5, True, 150.0, 1000, 600, 200, 10, 10_000, 100_000, 256, 300.0, 100_000, 10.0, 1000, 10)
QUICK = Plan(2, False, 0.0, 300, 200, 50, 5, 500, 1000, 64, 30.0, 20_000, 5.0, 200, 2)


SECTIONS = (
    "startup",
    "catalogue",
    "as_filed",
    "relay",
    "dns",
    "quic",
    "scale",
    "redelivery",
)  # in the order they run


def _section(name: str, logs: Path, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    where = f"[{SECTIONS.index(name) + 1}/{len(SECTIONS)}] {name}"
    print(f"bench: {where} ...", file=sys.stderr, flush=True)
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - one failed measurement must not cost the others
        (logs / f"{name}.error.txt").write_text(traceback.format_exc())
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["section_seconds"] = round(time.perf_counter() - started, 1)
    print(f"bench: {where} ({result['section_seconds']} s)", file=sys.stderr, flush=True)
    return result


def _startup(plan: Plan, root: Path, logs: Path) -> dict[str, Any]:
    return {
        kind: startup.time_to_first_callback(f"{kind}-callback", plan.startup_runs, root / "up", logs)
        for kind in ("http", "grpc")
    }


def _as_filed(plan: Plan, root: Path, logs: Path) -> dict[str, Any]:
    """The tree as issue 32 found it (bench.as_filed), timed in the same run: its start-up in turns with this
    checkout's, and in a full run its own catalogue. A clone without that commit skips it, and says so."""
    try:
        with as_filed.exported(REPO, root / "as-filed-tree") as tree:
            out: dict[str, Any] = {"commit": as_filed.COMMIT}
            out["startup"] = {
                kind: startup.against(
                    tree, f"{kind}-callback", plan.as_filed_rounds, root / "as-filed-up", logs
                )
                for kind in ("http", "grpc")
            }
            if plan.catalogue:
                out["catalogue"] = startup.replay_tree(
                    tree, root / "as-filed-replay", logs, plan.catalogue_timeout
                )
            return out
    except as_filed.ExportFailed as exc:
        return {"skipped": f"the tree as filed ({as_filed.COMMIT}) was not timed: {exc}"}


def _relay_and_dns(
    plan: Plan, root: Path, logs: Path, absent: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keep-alive, new-connection and DNS measurements share one stack (one pod, no workers).
    A comparison whose peer (`absent`: nginx, dnsmasq) is not installed is recorded as skipped."""
    with running(root / "relay", topology(unique_name("relay"), invocation=1, clusters=1)) as bench:
        if "nginx" in absent:  # the keep-alive comparison needs no peer: it still runs
            relayed = _section(
                "relay",
                logs,
                lambda: {
                    "keepalive": asyncio.run(relay.keepalive(bench, plan.keepalive_calls)),
                    "new_connection": peers.skipped("nginx"),
                },
            )
        else:
            relayed = _section(
                "relay",
                logs,
                lambda: asyncio.run(
                    relay.measure(bench, plan.keepalive_calls, plan.newconn_calls, root / "nginx")
                ),
            )
        dns = (
            peers.skipped("dnsmasq")
            if "dnsmasq" in absent
            else _section(
                "dns",
                logs,
                lambda: dnsload.measure(bench, root / "dnsmasq", plan.dns_queries, plan.dns_seconds),
            )
        )
    return relayed, dns


@contextlib.contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every `finally` stops what it started."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_everything(root: Path) -> None:
    for state in root.rglob("netmap.json"):
        LocalStack(state.parent.name, root=state.parent.parent).down()


def _calibrate(results: dict[str, Any], when: str) -> None:
    """The yardstick (bench.calibration), at the start or the end of the run; a failure costs only it."""
    print(f"bench: calibration at the {when} ...", file=sys.stderr, flush=True)
    into = results.setdefault("calibration", {})
    try:
        into[when] = calibration.measure()
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        into[when] = {"failed": f"{type(exc).__name__}: {exc}"}


def measure_all(plan: Plan, root: Path, absent: frozenset[str] = frozenset()) -> dict[str, Any]:
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine.describe()}
    _calibrate(results, "start")
    results["startup"] = _section("startup", logs, lambda: _startup(plan, root, logs))
    results["catalogue"] = (
        _section("catalogue", logs, lambda: startup.catalogue(root, logs, plan.catalogue_timeout))
        if plan.catalogue
        else {"skipped": True}
    )
    results["as_filed"] = _section("as_filed", logs, lambda: _as_filed(plan, root, logs))
    results["relay"], results["dns"] = _relay_and_dns(plan, root, logs, absent)
    results["quic"] = _section("quic", logs, lambda: quic.measure(root / "quic", plan.quic_calls))
    results["scale"] = _section(
        "scale",
        logs,
        lambda: scale.measure(
            root / "scale",
            plan.scale_clusters,
            plan.scale_workers,
            plan.scale_callbacks,
            plan.scale_concurrency,
            plan.scale_deadline,
        ),
    )
    results["redelivery"] = _section(
        "redelivery", logs, lambda: redelivery.run(plan.redelivery_invocations, root=root / "redelivery")
    )
    _calibrate(results, "end")
    results["machine"]["load_average_end"] = machine.load_average()
    results["machine"]["cpu_busy_end"] = machine.cpu_busy()
    return results


def _busy_note(facts: dict[str, Any]) -> str:
    """Say so when the machine was busy with other work: the rates then understate what ncpsim does."""
    busy = [b for b in (facts.get("cpu_busy_start"), facts.get("cpu_busy_end")) if b is not None]
    if not busy or max(busy) < 0.25:
        return ""
    return (
        f"other work was running on this machine ({max(busy):.0%} of the CPUs busy before or after "
        "the run): rates are lower and noisier than on an idle machine; CPU time per operation is the "
        "steadier figure"
    )


def skipped_comparisons(results: dict[str, Any]) -> list[str]:
    """Why each comparison that did not run was skipped (a missing peer), from anywhere in the results."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("skipped"), str):
                found.append(node["skipped"])
            for value in node.values():
                walk(value)

    walk(results)
    return found


def run(
    quick: bool = False,
    out_dir: Path | None = None,
    note: str = "",
    install_peers: bool = False,
    update_docs: bool = False,
    check: bool = False,
) -> int:
    """Measure, write the JSON and the Markdown table into `out_dir` (docs/ with `update_docs`, where the
    committed figures live); 1 only with `check` when a target is missed, or when a section failed.

    The peers (nginx, dnsmasq) are checked first; a missing one's comparison is skipped, not failed."""
    out_dir = DOCS if update_docs else out_dir or state_root() / "bench"
    plan = QUICK if quick else FULL
    absent = peers.check(install_peers)
    # The warm runs measure what a user's second `ncpsim up` does: modules already byte-compiled, which
    # Python does on first import unless PYTHONDONTWRITEBYTECODE is set (as on some CI images).
    for package in ("tasks", "sim", "scenarios", "clusters", "dns", "certs"):  # tasks: the command line
        compileall.compile_dir(REPO / package, quiet=1)
    root = Path(tempfile.mkdtemp(prefix="ncpsim-bench-"))
    started = time.perf_counter()
    results: dict[str, Any] = {}
    try:
        with _terminated_as_interrupt():
            results = measure_all(plan, root, absent)
    finally:
        _stop_everything(root)
    results["parameters"] = asdict(plan) | {
        "quick": quick,
        "newconn_lanes": relay.NEW_CONN_LANES,
        "dns_window": dnsload.WINDOW,
        "dns_mix": dnsload.MIX,
    }
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    note = note or os.environ.get("NCPSIM_BENCH_NOTE", "") or _busy_note(results["machine"])
    if note:
        results["machine"]["note"] = note
    report.write(results, out_dir, "ncpsim bench --quick" if quick else "ncpsim bench")
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("error")]
    if failed:
        print(f"bench: sections failed: {', '.join(failed)}; logs kept in {root / 'logs'}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    rows = judge(results)
    for row in rows:
        print(f"{row.verdict:>7}  {row.figure}: {row.measured} (target {row.target})")
    for why in skipped_comparisons(results):
        print(f"skipped  {why}")
    print(f"bench: {results['total_seconds']} s; wrote {out_dir / 'benchmarks.md'} and benchmarks.json")
    missed = check and any(r.met is False for r in rows)
    return 1 if failed or missed else 0
