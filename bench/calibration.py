"""A yardstick measured in the same run, so that figures travel between machines.

Seconds do not travel: the same tree took 0.44 s to its first callback on one 2-core machine and 1.51 s
on another, where a bare Python loop also ran 5x slower. So every run times two fixed pieces of work
and reports each absolute time also as a multiple of them:
- the loop: `for i in range(10_000_000): pass` in a fresh interpreter, timed inside it (CPU-bound
  Python, the kind of work the components do per request);
- the start: `python -c pass`, spawn to exit (interpreter start and site imports, what every component
  and `ncpsim up` pay before their own work).
Each is the best of a few runs (a burst of other work spoils one run, not the best), taken at the start
and at the end of the run; the units use the best of both, and the report says when the two disagree
by more than DRIFT (the machine's speed moved during the run, so the units are rougher).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

LOOP = "for i in range(10_000_000): pass"
LOOP_RUNS = 3
START_RUNS = 5
DRIFT = 0.15
RUN_TIMEOUT = 120.0  # a loop of 0.3-1.5 s on the machines seen so far; this only bounds a stuck one
TIMED_LOOP = f"import time\nt = time.perf_counter()\n{LOOP}\nprint(time.perf_counter() - t)"


def _run(python: str, code: str) -> str:
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True, timeout=RUN_TIMEOUT
    ).stdout


def measure(
    python: str = sys.executable,
    timed_loop: str = TIMED_LOOP,
    loop_runs: int = LOOP_RUNS,
    start_runs: int = START_RUNS,
) -> dict[str, Any]:
    """Time the loop (`timed_loop` prints its own seconds) and `python -c pass` (as the caller sees it)."""
    loops = [float(_run(python, timed_loop)) for _ in range(loop_runs)]
    starts = []
    for _ in range(start_runs):
        began = time.perf_counter()
        _run(python, "pass")
        starts.append(time.perf_counter() - began)
    return {"loop_runs": [round(x, 4) for x in loops], "start_runs": [round(x, 4) for x in starts]}


@dataclass(frozen=True)
class Yardstick:
    loop: float  # seconds: the best loop of the run
    start: float  # seconds: the best `python -c pass` of the run
    drift: float | None  # the loop's best at the end over its best at the start, minus 1 (None: one end only)

    def loops(self, seconds: float) -> float:
        return seconds / self.loop

    def starts(self, seconds: float) -> float:
        return seconds / self.start

    def text(self, seconds: float) -> str:
        return f"{amount(self.loops(seconds))} loops, {amount(self.starts(seconds))} starts"


def amount(units: float) -> str:
    """Three significant figures: 1500, 27.5, 1.4, 0.00283; in exponent form only below 0.001 (2.83e-05)."""
    return f"{units:.0f}" if units >= 100 else f"{units:.3g}" if units >= 0.001 else f"{units:.2e}"


def yardstick(results: dict[str, Any]) -> Yardstick | None:
    """The run's units from `results["calibration"]` ({"start": measure(), "end": measure()}); None when
    neither end was measured."""
    ends = [
        e for e in (results.get("calibration") or {}).values() if isinstance(e, dict) and e.get("loop_runs")
    ]
    if not ends:
        return None
    loops = [min(e["loop_runs"]) for e in ends]
    drift = loops[-1] / loops[0] - 1 if len(ends) == 2 else None
    return Yardstick(min(loops), min(min(e["start_runs"]) for e in ends), drift)


def describe(stick: Yardstick) -> str:
    """One line: what the units are, and whether the machine's speed held through the run."""
    line = (
        f"1 loop = {stick.loop:.3f} s (`{LOOP}` in a fresh interpreter, best of {LOOP_RUNS}); "
        f"1 start = {stick.start * 1000:.1f} ms (`python -c pass`, best of {START_RUNS}); "
        "each at the start and at the end of the run, the best of both"
    )
    if stick.drift is not None and abs(stick.drift) > DRIFT:
        line += (
            f". The loop took {stick.drift:+.0%} at the end against the start: the machine's speed moved "
            "during the run, so figures in these units are rougher than usual"
        )
    return line


def _get(results: dict[str, Any], *path: str) -> Any:
    node: Any = results
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _per(rate: Any) -> float | None:
    return 1 / rate if isinstance(rate, int | float) and rate > 0 else None


def absolute_times(results: dict[str, Any]) -> list[tuple[str, float]]:
    """Every absolute time in the results, in seconds, with what it is (pure; absent figures left out).

    Rates appear as the time of one operation (1/rate), CPU per operation as it is."""
    found: list[tuple[str, Any]] = []
    for kind, label in (("http", "HTTP"), ("grpc", "gRPC")):
        found += [
            (
                f"`ncpsim up` to first {label} callback, median of warm runs",
                _get(results, "startup", kind, "median"),
            ),
            (f"`ncpsim up` to first {label} callback, cold", _get(results, "startup", kind, "cold_seconds")),
            (
                f"`ncpsim up` {label}: CPU of the command line and its zygote, median of warm runs",
                _get(results, "startup", kind, "cli_cpu_median"),
            ),
        ]
        for phase, at in (_get(results, "startup", kind, "phases") or {}).items():
            found.append((f"`ncpsim up` {label}: {phase.replace('_', ' ')}", at))
    found.append(("catalogue replay", _get(results, "catalogue", "seconds")))
    found.append(("catalogue as filed (60 scenarios)", _get(results, "catalogue", "as_filed", "seconds")))
    for kind, label in (("keepalive", "keep-alive"), ("new_connection", "new-TLS-connection")):
        for route, r in (_get(results, "relay", kind) or {}).items():
            if isinstance(r, dict) and "per_second" in r:
                found.append((f"{label} callback via {route} (1/rate)", _per(r["per_second"])))
                if "relay_cpu_ms_per_call" in r:
                    found.append(
                        (f"{label} relay CPU per callback, {route}", r["relay_cpu_ms_per_call"] / 1000)
                    )
    for server in ("resolver", "dnsmasq"):
        if (us := _get(results, "dns", server, "server_cpu_us_per_query")) is not None:
            found.append((f"DNS server CPU per query, {server}", us / 1e6))
        found.append((f"DNS query via {server} (1/rate)", _per(_get(results, "dns", server, "per_second"))))
    found += [
        (
            "gRPC unary call via the proxy (1/rate)",
            _per(_get(results, "quic", "via_proxy", "unary", "per_second")),
        ),
        ("scale: up", _get(results, "scale", "up_seconds")),
        ("scale: callbacks", _get(results, "scale", "seconds")),
        ("scale: wall time (up + callbacks)", _get(results, "scale", "wall_seconds")),
        ("whole bench run", results.get("total_seconds")),
    ]
    return [(label, float(s)) for label, s in found if isinstance(s, int | float)]


def seconds_text(seconds: float) -> str:
    if seconds >= 0.1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"
