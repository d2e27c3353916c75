"""DNS queries per second: ncpsim's resolver (the stack's process, compute-cluster view) vs dnsmasq.

dnsmasq gets the same data as the compute cluster's CoreDNS rewrite: `*.<workerDomain>` -> the proxy's
load-balancer address (`--address`), and other names NXDOMAIN without forwarding (`--local`, no
upstream servers). The load generator is a plain UDP socket with a bounded window of outstanding
queries, a bounded count and a time limit; both servers get the same query mix, and the rcodes they
answered are counted so a difference in answers would show. Each server's CPU time per query comes
with psutil, which does not depend on how fast the Python load generator is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import socket
import statistics
import struct
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dnslib import DNSRecord

from bench.procs import CpuMeter, free_port, group_members, spawn, stop
from bench.stacks import WORKER_DOMAIN, BenchStack, running, topology, unique_name
from sim.wire import DNS_PORT

WINDOW = 32  # queries in flight
QUERY_TIMEOUT = 1.0
RCODES = {0: "NOERROR", 2: "SERVFAIL", 3: "NXDOMAIN", 5: "REFUSED"}


def query_mix(size: int = 100) -> list[bytes]:
    """What workers ask in a compute cluster: pod names and the proxy name (A), some AAAA, some misses."""
    packets = []
    for i in range(size):
        kind = i % 10
        if kind < 6:
            name, qtype = f"10-42-0-{11 + i % 200}.{WORKER_DOMAIN}", "A"
        elif kind < 8:
            name, qtype = f"invocation.{WORKER_DOMAIN}", "A"
        elif kind == 8:
            name, qtype = f"10-42-0-{11 + i % 200}.{WORKER_DOMAIN}", "AAAA"
        else:
            name, qtype = f"missing-{i}.svc.example.org", "A"
        packets.append(DNSRecord.question(name, qtype).pack())
    return packets


def _send_some(sock: socket.socket, packets: list[bytes], state: dict[str, Any], count: int) -> None:
    outstanding, now = state["outstanding"], time.perf_counter()
    while state["sent"] < count and len(outstanding) < WINDOW:
        qid = state["sent"] & 0xFFFF
        sock.send(struct.pack("!H", qid) + packets[state["sent"] % len(packets)][2:])
        outstanding[qid] = now
        state["sent"] += 1


def _receive_all(sock: socket.socket, state: dict[str, Any]) -> None:
    while True:
        try:
            reply = sock.recv(4096)
        except BlockingIOError:
            return
        qid, flags = struct.unpack_from("!HH", reply)
        if state["outstanding"].pop(qid, None) is not None:
            state["received"] += 1
            state["rcodes"][RCODES.get(flags & 0xF, str(flags & 0xF))] += 1


def _expire(state: dict[str, Any]) -> None:
    cutoff = time.perf_counter() - QUERY_TIMEOUT
    for qid in [q for q, sent in state["outstanding"].items() if sent < cutoff]:
        del state["outstanding"][qid]
        state["lost"] += 1


def load(addr: tuple[str, int], count: int, time_limit: float) -> dict[str, Any]:
    """Send `count` queries (stopping at `time_limit` seconds), WINDOW at a time; answers per second."""
    packets = query_mix()
    state: dict[str, Any] = {"sent": 0, "received": 0, "lost": 0, "outstanding": {}, "rcodes": Counter()}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(addr)
        sock.setblocking(False)
        started, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - started < time_limit:
            _send_some(sock, packets, state, count)
            if not state["outstanding"]:
                break
            if select.select([sock], [], [], 0.05)[0]:
                _receive_all(sock, state)
            _expire(state)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "sent": state["sent"],
        "answered": state["received"],
        "lost": state["lost"] + len(state["outstanding"]),
        "seconds": round(seconds, 3),
        "per_second": round(state["received"] / seconds, 1),
        "rcodes": dict(state["rcodes"]),
        # the generator's own cost: a server that needs less than this per query is not what bounds the rate
        "client_cpu_us_per_query": round(cpu * 1e6 / max(state["received"], 1), 1),
    }


READY_TIMEOUT = 10.0


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.2)
        sock.sendto(query_mix(1)[0], ("127.0.0.1", port))
        try:
            return bool(sock.recv(4096))
        except OSError:
            return False


def _wait_answering(port: int, proc: subprocess.Popen) -> None:
    """dnsmasq has no readiness pipe: ask it until it answers, or exits."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dnsmasq exited with {proc.returncode}")
        if _answers(port):
            return
    raise RuntimeError(f"dnsmasq did not answer on port {port} within {READY_TIMEOUT}s")


@contextlib.contextmanager
def dnsmasq(folder: Path, target_ip: str) -> Iterator[tuple[int, subprocess.Popen]]:
    """dnsmasq on a free loopback port with the compute cluster's rewrite; stopped when the block ends."""
    binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    if not Path(binary).exists():
        raise RuntimeError("dnsmasq is not installed (apt-get install dnsmasq-base)")
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, START_ATTEMPTS + 1):
        port = _free_udp_and_tcp_port()
        proc = spawn(_command(binary, port, target_ip), folder / "dnsmasq.log")
        try:
            _wait_answering(port, proc)
        except RuntimeError:
            stop(proc)
            # dnsmasq binds TCP too; a port the kernel has just given to a connection in the meantime
            # makes it exit with 2 ("Address already in use"): take another port.
            if proc.returncode == 2 and attempt < START_ATTEMPTS:
                continue
            raise
        break
    try:
        yield port, proc
    finally:
        stop(proc)


