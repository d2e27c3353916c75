"""A deliberately failing scenario through `ncpsim replay --keep --junit`: the reports name the step and the
expectation, the failed stack is kept for inspection, and its sequence page renders in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_support import ncpsim

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
HEADER_FILL = (0xEE, 0xF2, 0xF7)  # scenarios.sequence_html: the lane headers' fill
STEP2 = "step 2 (the public CA is wrongly expected to break callbacks)"

FAILING = """\
name: deliberately-failing
summary: a scenario whose second step expects the wrong thing
seed: 3
values:
  workerCallbackProxy:
    enabled: true
    workerDomain: grpc-worker.example.com
    service: {type: LoadBalancer}
    tls:
      frontend:
        existingSecret: worker-public-tls
topology:
  invocationReplicas: 2
  grpcProxyReplicas: 0
  computeClusters:
    - workers: [{count: 1, trust: system}]
steps:
  - name: callbacks work with a public frontend
    invoke: {function: http-echo, count: 2}
    expect: {outcome: success, via: proxy}
  - name: the public CA is wrongly expected to break callbacks
    invoke: {function: http-echo, count: 2}
    expect: {outcome: failure, proxyStatus: 503, proxyFlag: UF}
"""


@dataclass
class Failed:
    done: subprocess.CompletedProcess
    junit: Path
    state: Path
    running_after: list[str]


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Failed]:
    root = tmp_path_factory.mktemp("failing")
    scenario = root / "deliberately-failing.yaml"
    scenario.write_text(FAILING)
    env = {**os.environ, "NCPSIM_HOME": str(root / "state")}
    stack = "replay-deliberately-failing"
    try:
        # --keep leaves the failed stack running after the command (its zygote the shared one's fork, so
        # nothing of it is a child of the test)
        junit = str(root / "junit.xml")
        done = ncpsim("replay", f"scenario={scenario}", "--keep", "--junit", junit, env=env)
        status = json.loads(ncpsim("status", "--json", "--stack", stack, env=env).stdout or "{}")
        yield Failed(done, root / "junit.xml", root / "state" / stack, status.get("running", []))
    finally:
        ncpsim("down", "--stack", stack, env=env)


def test_exit_code_and_text_report_name_step_and_expectation(failed: Failed) -> None:
    out = failed.done.stdout
    assert failed.done.returncode == 1, out + failed.done.stderr
    assert "\x1b[" not in out  # plain text when not on a terminal
    assert "FAIL deliberately-failing" in out and "✓ step 1 (callbacks work with a public frontend)" in out
    assert (
        f"{STEP2}: expected outcome failure, but it succeeded (client status 200) (invocations 1, 2 of 2)"
        in out
    )
    assert f"{STEP2}: expected proxy answering 503 UF, but the access log shows 200 -, 200 -" in out
    assert "0/1 scenarios passed" in out


def test_junit_failure_names_step_and_expectation(failed: Failed) -> None:
    (case,) = ET.parse(failed.junit).getroot().findall("testcase")
    failure = case.find("failure")
    assert case.get("name") == "deliberately-failing" and failure is not None
    assert failure.get("message", "").startswith(f"{STEP2}: expected outcome failure, but it succeeded")


def test_keep_leaves_the_failed_stack_running_with_its_reports(failed: Failed) -> None:
    assert "worker-callback-proxy" in failed.running_after and "ncpsim-compute-1" in failed.running_after
    report = json.loads((failed.state / "reports" / "report.json").read_text())
    assert report["ok"] is False and report["steps"][1]["failures"][0].startswith(STEP2)
    mermaid = (failed.state / "reports" / "sequence.mmd").read_text()
    assert mermaid.startswith("sequenceDiagram\n") and "participant dns as DNS" in mermaid
    assert f"Note over client,pod_invocation_service_1: FAILED {STEP2}" in mermaid
    assert f"sequence diagram (HTML): {failed.state / 'reports' / 'sequence.html'}" in failed.done.stdout


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--force-device-scale-factor=1",
        "--window-size=1600,1400",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], check=False, capture_output=True, text=True, timeout=60)


def png_rows(path: Path) -> Iterator[bytes]:
    """RGB(A) rows, top to bottom, of an 8-bit PNG as Chromium writes it (unfiltered lazily: the lanes'
    headers are near the top, so a caller stops long before the end)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, chunks = 8, b"", {}
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunks.setdefault(kind, data[pos + 8 : pos + 8 + length])
        idat += data[pos + 8 : pos + 8 + length] if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert depth == 8 and colour in (2, 6)
    bpp = 3 if colour == 2 else 4
    raw, stride, prev = zlib.decompress(idat), width * bpp, bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a, b = line[i - bpp] if i >= bpp else 0, prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            paeth = a if abs(p - a) <= min(abs(p - b), abs(p - c)) else b if abs(p - b) <= abs(p - c) else c
            line[i] = (line[i] + (0, a, b, (a + b) // 2, paeth)[kind]) & 0xFF
        prev = line
        yield b"".join(bytes(line[x : x + 3]) for x in range(0, stride, bpp))  # drop alpha


def lane_header_runs(png: Path) -> list[tuple[int, int]]:
    """Horizontal runs of the lane-header fill a few rows into the headers: one run per lane drawn."""
    fill, seen = bytes(HEADER_FILL), 0
    for row in png_rows(png):
        pixels = [row[x : x + 3] for x in range(0, len(row), 3)]
        seen += 1 if seen or fill in pixels else 0
        if seen == 3:  # below the rectangles' top edge, above the lane names
            runs, start = [], None
            for x, pixel in enumerate([*pixels, b""]):
                if pixel == fill and start is None:
                    start = x
                elif pixel != fill and start is not None:
                    runs.append((start, x - start))
                    start = None
            return runs
    return []


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does it)"
)
def test_sequence_page_draws_worker_dns_proxy_and_pod_lanes_in_chromium(
    failed: Failed, tmp_path: Path
) -> None:
    page, shot = (failed.state / "reports" / "sequence.html").as_uri(), tmp_path / "sequence.png"
    dom = _chromium("--dump-dom", f"--screenshot={shot}", page, profile=tmp_path / "profile").stdout
    for lane, label in (
        ("worker", "worker"),
        ("dns", "DNS"),
        ("proxy", "proxy"),
        ("pod_invocation_service_0", "invocation-service-0"),
    ):
        assert f'id="lane-{lane}" data-lane="{label}"' in dom, lane
    assert dom.count('class="msg call"') >= 8 and f"FAILED {STEP2}" in dom
    runs = lane_header_runs(shot)
    # client, worker, DNS, proxy, two pods: six headers, evenly spaced as the layout puts them
    assert len(runs) == 6, runs
    assert all(abs(w - runs[0][1]) <= 2 for _, w in runs) and runs[0][1] > 150
    gaps = {runs[i + 1][0] - runs[i][0] for i in range(5)}
    assert max(gaps) - min(gaps) <= 2, gaps
    print(f"sequence diagram screenshot: {shot}")
