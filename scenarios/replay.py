"""`invoke replay`: each scenario on a fresh stack of its own, with text, JSON and JUnit reports."""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from rich.console import Console

from clusters.stack import LocalStack
from scenarios.engine import ScenarioResult, run_scenario, to_json
from scenarios.model import catalogue, load_scenario
from scenarios.report import render_text


def replay_many(names: list[str] | None, values_file: Path | None = None, junit: Path | None = None,
                keep: bool = False, as_json: bool = False) -> bool:
    names = names or [name for name, _ in catalogue()]
    console = Console(file=sys.stdout)
    results: list[ScenarioResult] = []
    started = time.monotonic()
    for name in names:
        scenario = load_scenario(name, values_file)
        stack = LocalStack(f"replay-{scenario.name}"[:40])
        stack.down(purge=True)  # a fresh stack: nothing from an earlier replay
        result = run_scenario(scenario, stack, keep=True)
        if result.ok or not keep:
            stack.down(purge=result.ok)
        results.append(result)
        if as_json:
            print(json.dumps(to_json(result), indent=2, default=str))
        else:
            render_text(result, console=console, traces=not result.ok)
            if not result.ok and keep:
                console.print(f"  stack kept for inspection: invoke status --stack {stack.name}")
    total = time.monotonic() - started
    passed = sum(r.ok for r in results)
    if not as_json:
        console.print(f"{passed}/{len(results)} scenarios passed in {total:.1f}s")
    if junit:
        write_junit(results, junit, total)
    return passed == len(results)


def write_junit(results: list[ScenarioResult], path: Path, total: float) -> None:
    suite = ET.Element("testsuite", name="ncpsim-scenarios", tests=str(len(results)),
                      failures=str(sum(not r.ok for r in results)), errors="0", time=f"{total:.3f}")
    for result in results:
        case = ET.SubElement(suite, "testcase", classname="ncpsim.scenarios", name=result.scenario.name,
                             time=f"{result.elapsed:.3f}")
        if not result.ok:
            failure = ET.SubElement(case, "failure", message=result.failures[0] if result.failures else "failed")
            failure.text = "\n".join(result.failures)
        ET.SubElement(case, "system-out").text = render_text(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
