"""`ncpsim replay`: each scenario on a fresh stack of its own, with text, JSON and JUnit reports."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

from rich.console import Console

from clusters.interrupts import InterruptGuard
from clusters.local import LocalBackend, zygote
from clusters.stack import Backend
from clusters.state import state_root
from scenarios.engine import run_scenario
from scenarios.load import customer_layers, load_scenario
from scenarios.lookup import catalogue_names
from scenarios.report import input_assumptions, render_text, values_warnings
from scenarios.result import ScenarioResult, to_json
from scenarios.secrets import with_brought_secrets
from scenarios.spec import Scenario
from scenarios.terminal import safe
from sim.errors import BackendError, ConfigError

MAX_STACK_NAME = 40  # clusters.state.STACK_NAME


def replay_stack(scenario: str, stack: str | None = None, several: bool = False) -> tuple[str, str]:
    """(the stack a replay runs on, the name asked for): `--stack NAME` for one scenario, NAME-<scenario>
    for several, replay-<scenario> by default; a name over 40 characters keeps a hash of the whole."""
    full = stack if stack and not several else f"{stack or 'replay'}-{scenario}"
    if len(full) <= MAX_STACK_NAME:
        return full, full
    digest = hashlib.sha1(full.encode()).hexdigest()[:6]
    return f"{full[: MAX_STACK_NAME - 7].rstrip('-')}-{digest}", full


def replay_one(
    scenario: Scenario,
    keep: bool = False,
    root: Path | None = None,
    backend: Backend | None = None,
    stack: str | None = None,
    guard: InterruptGuard | None = None,
) -> ScenarioResult:
    """A fresh stack for one scenario. Processes stop afterwards unless it failed and `keep` is set;
    the state folder stays either way, so the reports, logs and events can be read after the run."""
    backend = backend or LocalBackend(root, guard)
    name = stack or replay_stack(scenario.name)[0]
    fresh = backend.attach(name)
    fresh.down(purge=True)  # nothing from an earlier replay
    try:
        with backend.interruptible(name):
            result = run_scenario(scenario, backend, name, keep=True)
    except BackendError as exc:  # one scenario's stack failing to start must not end the whole run
        fresh.down()
        result = ScenarioResult(scenario, error=str(exc))
    if result.ok or not keep:
        fresh.down()
    return result


def scenario_names(words: Sequence[str]) -> list[str]:
    """Each word as it is (a name or a path), a glob (`nats-*`) as the catalogue names it matches."""
    known: list[str] = []  # listed at the first glob
    names: list[str] = []
    for word in words:
        if not any(ch in word for ch in "*?["):
            names.append(word)
            continue
        known = known or catalogue_names()
        matched = fnmatch.filter(known, word)
        if not matched:
            raise ConfigError(
                f"{word!r} matches no scenario in the catalogue (`ncpsim scenarios` lists them)"
            )
        names += [m for m in matched if m not in names]
    return names


def replay_many(
    names: list[str] | None,
    values_file: Path | Sequence[Path] | None = None,
    junit: Path | None = None,
    keep: bool = False,
    output: str = "text",
    root: Path | None = None,
    sets: Sequence[str] = (),
    stack: str | None = None,
    jobs: int = 1,
    secrets: Sequence[str] = (),
    loaded: Sequence[Scenario] = (),
    guard: InterruptGuard | None = None,
) -> bool:
    """`ncpsim replay`: every named scenario (the whole catalogue when None), then those `loaded` already
    (a support bundle's world); True when all pass.

    The customer's files and `--set`s sit above each scenario's values, and each `--secret NAME=DIR` is
    Secret NAME in every scenario; unknown keys are warned about once, on stderr, before anything starts."""
    names = catalogue_names() if names is None else names
    customer = customer_layers(values_file, sets)  # read once, laid over every scenario
    scenarios = [load_scenario(name, allow_expected_error=True, customer=customer) for name in names]
    scenarios = [with_brought_secrets(s, list(secrets)) for s in [*scenarios, *loaded]]
    for line in values_warnings(scenarios) + input_assumptions(scenarios, LocalBackend.name):
        print(line, file=sys.stderr)
    results, total = replay_all(scenarios, keep, output, root, stack=stack, jobs=jobs, guard=guard)
    if output == "json":
        print(json.dumps(_document(results, total), indent=2, default=str))
    if junit:
        write_junit(results, junit, total)
    return all(r.ok for r in results)


def _document(results: list[ScenarioResult], total: float) -> dict[str, object]:
    """`replay --json`: the whole run as one document, read with one json.load."""
    return {
        "ok": all(r.ok for r in results),
        "passed": sum(r.ok for r in results),
        "total": len(results),
        "seconds": round(total, 3),
        "scenarios": [to_json(r) for r in results],
    }


# The catalogue's slowest replays, slowest first: their own modelled waits (a NATS rollout, a quorum lost and
# regained, every certificate rotated) took 14.6, 8.2 and 3.4 s of the catalogue's 46 scenario-seconds
# (junit times, 2026-12-04). Several at a time, they start first, so no lane is left with one of them at the
# end: `--all -j 3` took 24.9 s in catalogue order and 18.9 s with these first. Reports still print in the
# order given. A stale guess costs time, never a result.
SLOWEST_FIRST = ("nats-rolling-restart", "nats-quorum-lost", "cert-rotation")


def start_order(scenarios: list[Scenario]) -> list[int]:
    """The indexes of `scenarios` in the order to start them: SLOWEST_FIRST's, then the rest as given."""
    rank = {name: n for n, name in enumerate(SLOWEST_FIRST)}
    return sorted(range(len(scenarios)), key=lambda i: rank.get(scenarios[i].name, len(rank)))


def replay_all(
    scenarios: list[Scenario],
    keep: bool = False,
    output: str = "text",
    root: Path | None = None,
    out: TextIO | None = None,
    stack: str | None = None,
    jobs: int = 1,
    guard: InterruptGuard | None = None,
) -> tuple[list[ScenarioResult], float]:
    """Replay each scenario on a stack of its own, `jobs` at a time, printing each report in catalogue order
    as soon as it and those before it are done; (results, seconds in all)."""
    out = out or sys.stdout
    # Plain text at a width that keeps trace rows readable in CI logs; rich styling only on a terminal.
    console = Console(file=out, width=None if out.isatty() else 160)
    names = [replay_stack(s.name, stack, several=len(scenarios) > 1) for s in scenarios]
    results: list[ScenarioResult] = []
    started = time.monotonic()
    guard = guard or InterruptGuard()  # SIGTERM as Ctrl-C: the scenarios run in threads, no signal reaches
    with guard.installed():
        try:
            with (
                zygote.shared(root or state_root()) if len(scenarios) > 1 else contextlib.nullcontext(),
                ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="replay") as pool,
            ):
                # Stacks are isolated (own ports, own state folder); a thread only waits on its own processes.
                started_as = {
                    i: pool.submit(replay_one, scenarios[i], keep, root, stack=names[i][0], guard=guard)
                    for i in start_order(scenarios)
                }
                futures = [started_as[i] for i in range(len(scenarios))]
                try:
                    _report_in_order(futures, scenarios, names, console, out, keep, output, results)
                except BaseException:  # start nothing more; the running ones end as their stacks stop
                    pool.shutdown(wait=False, cancel_futures=True)
                    with guard.held():
                        _down_all(root, names)
                    raise
        except BaseException:  # again, once the running scenarios have ended: what they started meanwhile
            with guard.held():
                _down_all(root, names)
            raise
    total = time.monotonic() - started
    if output in ("text", "quiet"):
        console.print(
            f"{sum(r.ok for r in results)}/{len(results)} scenarios passed in {total:.1f}s"
            + (f" ({jobs} at a time)" if jobs > 1 else "")
        )
    return results, total


