"""Smoke tests of the benchmark's pieces (bench/): judging, reports, load generators, process handling.

Fast on purpose: one small stack for the callback generator, everything else without a stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import h11
import pytest
import trustme
from nats.js.errors import ServiceUnavailableError

from bench import calibration, dnsload, peers, procs, report, startup
from bench import nginx as bench_nginx
from bench.as_filed import SCENARIOS as AS_FILED
from bench.calibration import Yardstick, absolute_times, describe, yardstick
from bench.callbacks import Minter, open_stream
from bench.nginx import NginxSite, nginx, render
from bench.relay import keepalive, nginx_site
from bench.stacks import running, topology, unique_name
from bench.startup import REPO
from bench.targets import judge
from dns.rule import View, wildcard
from dns.server import handle_packet
from sim.protocols.http1 import H11Stream, exchange, read_body, respond
from sim.protocols.tls import client_context

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
        "http": {
            "median": 0.55,
            "min": 0.5,
            "max": 0.6,
            "cold_seconds": 1.5,
            "failed_runs": 0,
            "cli_cpu_median": 0.8,
        },
        "grpc": {"median": 0.9, "min": 0.8, "max": 1.0, "cold_seconds": 1.9, "failed_runs": 0},
    },
    "catalogue": {
        "seconds": 30.0,
        "exit": 0,
        "passed": 16,
        "total": 16,
        "as_filed": {"seconds": 27.0, "exit": 0, "passed": 60, "total": 60},  # 54 loops of 0.5 s
    },
    "calibration": {
        "start": {"loop_runs": [0.6, 0.5, 0.55], "start_runs": [0.03, 0.025, 0.04, 0.03, 0.03]},
        "end": {"loop_runs": [0.52, 0.7, 0.6], "start_runs": [0.02, 0.03, 0.03, 0.03, 0.03]},
    },
    "relay": {
        "keepalive": {
            "ratio": 0.7,
            "round_ratio_median": 1.05,
            "round_ratio_range": [0.6, 1.1],
            "proxy": {"per_second": 40.0, "relay_cpu_ms_per_call": 1.5},
            "nginx": {"per_second": 57.0, "relay_cpu_ms_per_call": 0.5},
            "direct": {"per_second": 100.0},
            "vs_direct": {"ratio": 0.4, "round_ratio_median": 0.45, "round_ratio_range": [0.3, 0.5]},
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
        "peak_rss_mib_by_role": {"nats": 100.0, "ncpsim-compute": 200.0},
        "peak_pss_mib": 250.0,
        "peak_pss_mib_by_role": {"nats": 80.0, "ncpsim-compute": 150.0, "supervisor": 20.0},
        "peak_machine_used_mib": 280.0,
        "kernel_mib_at_machine_peak": {"PageTables": 3.0, "SUnreclaim": 40.0},
        "end_pss_mib": 240.0,
        "end_pss_anon_mib": 230.0,
        "freed_by_down_mib": 255.0,
        "kernel_freed_by_down_mib": {"PageTables": 2.0, "SUnreclaim": 12.0},
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
    assert verdicts["`ncpsim up` to first HTTP callback"] is True
    assert verdicts["`ncpsim up` to first gRPC callback"] is False  # 0.9 s against 0.8 s
    assert verdicts["new-TLS-connection callbacks/s, proxy / nginx"] is False
    assert verdicts["keep-alive callbacks/s, proxy / nginx"] is True  # the rounds' median, 1.05
    assert verdicts["keep-alive callbacks/s, proxy / direct to pod"] is None  # shown, judged against nothing
    assert verdicts["catalogue replay"] is False  # 30 s against 15 s
    assert verdicts["catalogue as filed"] is True  # 27 s at the best loop of 0.5 s: 54 loops
    assert verdicts["scale: lost, wall time"] is True
    assert verdicts["redelivery: invocations while 10 workers are SIGKILLed mid-callback"] is False  # twice
    assert verdicts["DNS queries/s, resolver / dnsmasq"] is None  # the section failed: not measured


def test_scale_verdict_is_on_pss_and_on_rss_only_without_it() -> None:
    """The peak judged is the PSS sum; the RSS sum (which counts the zygote's shared pages once per
    component) only where the platform reads no PSS, since it can only overstate."""

    def scale_met(**memory: float) -> bool | None:
        results = {"scale": {**SAMPLE["scale"], **memory}}
        return next(row.met for row in judge(results) if row.figure.startswith("scale:"))

    assert scale_met(peak_rss_mib=2300.0, peak_pss_mib=1900.0) is True
    assert scale_met(peak_rss_mib=2300.0, peak_pss_mib=2100.0) is False
    assert scale_met(peak_rss_mib=2300.0, peak_pss_mib=0.0) is False  # no PSS read: the RSS sum is judged
    assert scale_met(peak_rss_mib=1900.0, peak_pss_mib=0.0) is True


def test_kernel_allocations_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nPageTables:    8 kB\nSUnreclaim:  2 kB\nShmem: 0 kB\n")
    assert procs.kernel_bytes(meminfo) == {"PageTables": 8192, "SUnreclaim": 2048, "Shmem": 0}
    assert procs.kernel_bytes(tmp_path / "absent") == {}


def test_report_writes_json_and_markdown(tmp_path: Path) -> None:
    report.write(dict(SAMPLE), tmp_path, "ncpsim bench --quick")
    written = json.loads((tmp_path / "benchmarks.json").read_text())
    assert [t["verdict"] for t in written["targets"]].count("MISSED") == 4
    text = (tmp_path / "benchmarks.md").read_text()
    assert "| figure | target | measured | verdict |" in text and "2 CPUs (cpu)" in text
    assert "**dns failed**" in text
    assert (
        "by role at the peak (ncpsim-compute: the worker hosts): {'nats': 100.0, 'ncpsim-compute': 200.0}"
        in text
    )
    assert "peak PSS (MiB) by role at the peak (the verdict's figure): {'nats': 80.0," in text
    assert "peak PSS 250 MiB (RSS sum 300, machine +280, down gave back 255)" in text
    assert "got back at `down`: 255.0 MiB, against a PSS sum of 240.0 MiB just before it, 230.0 MiB" in text
    assert "the kernel's part of it (MiB): {'PageTables': 2.0, 'SUnreclaim': 12.0}" in text
    assert "less before `up`: 280.0 MiB; the kernel's allocations then (MiB): {'PageTables': 3.0," in text
    # Each absolute time also in the run's units: the first HTTP callback (0.55 s) is 1.1 loops of 0.5 s.
    assert "0.55 s (0.50-0.60) = 1.1 loops, 27.5 starts" in text
    assert "| catalogue replay | 30 s | 60 | 1500 |" in text
    # The current figures and the method only: the rounds' history is linked, not copied.
    assert "[bench/findings.md](../bench/findings.md)" in text and "Round five" not in text


@pytest.mark.parametrize(
    ("calibration", "loop", "start", "drift"),
    [
        (SAMPLE["calibration"], 0.5, 0.02, 0.04),  # the best of both ends; the end's best loop 4 % slower
        ({"start": {"loop_runs": [0.4], "start_runs": [0.02]}}, 0.4, 0.02, None),  # one end: no drift
        (
            {"start": {"loop_runs": [0.4], "start_runs": [0.02]}, "end": {"failed": "OSError: x"}},
            0.4,
            0.02,
            None,
        ),
    ],
)
def test_yardstick_is_the_best_of_both_ends(
    calibration: dict, loop: float, start: float, drift: float | None
) -> None:
    stick = yardstick({"calibration": calibration})
    assert stick is not None and (stick.loop, stick.start) == (loop, start)
    assert stick.drift == pytest.approx(drift) if drift is not None else stick.drift is None
    assert yardstick({}) is None and yardstick({"calibration": {"start": {"failed": "x"}}}) is None


def test_a_machine_that_changed_speed_mid_run_is_said() -> None:
    steady = describe(Yardstick(0.5, 0.02, 0.1))
    moved = describe(Yardstick(0.5, 0.02, -0.3))
    assert "moved" not in steady and "-30%" in moved and "rougher" in moved


def test_absolute_times_are_found_and_rates_inverted() -> None:
    times = dict(absolute_times(SAMPLE))
    assert times["`ncpsim up` to first HTTP callback, median of warm runs"] == 0.55
    assert times["`ncpsim up` to first gRPC callback, cold"] == 1.9
    assert times["`ncpsim up` HTTP: CPU of the command line and its zygote, median of warm runs"] == 0.8
    assert "`ncpsim up` gRPC: CPU of the command line and its zygote, median of warm runs" not in times
    assert times["keep-alive callback via nginx (1/rate)"] == pytest.approx(1 / 57)
    assert times["keep-alive relay CPU per callback, proxy"] == pytest.approx(0.0015)
    assert times["scale: wall time (up + callbacks)"] == 5.0
    assert not any("DNS" in label for label in times)  # the section failed: nothing to convert


def test_calibration_runs_the_interpreter() -> None:
    """The plumbing, with a loop that reports a fixed time: the loop's own figure, and a real `python -c pass`."""
    got = calibration.measure(timed_loop="print(0.25)", loop_runs=2, start_runs=1)
    assert got["loop_runs"] == [0.25, 0.25]
    assert len(got["start_runs"]) == 1 and 0 < got["start_runs"][0] < 10


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


