"""How long a user waits: `ncpsim up` to the first callback, and the whole catalogue's `ncpsim replay --all`.

The clock starts when the `ncpsim up` process is spawned (interpreter start-up and imports count, as
they do for a user) and stops at the `ts` of the first `worker.callback.result` event with ok=true in
<state>/events/*.jsonl. Each run also reports the CPU-seconds of the command line and of the launch's
zygote it waits for (not the components): a figure that moves far less with the machine's load than
the wall time does, since on a shared machine the time between is whoever else runs. Each scenario gets one cold run (a new state folder: CAs and certificates are
minted) and then `runs` warm runs on the same stack name, which keeps its certificates between `up`s
as a user's default stack does; the median and spread are of the warm runs.
"""

from __future__ import annotations

import json
import re
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.as_filed import SCENARIOS, Tree
from bench.procs import spawn, stop
from bench.stacks import unique_name
from clusters.local import LocalStack
from sim.model.events import CALLBACK_RESULT, CALLBACK_START

REPO = Path(__file__).resolve().parents[1]
NCPSIM = str(Path(sys.executable).with_name("ncpsim"))  # the console script, as a user runs it
CURRENT = Tree("current", (NCPSIM,), REPO)  # this checkout
UP_TIMEOUT = 60.0


def _events(state_dir: Path, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    found = []
    for path in (state_dir / "events").glob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            if not any(f'"{kind}"' in line for kind in kinds):
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line still being written
            if event.get("kind") in kinds:
                found.append(event)
    return found


def first_ok_callback(state_dir: Path) -> float | None:
    """The earliest `ts` of a successful worker callback in the stack's event files."""
    oks = [e["ts"] for e in _events(state_dir, (CALLBACK_RESULT,)) if e.get("ok")]
    return min(oks, default=None)


def phases(state_dir: Path, spawned: float) -> dict[str, float | None]:
    """Where the time to the first callback went, from the components' own events (seconds after spawn)."""
    events = _events(state_dir, ("component.ready", CALLBACK_START, CALLBACK_RESULT))

    def at(times: list[float], pick: Any = min) -> float | None:
        return round(pick(times) - spawned, 3) if times else None

    ready = [e for e in events if e["kind"] == "component.ready"]
    return {
        "first_component_ready": at([e["ts"] for e in ready]),
        "control_plane_ready": at(
            [e["ts"] for e in ready if not e["component"].startswith("ncpsim-compute")], max
        ),
        "workers_ready": at([e["ts"] for e in ready if e["component"].startswith("ncpsim-compute")], max),
        "first_callback_start": at([e["ts"] for e in events if e["kind"] == CALLBACK_START]),
        "first_callback_ok": at([e["ts"] for e in events if e["kind"] == CALLBACK_RESULT and e.get("ok")]),
    }


def up_once(scenario: str, stack: str, root: Path, logs: Path, tree: Tree = CURRENT) -> dict[str, Any]:
    """One `ncpsim up` (or `tree`'s); seconds from spawn to the first successful callback (None if none)."""
    cmd = [*tree.argv, "up", f"scenario={scenario}", "--stack", stack]
    before = _children_cpu()
    spawned = time.time()
    proc = spawn(cmd, logs / f"up-{stack}.log", env=tree.env(root), cwd=tree.cwd)
    try:
        rc = proc.wait(UP_TIMEOUT)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        stop(proc)
        LocalStack(stack, root=root).down()  # `up` leaves the stack running, by design
    first = first_ok_callback(root / stack)
    return {
        "exit": rc,
        "seconds": None if first is None else round(first - spawned, 3),
        "cli_cpu_seconds": round(_children_cpu() - before, 3),  # the whole up, the zygote's imports included
        "phases": phases(root / stack, spawned),
    }


def _children_cpu() -> float:
    """CPU-seconds of this process's waited children so far: `up`, with the zygote it waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_to_first_callback(scenario: str, runs: int, root: Path, logs: Path) -> dict[str, Any]:
    stack = unique_name(scenario.split("-")[0])
    cold = up_once(scenario, stack, root, logs)
    warm = [up_once(scenario, stack, root, logs) for _ in range(runs)]
    times = [w["seconds"] for w in warm if w["seconds"] is not None]
    cpu = [w["cli_cpu_seconds"] for w in warm]
    LocalStack(stack, root=root).down(purge=True)
    return {
        "scenario": scenario,
        "cold_seconds": cold["seconds"],
        "runs": warm,
        "phases": _median_phases(warm),
        "median": round(statistics.median(times), 3) if times else None,
        "min": min(times, default=None),
        "max": max(times, default=None),
        "failed_runs": sum(w["seconds"] is None or w["exit"] != 0 for w in warm),
        "cli_cpu_median": round(statistics.median(cpu), 3) if cpu else None,
    }


def _median_phases(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    keys = runs[0]["phases"] if runs else {}
    return {
        k: (
            round(statistics.median(v), 3)
            if (v := [r["phases"][k] for r in runs if r["phases"][k] is not None])
            else None
        )
        for k in keys
    }


def against(tree: Tree, scenario: str, rounds: int, root: Path, logs: Path) -> dict[str, Any]:
    """`up` to the first callback, this checkout's and `tree`'s in turns (the order flipping each round, after
    one cold run each), judged on the median of the rounds' ratios (this checkout / `tree`): a burst of other
    work then spoils one round, not the figure. Under 1.0, this checkout is the faster."""
    trees = (CURRENT, tree)
    stacks = {t.key: unique_name(f"{t.key[:2]}-{scenario.split('-')[0]}") for t in trees}
    for t in trees:
        up_once(scenario, stacks[t.key], root, logs, t)  # cold: each stack mints its certificates
    times: dict[str, list[float | None]] = {t.key: [] for t in trees}
    for turn in range(rounds):
        for t in trees if turn % 2 == 0 else trees[::-1]:
            times[t.key].append(up_once(scenario, stacks[t.key], root, logs, t)["seconds"])
    for stack in stacks.values():
        LocalStack(stack, root=root).down(purge=True)
    mine, theirs = times[CURRENT.key], times[tree.key]
    ratios = sorted(a / b for a, b in zip(mine, theirs, strict=True) if a is not None and b)
    return {
        "scenario": scenario,
        "seconds": times,
        "median": {k: _median(v) for k, v in times.items()},
        "failed_runs": {k: sum(t is None for t in v) for k, v in times.items()},
        "round_ratio_median": round(statistics.median(ratios), 3) if ratios else None,
        "round_ratio_range": [round(ratios[0], 3), round(ratios[-1], 3)] if ratios else None,
    }


def _median(times: list[float | None]) -> float | None:
    done = [t for t in times if t is not None]
    return round(statistics.median(done), 3) if done else None


def replay_tree(tree: Tree, root: Path, logs: Path, timeout: float) -> dict[str, Any]:
    """`tree`'s whole catalogue, `replay --all -j auto` as its command line ran it."""
    return _replay(["replay", "--all", "-j", "auto"], root, logs / f"replay-{tree.key}.log", timeout, tree)


SUMMARY = re.compile(r"(\d+)/(\d+) scenarios passed in ([\d.]+)s")
# The same replay through the library, for when the command line fails before replaying anything.
LIBRARY_REPLAY = (
    "import sys; from scenarios.replay import replay_many; sys.exit(0 if replay_many(None) else 1)"
)


def _replay(args: list[str], root: Path, log: Path, timeout: float, tree: Tree = CURRENT) -> dict[str, Any]:
    """Run one replay of many scenarios (`tree`'s command line, then `args`); its wall time, exit code and
    the passed/total line."""
    started = time.perf_counter()
    proc = spawn([*tree.argv, *args], log, env=tree.env(root), cwd=tree.cwd)
    try:
        rc: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        stop(proc)
        for state in root.glob("*") if root.exists() else []:
            LocalStack(state.name, root=root).down()  # a kept or interrupted scenario's stack
    seconds = time.perf_counter() - started
    text = log.read_text(errors="replace") if log.exists() else ""
    found = SUMMARY.findall(text)
    passed, total = (int(found[-1][0]), int(found[-1][1])) if found else (None, None)
    failures = [line.strip() for line in text.splitlines() if line.startswith("FAIL")][:10]
    return {
        "seconds": round(seconds, 2),
        "exit": rc,
        "timed_out": rc is None,
        "passed": passed,
        "total": total,
        "failures": failures,
        "output_tail": text.strip().splitlines()[-3:],
    }


def catalogue(root: Path, logs: Path, timeout: float) -> dict[str, Any]:
    """`ncpsim replay --all -j auto` as a user runs it (stacks in parallel, one more than cores, each isolated);
    if it replays nothing, the library's replay_many too. Then the catalogue as filed (its SCENARIOS), the
    same way."""
    result = _replay(
        ["replay", "--all", "-j", "auto", "--junit", str(logs / "replay-all.xml")],
        root / "replay",
        logs / "replay-all.log",
        timeout,
    )
    result["as_filed"] = _replay(
        ["replay", *SCENARIOS, "-j", "auto", "--junit", str(logs / "replay-as-filed.xml")],
        root / "replay-as-filed",
        logs / "replay-as-filed.log",
        timeout,
    )
    if result["total"] is None:
        result["library"] = _replay(
            ["-c", LIBRARY_REPLAY],
            root / "replay-library",
            logs / "replay-library.log",
            timeout,
            replace(CURRENT, argv=(sys.executable,)),
        )
    return result