def _report_in_order(
    futures: list[Future[ScenarioResult]],
    scenarios: list[Scenario],
    names: list[tuple[str, str]],
    console: Console,
    out: TextIO,
    keep: bool,
    output: str,
    results: list[ScenarioResult],
) -> None:
    progress = Progress(len(scenarios), sys.stderr)
    for index, (future, (name, asked)) in enumerate(zip(futures, names, strict=True), 1):
        progress.show(index, scenarios[index - 1].name)
        result = future.result()
        results.append(result)
        progress.clear()
        _print_result(console, out, result, name, asked, keep, output)


def _down_all(root: Path | None, names: list[tuple[str, str]]) -> None:
    backend = LocalBackend(root)
    for name, _ in names:
        backend.attach(name).down()


class Progress:
    """`[n/N] name` on one line of a terminal while a replay runs, cleared before its report; none in a pipe.
    A replay of one scenario shows nothing (its report follows at once); `live_from` says from how many on."""

    def __init__(self, total: int, stream: TextIO, live_from: int = 2):
        self.total, self.stream = total, stream
        self.live = total >= live_from and stream.isatty()

    def show(self, index: int, name: str) -> None:
        if self.live:
            self.stream.write(f"\r\x1b[K[{index}/{self.total}] {safe(name)} ...")
            self.stream.flush()

    def clear(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _print_result(
    console: Console, out: TextIO, result: ScenarioResult, name: str, asked: str, keep: bool, output: str
) -> None:
    if output == "json":
        return  # one document at the end
    if output == "jsonl":
        print(json.dumps(to_json(result), default=str), file=out, flush=True)
        return
    if output == "quiet" and result.ok:
        return
    render_text(result, console=console, traces=not result.ok)
    if name != asked:  # said, not silent: the state folder is not the name one would look for
        console.print(
            f"  stack {name}: {asked} is longer than a stack name may be ({MAX_STACK_NAME})",
            markup=False,
            soft_wrap=True,
        )
    if not result.ok and keep and result.status:
        console.print(f"  stack kept for inspection: ncpsim status --stack {result.status['stack']}")


def jobs_arg(value: str | int | None) -> int:
    """`-j auto` is one replay more than cores (a replay mostly waits on its stack's modelled timings: the
    catalogue two at a time kept 0.9 of 2 cores busy); a number is that many at a time."""
    if value in (None, "", 1, "1"):
        return 1
    if value == "auto":
        return (os.cpu_count() or 1) + 1
    try:
        jobs = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--jobs {value!r}: give a number of replays at a time, or auto") from None
    if jobs < 1:
        raise ConfigError(f"--jobs {value!r}: give a number of replays at a time, or auto")
    return jobs


def write_junit(results: list[ScenarioResult], path: Path, total: float) -> None:
    suite = ET.Element(
        "testsuite",
        name="ncpsim-scenarios",
        tests=str(len(results)),
        failures=str(sum(not r.ok for r in results)),
        errors="0",
        time=f"{total:.3f}",
    )
    for result in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname="ncpsim.scenarios",
            name=result.scenario.name,
            time=f"{result.elapsed:.3f}",
        )
        if not result.ok:
            first = result.failures[0] if result.failures else "failed"
            failure = ET.SubElement(case, "failure", message=first)
            failure.text = "\n".join(result.failures)
        ET.SubElement(case, "system-out").text = render_text(result)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
    except OSError as exc:  # checked before the run, but a disk may fill or a folder go meanwhile
        raise ConfigError(f"--junit {path}: cannot be written ({exc.strerror or exc})") from None