START_ATTEMPTS = 5


def _free_udp_and_tcp_port() -> int:
    """A port free on 127.0.0.1 for both UDP and TCP right now (dnsmasq listens on both)."""
    while True:
        port = free_port(socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            try:
                tcp.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def _command(binary: str, port: int, target_ip: str) -> list[str]:
    cmd = [
        binary,
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--no-poll",
        "--bind-interfaces",
        "--listen-address=127.0.0.1",
        f"--port={port}",
        "--pid-file=",
        f"--address=/{WORKER_DOMAIN}/{target_ip}",
        f"--local=/{WORKER_DOMAIN}/",
        "--local=/example.org/",
    ]  # --local: NODATA for AAAA, as before dnsmasq 2.86
    if os.geteuid() == 0:
        cmd.append("--user=root")  # no drop to nobody: nothing to gain on loopback, and it needs no group
    return cmd


ROUNDS = 5  # the servers take turns, the order flipping each round, as bench.relay's routes do


def measure(
    bench: BenchStack, folder: Path, count: int, time_limit: float, rounds: int = ROUNDS
) -> dict[str, Any]:
    """The stack's resolver (compute-cluster view) against dnsmasq, same mix, same generator: `count`
    queries each, in `rounds` turns, so a change in the machine's speed during the section hits both alike
    (one turn each, a second apart, once read 0.97 on a machine where five turns read 1.06-1.20)."""
    cluster = bench.topology.compute_clusters[0]
    resolver_pid = bench.component_pid("resolver")
    with dnsmasq(folder, bench.topology.proxy_lb_ip) as (port, proc):
        servers: dict[str, tuple[tuple[str, int], Callable[[], list[int]]]] = {
            "resolver": (bench.real(cluster.dns_ip, DNS_PORT, "udp"), lambda: [resolver_pid]),
            "dnsmasq": (("127.0.0.1", port), lambda: group_members(proc.pid)),
        }
        for addr, _ in servers.values():
            load(addr, min(count, 500), time_limit)  # warm-up
        turns: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
        for n in range(rounds):
            for name in list(servers) if n % 2 == 0 else reversed(servers):
                addr, pids = servers[name]
                with CpuMeter(pids) as cpu:
                    result = load(addr, max(count // rounds, 1), time_limit / rounds)
                turns[name].append(result | {"server_cpu_seconds": cpu.seconds})
    ours, theirs = _summed(turns["resolver"]), _summed(turns["dnsmasq"])
    ratios = [
        a["per_second"] / b["per_second"]
        for a, b in zip(turns["resolver"], turns["dnsmasq"], strict=True)
        if b["per_second"]
    ]
    out: dict[str, Any] = {
        "resolver": ours,
        "dnsmasq": theirs,
        "window": WINDOW,
        "mix": MIX,
        "rounds": rounds,
    }
    out["ratio"] = round(ours["per_second"] / theirs["per_second"], 3) if theirs["per_second"] else None
    if ratios:
        out["round_ratio_median"] = round(statistics.median(ratios), 3)
        out["round_ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return out


def _summed(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's turns as one measurement: counts summed, the rate over the summed time."""
    answered, seconds = sum(t["answered"] for t in turns), sum(t["seconds"] for t in turns)
    client_us = sum(t["client_cpu_us_per_query"] * t["answered"] for t in turns)
    return {
        "sent": sum(t["sent"] for t in turns),
        "answered": answered,
        "lost": sum(t["lost"] for t in turns),
        "seconds": round(seconds, 3),
        "per_second": round(answered / seconds, 1) if seconds else 0.0,
        "rcodes": dict(sum((Counter(t["rcodes"]) for t in turns), Counter())),
        "client_cpu_us_per_query": round(client_us / max(answered, 1), 1),
        "server_cpu_us_per_query": round(
            sum(t["server_cpu_seconds"] for t in turns) * 1e6 / max(answered, 1), 1
        ),
        "round_rates": [t["per_second"] for t in turns],
    }


MIX = "60% A <dashed-pod-ip>.<workerDomain>, 20% A invocation.<workerDomain>, 10% AAAA (NODATA), 10% NXDOMAIN"


def main() -> None:
    """This section of `ncpsim bench` alone, on a stack of its own, `--repeat` times on that stack: an A/B
    of two trees runs it with each tree first on PYTHONPATH (the stack's resolver runs the `sim` found there)."""
    parser = argparse.ArgumentParser(prog="python -m bench.dnsload", description=__doc__)
    parser.add_argument("--queries", type=int, default=100_000, help="queries per server and measurement")
    parser.add_argument("--seconds", type=float, default=10.0, help="time limit per server and measurement")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="turns each server takes in a measurement")
    parser.add_argument("--repeat", type=int, default=1, help="measurements on the same stack")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ncpsim-dns-") as folder:
        root = Path(folder)
        with running(root / "dns", topology(unique_name("dns"), invocation=1, clusters=1)) as bench:
            measured = [
                measure(bench, root / "dnsmasq", args.queries, args.seconds, args.rounds)
                for _ in range(args.repeat)
            ]
    print(json.dumps(measured, indent=2))


if __name__ == "__main__":
    main()
