"""Scale: N compute clusters of workers, many callbacks driven concurrently; lost, wall time, peak memory.

The topology is built with sim.model.topology.build (10 compute clusters of 1,000 workers for the full run). The
benchmark is the function client: `concurrency` lanes, each with a keep-alive connection to one
invocation-service pod (lanes spread over the pods), invoke the echo function with NVCF-POLL-SECONDS 60
and wait for the answer. A callback is lost when its invocation does not come back 200 with its own
body. Workers do everything else as in any scenario: NATS (JetStream pull, ack), GET and POST through the
proxy on the connections each keeps alive (a DNS lookup and a TLS handshake when it has none idle).

Memory is read three ways, sampled with psutil every 200 ms over the stack's processes (each component's
whole process group, so nats-server beside its NATS supervisor counts, and the stack's supervisor, the
launch's zygote that forked them): the sum of PSS (each page shared among the forks counted once, split
among the processes that map it; read each second), the sum of RSS (a shared page counted in every process
that maps it), and the machine's used memory (MemTotal - MemAvailable) less what it was before `up`. The
verdict is on the peak PSS: it is what the fleet takes from the machine. The RSS sum overstates it by the
zygote's preloaded pages once per component; the machine's delta adds the kernel's share of the fleet
(page tables, socket buffers), the benchmark's own client and whatever else the machine was doing, so it
is a cross-check, shown with the kernel's allocations at its peak. By role is how each peak sample splits
(ncpsim-compute: the worker hosts, one per compute cluster); the idle fleet's is read once after up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import h11

from bench.callbacks import PEXEC, open_stream
from bench.procs import (
    MemorySampler,
    cpu_seconds,
    gone,
    groups_members,
    kernel_bytes,
    machine_used_bytes,
    parents,
    pss_bytes,
    pss_shares,
    rss_bytes,
)
from bench.stacks import BenchStack, running, topology, unique_name
from sim.model.events import CALLBACK_RESULT
from sim.protocols.http1 import H11Stream, exchange
from sim.runtime.run import event_loop, loop_factory

POLL_SECONDS = 60
SUPERVISOR = "supervisor"  # the role of the stack's zygote in the memory figures
CALL_TIMEOUT = POLL_SECONDS + 5.0


async def _lane(
    addr: tuple[str, int], numbers: itertools.count, total: int, stop_at: float, lost: list[dict[str, Any]]
) -> int:
    """Invocations one after another on one keep-alive connection, until `total` have been taken or the
    deadline has passed (the invocation in flight then still finishes)."""
    done = 0
    stream: H11Stream | None = None
    while time.perf_counter() < stop_at and (n := next(numbers)) < total:
        body = json.dumps({"scale": n}).encode()
        try:
            stream = stream or await open_stream(addr)
            response = await exchange(
                stream,
                "POST",
                PEXEC,
                [
                    ("host", "invocation"),
                    ("content-type", "application/json"),
                    ("nvcf-poll-seconds", str(POLL_SECONDS)),
                ],
                body,
                timeout=CALL_TIMEOUT,
            )
            ok = response.status == 200 and response.body == body
            reason = f"status {response.status}"
        except (ConnectionError, h11.ProtocolError, TimeoutError) as exc:
            ok, reason = False, f"{type(exc).__name__}: {exc}"
            if stream:
                stream.close()
            stream = None
        if not ok:
            lost.append({"n": n, "reason": reason})
        done += 1
    if stream:
        stream.close()
    return done


async def drive(bench: BenchStack, callbacks: int, concurrency: int, deadline: float) -> dict[str, Any]:
    pods = bench.topology.pods_of("invocation")
    numbers = itertools.count()
    lost: list[dict[str, Any]] = []
    started = time.perf_counter()
    counts = await asyncio.gather(
        *(
            _lane(bench.pod_http(pods[i % len(pods)]), numbers, callbacks, started + deadline, lost)
            for i in range(concurrency)
        )
    )
    seconds = time.perf_counter() - started
    done = sum(counts)
    return {
        "requested": callbacks,
        "callbacks": done,
        "deadline_hit": done < callbacks,
        "deadline": deadline,
        "lost": len(lost),
        "lost_examples": lost[:5],
        "seconds": round(seconds, 2),
        "per_second": round(done / seconds, 1),
    }


FAILURE_EXAMPLES = 5


def worker_results(state_dir: Path) -> dict[str, Any]:
    """Worker callback outcomes from the events, as a cross-check of the client's count; the first few
    failures with where and why they stopped, so a lost callback can be explained."""
    ok = failed = 0
    examples: list[dict[str, Any]] = []
    for path in sorted((state_dir / "events").glob("ncpsim-compute-*.jsonl")):
        with open(path, errors="replace") as lines:
            for line in lines:
                if f'"{CALLBACK_RESULT}"' in line:  # a substring test: cheaper than parsing every line
                    if '"ok": true' in line:
                        ok += 1
                        continue
                    failed += 1
                    if len(examples) < FAILURE_EXAMPLES:
                        with contextlib.suppress(json.JSONDecodeError):  # a line still being written
                            event = json.loads(line)
                            examples.append(
                                {k: event.get(k) for k in ("requestId", "worker", "stage", "error")}
                            )
    return {"ok": ok, "failed": failed, "failure_examples": examples}


def settled_results(state_dir: Path, expected: int, timeout: float = 5.0) -> dict[str, Any]:
    """The workers' outcomes once their last lines are written (a worker logs after the pod answered)."""
    deadline = time.monotonic() + timeout
    while True:
        results = worker_results(state_dir)
        if results["ok"] + results["failed"] >= expected or time.monotonic() > deadline:
            return results
        time.sleep(0.2)