def test_dns_turns_sum_into_one_measurement() -> None:
    turn = {"sent": 100, "lost": 0, "rcodes": {"NOERROR": 90, "NXDOMAIN": 10}}
    turns = [
        turn | {"answered": 100, "seconds": 0.5, "per_second": 200.0, "client_cpu_us_per_query": 10.0},
        turn | {"answered": 100, "seconds": 1.5, "per_second": 66.7, "client_cpu_us_per_query": 20.0},
    ]
    summed = dnsload._summed([t | {"server_cpu_seconds": 0.001} for t in turns])
    assert summed["answered"] == 200 and summed["sent"] == 200 and summed["seconds"] == 2.0
    assert summed["per_second"] == 100.0  # over the summed time, not the mean of the rates (133.3)
    assert summed["rcodes"] == {"NOERROR": 180, "NXDOMAIN": 20}
    assert summed["client_cpu_us_per_query"] == 15.0 and summed["server_cpu_us_per_query"] == 10.0
    assert summed["round_rates"] == [200.0, 66.7]


def test_spawned_group_is_stopped_and_measured(tmp_path: Path) -> None:
    proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log")
    assert procs.group_members(proc.pid) == [proc.pid]
    assert procs.rss_bytes([proc.pid]) > 0
    with procs.MemorySampler(lambda: {"sleeper": [proc.pid], "gone": []}, interval=0.01) as sampler:
        pass
    assert sampler.samples >= 1 and sampler.peak > 0
    assert sampler.peak_by_role == {"sleeper": sampler.peak, "gone": 0}  # the roles add up to the peak
    assert 0 < sampler.peak_pss <= sampler.peak  # the first sample reads PSS too; a page counts once at most
    assert sampler.peak_pss_by_role == {"sleeper": sampler.peak_pss, "gone": 0}
    assert sampler.peak_machine >= sampler.peak_pss  # the machine holds the sleeper and everything else
    assert sampler.kernel_at_peak.get("PageTables", 0) > 0 or not Path("/proc/meminfo").exists()
    assert procs.gone([proc.pid], timeout=0.05) == [proc.pid]  # still running
    procs.stop(proc)
    assert proc.returncode is not None and procs.group_members(proc.pid) == []
    assert procs.gone([proc.pid]) == []


