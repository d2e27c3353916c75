"""Smoke tests of the benchmark's pieces (bench/): judging, reports, load generators, process handling.

Fast on purpose: one small stack for the callback generator, everything else without a stack.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench import dnsload, procs, report, startup
from bench.nginx import NginxSite, render
from bench.relay import keepalive
from bench.stacks import running, topology, unique_name
from bench.targets import judge
from dns.rule import View, wildcard
from dns.server import handle_packet

SAMPLE = {
    "machine": {
        "date": "2026-01-01T00:00:00Z",
        "nproc": 2,
        "cpu": "cpu",
        "memory_gib": 4.0,
        "python": "3.11",
        "os": "linux",
        "load_average_start": [0.1, 0.1, 0.1],
        "load_average_end": [0.2, 0.2, 0.2],
    },
    "parameters": {"startup_runs": 5, "newconn_lanes": 4, "dns_window": 32, "dns_mix": "mix"},
    "startup": {
        "http": {"median": 0.55, "min": 0.5, "max": 0.6, "cold_seconds": 1.5, "failed_runs": 0},
        "grpc": {"median": 0.9, "min": 0.8, "max": 1.0, "cold_seconds": 1.9, "failed_runs": 0},
    },
    "catalogue": {"seconds": 30.0, "exit": 0, "passed": 16, "total": 16},
    "relay": {
        "keepalive": {
            "ratio": 0.7,
            "round_ratio_median": 0.85,
            "round_ratio_range": [0.6, 0.9],
            "proxy": {"per_second": 40.0},
            "direct": {"per_second": 100.0},
        },
        "new_connection": {"ratio": 0.2, "proxy": {"per_second": 20.0}, "nginx": {"per_second": 100.0}},
    },
    "scale": {
        "lost": 0,
        "callbacks": 10,
        "requested": 10,
        "clusters": 5,
        "workers": 20,
        "wall_seconds": 5.0,
        "up_seconds": 1.0,
        "seconds": 4.0,
        "peak_rss_mib": 300.0,
    },
    "redelivery": {
        "invocations": 100,
        "answered": 97,
        "documented_error": 3,
        "lost": 0,
        "answered_twice": 1,
        "redelivered_messages": 4,
    },
    "dns": {"error": "RuntimeError: dnsmasq is not installed"},
}


def test_judge_marks_each_target() -> None:
    verdicts = {row.figure.split(" (")[0]: row.met for row in judge(SAMPLE)}
    assert verdicts["`invoke up` to first HTTP callback"] is True
    assert verdicts["`invoke up` to first gRPC callback"] is False  # 0.9 s against 0.8 s
    assert verdicts["new-TLS-connection callbacks/s, proxy / nginx"] is False
    assert verdicts["keep-alive callbacks/s, proxy / direct to pod"] is True  # the rounds' median, 0.85
    assert verdicts["catalogue replay"] is False  # 30 s against 15 s
    assert verdicts["scale: lost, wall time"] is True
    assert verdicts["redelivery: invocations while 10 workers are SIGKILLed mid-callback"] is False  # twice
    assert verdicts["DNS queries/s, resolver / dnsmasq"] is None  # the section failed: not measured


def test_report_writes_json_and_markdown(tmp_path: Path) -> None:
    report.write(dict(SAMPLE), tmp_path, "invoke bench --quick")
    written = json.loads((tmp_path / "benchmarks.json").read_text())
    assert [t["verdict"] for t in written["targets"]].count("MISSED") == 4
    text = (tmp_path / "benchmarks.md").read_text()
    assert "| figure | target | measured | verdict |" in text and "2 CPUs (cpu)" in text
    assert "**dns failed**" in text


def test_first_ok_callback_reads_event_timestamps(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    lines = [
        {"ts": 5.0, "kind": "worker.callback.result", "ok": False},
        {"ts": 7.0, "kind": "worker.callback.result", "ok": True},
        {"ts": 6.0, "kind": "worker.callback.start"},
    ]
    (events / "w.jsonl").write_text("\n".join(json.dumps(e) for e in lines) + "\n{half a line")
    assert startup.first_ok_callback(tmp_path) == 7.0


def _udp_dns(view: View) -> tuple[socket.socket, threading.Thread]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                data, addr = sock.recvfrom(4096)
            except OSError:
                return
            reply, _ = handle_packet(view, data)
            if reply:
                sock.sendto(reply, addr)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return sock, thread


def test_dns_load_generator_counts_answers_and_rcodes() -> None:
    view = View("compute", records=(wildcard("grpc-worker.example.com", "10.100.0.10"),))
    sock, thread = _udp_dns(view)
    try:
        result = dnsload.load(sock.getsockname(), 300, 5.0)
    finally:
        sock.close()
        thread.join(2)
    assert result["answered"] == 300 and result["lost"] == 0
    assert result["rcodes"] == {"NOERROR": 270, "NXDOMAIN": 30}  # the mix's 10% misses


def test_spawned_group_is_stopped_and_measured(tmp_path: Path) -> None:
    proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log")
    assert procs.group_members(proc.pid) == [proc.pid]
    assert procs.rss_bytes([proc.pid]) > 0
    procs.stop(proc)
    assert proc.returncode is not None and procs.group_members(proc.pid) == []
    with procs.RssSampler(lambda: [proc.pid], interval=0.01) as sampler:
        pass
    assert sampler.samples >= 1


def test_nginx_config_verifies_the_pod(tmp_path: Path) -> None:
    site = NginxSite(
        tmp_path / "tls.crt",
        tmp_path / "tls.key",
        tmp_path / "ca.crt",
        {"10-42-0-11.invocation.nvcf.svc.cluster.local": ("127.0.0.1", 4443)},
    )
    conf = render(site, 8443, tmp_path)
    for directive in (
        "proxy_ssl_verify on;",
        f"proxy_ssl_trusted_certificate {tmp_path / 'ca.crt'};",
        "proxy_ssl_name $host;",
        "listen 127.0.0.1:8443 ssl;",
        "server 127.0.0.1:4443; keepalive",
    ):
        assert directive in conf
    if shutil.which("nginx") is None:
        return
    (tmp_path / "nginx.conf").write_text(conf)
    # Syntax only: the certificate files do not exist, so expect nginx to get past parsing to loading them.
    done = subprocess.run(
        ["nginx", "-t", "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "err.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "tls.crt" in done.stderr or "successful" in done.stderr


@pytest.mark.timeout(60)
def test_minted_callbacks_through_proxy_and_direct(tmp_path: Path) -> None:
    with running(tmp_path, topology(unique_name("smoke"), invocation=1, clusters=1)) as bench:
        result = asyncio.run(keepalive(bench, 5))
        pids = bench.pids()
    assert result["proxy"]["ok"] == 5 and result["direct"]["ok"] == 5
    assert result["ratio"] > 0
    assert procs.rss_bytes(pids) == 0  # every process of the stack is gone


@pytest.mark.parametrize(("check", "code"), [(False, 0), (True, 1)])
def test_bench_writes_into_the_stack_home_and_fails_only_with_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check: bool, code: int
) -> None:
    """`ncpsim bench --quick` on a busy laptop: the committed docs/benchmarks.* stay as they are (git status
    clean) and missed targets are reported, not an exit code, unless --check asks for one."""
    from bench import runner

    docs = {p: p.read_bytes() for p in runner.DOCS.glob("benchmarks.*")}
    monkeypatch.setenv("NCPSIM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(runner.peers, "check", lambda install: frozenset())
    measured = {k: v for k, v in json.loads(json.dumps(SAMPLE)).items() if k != "dns"}  # no failed section
    monkeypatch.setattr(runner, "measure_all", lambda plan, root, absent: measured)
    assert runner.run(quick=True, check=check) == code  # SAMPLE misses four targets
    assert (tmp_path / "home" / "bench" / "benchmarks.json").is_file()
    assert {p: p.read_bytes() for p in runner.DOCS.glob("benchmarks.*")} == docs