def stack_processes(bench: BenchStack) -> dict[str, list[int]]:
    """Every process of the stack's components' process groups by role, in one pass over the process table,
    and the stack's supervisor (the launch's zygote, their parent): it holds the preloaded pages its forks
    share, so without it a PSS sum would leave out its share of them."""
    running = bench.stack.launcher.running()
    members = groups_members(running.values())
    found: dict[str, list[int]] = {role(name): [] for name in running}
    for name, pgid in running.items():
        found[role(name)].extend(members[pgid])
    found[SUPERVISOR] = sorted(parents(running.values()) - {os.getpid(), 1})
    return found


def _cpu_by_component(bench: BenchStack) -> dict[str, float]:
    running = bench.stack.launcher.running()
    members = groups_members(running.values())
    return {name: cpu_seconds(members[pgid]) for name, pgid in running.items()}


def role(component: str) -> str:
    """invocation-service-1 -> invocation-service, ncpsim-compute-3 -> ncpsim-compute (worker hosts)."""
    return re.sub(r"-\d+$", "", component)


def by_role(cpu: dict[str, float]) -> dict[str, float]:
    roles: dict[str, float] = {}
    for name, seconds in cpu.items():
        roles[role(name)] = roles.get(role(name), 0.0) + seconds
    return {k: round(v, 1) for k, v in sorted(roles.items())}