def test_cpu_and_memory_of_processes_as_the_kernel_counts_them() -> None:
    """psutil's figures are the kernel's: this process's CPU as os.times() has it, a parent and the child
    it forked found by their group, a process that is gone reads as nothing."""
    before = os.times()
    measured = procs.cpu_seconds([os.getpid()])
    after = os.times()
    assert before.user + before.system - 0.02 <= measured <= after.user + after.system + 0.02
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only waits to be counted
        time.sleep(60)
        os._exit(0)
    try:
        assert {os.getpid(), child} <= set(procs.group_members(os.getpgid(0)))
        assert procs.groups_members([os.getpgid(0), 999_999_999])[999_999_999] == []
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert procs.cpu_seconds([child]) == procs.rss_bytes([child]) == procs.pss_bytes([child]) == 0


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
        "server 127.0.0.1:4443; keepalive 64; keepalive_requests 1000000; keepalive_timeout 300s;",
        "  keepalive_requests 1000000;\n  keepalive_timeout 300s;",  # the worker's connection, kept alive
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


POD_NAME = "10-42-0-11.invocation.nvcf.svc.cluster.local"
ATTACH_URL = f"http://{POD_NAME}:8443/v2/nvcf/worker/request-attach"  # absolute form, as a worker sends it
SNI = "invocation.grpc-worker.example.com"  # the worker's name for the proxy
SHORT = 5.0  # a loopback exchange takes milliseconds; this only bounds a broken relay


class StubPod:
    """A pod's 8443 on loopback: TLS with a certificate for `name`, 200 to every request, connections counted."""

    def __init__(self, ca: trustme.CA, name: str):
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert(name).configure_cert(self.tls)
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        stream = H11Stream(h11.SERVER, reader, writer)
        try:
            while isinstance(await stream.next_event(SHORT), h11.Request):
                await read_body(stream, SHORT)
                await respond(stream, 200, b"from the pod")
                if not stream.reusable():
                    return
                stream.next_cycle()
        finally:
            writer.close()


async def _three_callbacks_through_nginx(folder: Path, site: NginxSite, pod: StubPod) -> list[int | str]:
    """Three requests on one kept-alive TLS connection to nginx: each one's status, or "closed"."""
    server = await asyncio.start_server(pod.serve, "127.0.0.1", 0, ssl=pod.tls)
    site = replace(site, pods={POD_NAME: ("127.0.0.1", server.sockets[0].getsockname()[1])})
    statuses: list[int | str] = []
    try:
        with nginx(site, folder / "nginx") as peer:
            stream = await open_stream(("127.0.0.1", peer.port), client_context([site.upstream_ca]), SNI)
            for _ in range(3):
                try:
                    got = await exchange(
                        stream, "GET", ATTACH_URL, [("host", f"{POD_NAME}:8443")], timeout=SHORT
                    )
                    statuses.append(got.status)
                except (ConnectionError, h11.ProtocolError):
                    statuses.append("closed")
            await stream.aclose()
    finally:
        server.close()
        await server.wait_closed()
    return statuses