def measure(
    root: Path, clusters: int, workers: int, callbacks: int, concurrency: int, deadline: float
) -> dict[str, Any]:
    per_cluster = workers // clusters
    topo = topology(unique_name("scale"), invocation=2, clusters=clusters, workers_per_cluster=per_cluster)
    machine_before = machine_used_bytes()  # the machine before `up`: the fleet's cost is the delta
    started = time.perf_counter()
    with running(root, topo) as bench:
        up = time.perf_counter() - started
        before = _cpu_by_component(bench)
        # What the idle fleet holds (every worker signed in and pulling), against the peak under load.
        idle_memory = _idle(bench, machine_before)
        client_cpu = time.process_time()
        # The client runs on the components' event loop: it is the load, and competes with them for the cores.
        with (
            MemorySampler(lambda: stack_processes(bench)) as memory,
            asyncio.Runner(loop_factory=loop_factory(os.environ.get("NCPSIM_EVENT_LOOP"))) as loop,
        ):
            result = loop.run(drive(bench, callbacks, concurrency, deadline))
        client_cpu = time.process_time() - client_cpu
        after = _cpu_by_component(bench)
        result["cpu_seconds"] = {k: round(after[k] - before.get(k, 0.0), 1) for k in sorted(after)}
        result["cpu_seconds_by_role"] = by_role(result["cpu_seconds"])
        result["cpu_seconds_total"] = round(sum(result["cpu_seconds"].values()), 1)
        result["up_cpu_seconds_by_role"] = by_role(before)  # start-up: every worker's sign-in
        result["worker_results"] = settled_results(bench.state_dir, result["callbacks"])
        result["processes"] = len(bench.pids())
        result.update(idle_memory)
        held = _held(bench)
    result.update(_given_back(held))
    result.update(
        clusters=clusters,
        workers=per_cluster * clusters,
        concurrency=concurrency,
        up_seconds=round(up, 2),
        wall_seconds=round(up + result["seconds"], 2),
        peak_rss_mib=round(memory.peak / 2**20, 1),
        peak_rss_mib_by_role=_mib(memory.peak_by_role),
        peak_pss_mib=round(memory.peak_pss / 2**20, 1),
        peak_pss_mib_by_role=_mib(memory.peak_pss_by_role),
        peak_pss_anon_mib=round(memory.peak_pss_anon / 2**20, 1),
        peak_machine_used_mib=round((memory.peak_machine - machine_before) / 2**20, 1),
        kernel_mib_at_machine_peak=_mib(memory.kernel_at_peak),
        memory_samples=memory.samples,
        client_rss_mib=round(rss_bytes([os.getpid()]) / 2**20, 1),
        client_cpu_seconds=round(client_cpu, 1),
        event_loop=event_loop(os.environ.get("NCPSIM_EVENT_LOOP")),
    )
    return result


def _idle(bench: BenchStack, machine_before: int) -> dict[str, Any]:
    idle = stack_processes(bench)
    return {
        "up_rss_mib_by_role": _mib({k: rss_bytes(v) for k, v in idle.items()}),
        "up_pss_mib_by_role": _mib({k: pss_bytes(v) for k, v in idle.items()}),
        "up_machine_used_mib": round((machine_used_bytes() - machine_before) / 2**20, 1),
    }


def _given_back(held: dict[str, Any]) -> dict[str, Any]:
    """The cross-check least disturbed by the rest of the machine: what `down` gave back, within a second or
    two, against the PSS sum just before it (the bench's own client is in neither), and the kernel's part
    of it (the fleet's sockets and page tables, which no process's PSS holds)."""
    gone(held["pids"])  # their memory is back once they have exited, not when `down` returns
    freed, after = held["machine_used"] - machine_used_bytes(), kernel_bytes()
    return {
        "end_pss_mib": held["end_pss_mib"],
        "end_pss_anon_mib": held["end_pss_anon_mib"],
        "freed_by_down_mib": round(freed / 2**20, 1),
        "kernel_freed_by_down_mib": _mib({k: v - after.get(k, 0) for k, v in held["kernel"].items()}),
    }


def _held(bench: BenchStack) -> dict[str, Any]:
    """The stack's PSS sum and the machine's used memory at the end of the run, before `down`."""
    processes = stack_processes(bench)
    shares = [pss_shares(pids) for pids in processes.values()]
    return {
        "end_pss_mib": round(sum(total for total, _ in shares) / 2**20, 1),
        "end_pss_anon_mib": round(sum(anon for _, anon in shares) / 2**20, 1),
        "machine_used": machine_used_bytes(),
        "kernel": kernel_bytes(),
        "pids": [pid for pids in processes.values() for pid in pids],
    }


def _mib(by_name: dict[str, int]) -> dict[str, float]:
    return {k: round(v / 2**20, 1) for k, v in sorted(by_name.items())}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--clusters", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--callbacks", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--deadline", type=float, default=240.0, help="seconds of driving")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ncpsim-scale-") as root:
        result = measure(
            Path(root), args.clusters, args.workers, args.callbacks, args.concurrency, args.deadline
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