@pytest.mark.skipif(
    peers.located("nginx") is None, reason="nginx is not installed (apt-get install nginx-light)"
)
@pytest.mark.parametrize(
    ("case", "pool", "pod_cert", "requests", "statuses", "upstream_connections"),
    [
        ("keep-alive both sides", True, POD_NAME, None, [200, 200, 200], 1),
        ("no upstream pool: the control", False, POD_NAME, None, [200, 200, 200], 3),
        ("a worker connection closed after 2: the control", True, POD_NAME, 2, [200, 200, "closed"], 1),
        (
            "another pod's certificate: verified",
            True,
            "10-42-0-12.invocation.nvcf.svc.cluster.local",
            None,
            [502] * 3,
            None,
        ),
    ],
)
def test_nginx_relays_kept_alive_callbacks(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    pool: bool,
    pod_cert: str,
    requests: int | None,
    statuses: list[int | str],
    upstream_connections: int | None,
) -> None:
    """The keep-alive peer: one worker connection carries every callback, and nginx's upstream pool one
    connection to the pod for all of them, still verifying the pod's certificate against the CA and name."""
    if requests is not None:
        monkeypatch.setattr(bench_nginx, "KEEPALIVE_REQUESTS", requests)
    ca = trustme.CA()
    frontend = ca.issue_cert("*.grpc-worker.example.com")
    frontend.cert_chain_pems[0].write_to_path(tmp_path / "tls.crt")
    frontend.private_key_pem.write_to_path(tmp_path / "tls.key")
    ca.cert_pem.write_to_path(tmp_path / "ca.crt")
    site = NginxSite(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt", {}, pool)
    pod = StubPod(ca, pod_cert)
    assert asyncio.run(_three_callbacks_through_nginx(tmp_path, site, pod)) == statuses, case
    if upstream_connections is not None:
        assert pod.connections == upstream_connections, case


class ElectingPuller:
    """A work pull whose consumer has no leader yet for its first `refusals` pulls (JetStream's 503)."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.pulls = refusals, 0

    async def fetch(self, timeout: float) -> object:
        self.pulls += 1
        if self.pulls <= self.refusals:
            raise ServiceUnavailableError
        if self.pulls > self.refusals + 1:
            await asyncio.sleep(timeout)  # nothing more to pull
            return None
        return FakeWork()


class FakeWork:
    data = b'{"requestId": "r-1"}'

    async def ack(self) -> None:
        pass


@pytest.mark.parametrize("refusals", [0, 3])
def test_the_minters_pull_waits_out_a_jetstream_electing_its_leader(refusals: int) -> None:
    """CI on a fresh machine: the first pull of a just-started stack got 503, the pump ended, and the bench
    waited 30 s for work that had come. It pulls again, as a worker's pull loop does."""
    puller = ElectingPuller(refusals)

    async def first_work() -> dict[str, str]:
        minter = Minter(None, None)  # type: ignore[arg-type]  # the pump reads neither
        pump = asyncio.create_task(minter._pump(puller))  # type: ignore[arg-type]
        try:
            return await asyncio.wait_for(minter.queue.get(), 5)
        finally:
            pump.cancel()

    assert asyncio.run(first_work()) == {"requestId": "r-1"}


@pytest.mark.timeout(60)
def test_minted_callbacks_through_proxy_nginx_and_direct(tmp_path: Path) -> None:
    """The keep-alive comparison on a real stack: the same minted callbacks through ncpsim's proxy, through
    nginx to the same pod (when installed), and straight to the pod."""
    installed = peers.located("nginx") is not None
    with running(tmp_path, topology(unique_name("smoke"), invocation=1, clusters=1)) as bench:
        pod = bench.topology.pods_of("invocation")[0]
        with contextlib.ExitStack() as started:
            site = nginx_site(bench, pod, True)
            peer = started.enter_context(nginx(site, tmp_path / "nginx")) if installed else None
            result = asyncio.run(keepalive(bench, 5, peer))
        pids = bench.pids()
    assert result["proxy"]["ok"] == 5 and result["direct"]["ok"] == 5
    assert result["vs_direct"]["ratio"] > 0
    if installed:
        assert result["nginx"]["ok"] == 5 and result["ratio"] > 0
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


def test_the_catalogue_as_filed_is_judged_in_loops_and_still_in_the_catalogue() -> None:
    """The 60 scenarios issue 32 was filed with, each still a catalogue scenario; judged in the run's loops."""
    assert len(AS_FILED) == len(set(AS_FILED)) == 60
    assert set(AS_FILED) <= {path.stem for path in (REPO / "scenarios" / "catalogue").glob("*.yaml")}

    def met(seconds: float, code: int = 0) -> bool | None:
        as_filed = {"seconds": seconds, "exit": code}
        results = {**SAMPLE, "catalogue": {**SAMPLE["catalogue"], "as_filed": as_filed}}
        return next(row.met for row in judge(results) if row.figure.startswith("catalogue as filed"))

    assert met(27.0) is True and met(27.6) is False and met(20.0, code=1) is False


def test_the_quic_ratio_is_judged_on_the_median_of_its_rounds() -> None:
    """Both stacks take turns (bench.quic): one slow round spoils that round, not the figure; a result from
    before the turns (no rounds) is judged on its one ratio."""
    quic = {
        "via_proxy": {"unary": {"per_second": 75.0}},
        "direct_stack": {"unary": {"per_second": 100.0}},
        "unary_ratio": 0.75,
        "callback_ratio": 0.95,
    }

    def met(**extra: object) -> bool | None:
        results = {**SAMPLE, "quic": {**quic, **extra}}
        return next(row.met for row in judge(results) if row.figure.startswith("QUIC path"))

    assert met(round_ratio_median=0.82, round_ratio_range=[0.5, 0.9]) is True
    assert met(round_ratio_median=0.78, round_ratio_range=[0.7, 0.9]) is False
    assert met() is False  # 0.75, one measurement
