"""The walking skeleton end to end on loopback: real TLS, DNS and HTTP, poked with real clients."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
from stack_records import Records

from clusters.local import LocalStack
from dns.client import resolve_a
from scenarios.result import ScenarioResult
from sim.model.netmap import LiveNetMap, Unreachable

WD = "grpc-worker.example.com"
POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
ATTACH = "/v2/nvcf/worker/request-attach"
pytestmark = pytest.mark.skipif(
    shutil.which("curl") is None or shutil.which("openssl") is None,
    reason="curl and openssl are the real clients these tests use",
)


def proxy_port(stack: LocalStack) -> int:
    return stack.status()["proxy"]["http"]["port"]


def curl(stack: LocalStack, target: str, *extra: str, ca: str = "stack") -> tuple[str, str]:
    """curl through the proxy exactly as the README shows; returns (http_code, http_connect)."""
    port = proxy_port(stack)
    status = stack.status()
    cmd = [
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{http_connect}",
        "--max-time",
        "5",
        "--proxy",
        f"https://invocation.{WD}:{port}",
        "--proxy-cacert",
        status["ca"][ca],
        "--resolve",
        f"invocation.{WD}:{port}:127.0.0.1",
        *extra,
        target,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False).stdout.split()
    return (out + ["000", "000"])[0], (out + ["000", "000"])[1]


def from_curl(user_agent: str | None) -> bool:
    return (user_agent or "").startswith("curl/")


def test_scenario_passes_and_each_callback_reaches_the_pod_holding_it(http_stack) -> None:
    stack, result = http_stack
    assert result.ok, result.failures
    traces = result.steps[0].traces
    assert len(traces) == 10 and all(t.outcome == "success" for t in traces)
    ips = {p["name"]: p["ip"] for p in stack.status()["pods"]}
    for trace in traces:
        assert trace.callee_pods == {trace.pod}
        assert {rec["method"] for rec in trace.proxy} == {"GET", "POST"}
        assert all(rec["upstream_host"] == f"{ips[trace.pod]}:8443" for rec in trace.proxy)
        assert trace.dns == {"name": f"invocation.{WD}", "answer": "10.100.0.10"}
    assert {t.pod for t in traces} == {"invocation-service-0", "invocation-service-1"}


def test_curl_through_the_proxy_gets_the_pods_own_answer(
    http_stack: tuple[LocalStack, ScenarioResult],
) -> None:
    stack, _ = http_stack
    records = Records(stack.state_dir)
    code, _ = curl(stack, f"http://{POD}:8443{ATTACH}")
    assert code == "401"  # the pod's answer for a missing token, not a proxy error
    line = records.access_line(method="GET", path=ATTACH, ua=from_curl)
    assert (line["status"], line["flags"], line["upstream_host"]) == ("401", "-", "10.42.0.11:8443")


def test_curl_other_path_gets_404_nr(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    stack, _ = http_stack
    records = Records(stack.state_dir)
    code, _ = curl(stack, f"http://{POD}:8443/v2/nvcf/pexec/functions/x")
    assert code == "404"
    line = records.access_line(method="GET", path="/v2/nvcf/pexec/functions/x", ua=from_curl)
    assert (line["status"], line["flags"], line["upstream_host"]) == ("404", "NR", "-")


def test_curl_proxytunnel_connect_gets_404(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    stack, _ = http_stack
    records = Records(stack.state_dir)
    _, connect = curl(stack, f"http://{POD}:8443{ATTACH}", "--proxytunnel")
    assert connect == "404"
    line = records.access_line(method="CONNECT", ua=from_curl)
    assert (line["status"], line["flags"]) == ("404", "NR")


def test_curl_with_the_public_ca_fails_verification(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    """Negative control: the stack-CA frontend must not verify against the public-style CA."""
    stack, _ = http_stack
    result = subprocess.run(
        [
            "curl",
            "-s",
            "--max-time",
            "5",
            "--proxy",
            f"https://invocation.{WD}:{proxy_port(stack)}",
            "--proxy-cacert",
            stack.status()["ca"]["public"],
            "--resolve",
            f"invocation.{WD}:{proxy_port(stack)}:127.0.0.1",
            f"http://{POD}:8443{ATTACH}",
        ],
        capture_output=True,
        timeout=10,
        check=False,
    )
    assert result.returncode == 60  # CURLE_PEER_FAILED_VERIFICATION


@pytest.mark.parametrize(("ca", "verified"), [("stack", True), ("public", False)])
def test_openssl_s_client_verifies_only_against_the_stack_ca(http_stack, ca: str, verified: bool) -> None:
    stack, _ = http_stack
    out = subprocess.run(
        [
            "openssl",
            "s_client",
            "-connect",
            f"127.0.0.1:{proxy_port(stack)}",
            "-servername",
            f"invocation.{WD}",
            "-CAfile",
            stack.status()["ca"][ca],
            "-verify_return_error",
        ],
        input=b"",
        capture_output=True,
        timeout=10,
        check=False,
    )
    text = out.stdout.decode() + out.stderr.decode()
    assert ("Verify return code: 0 (ok)" in text) is verified
    assert (out.returncode == 0) is verified


def test_wrong_sni_fails_hostname_verification(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    """Negative control: the frontend certificate covers *.<workerDomain> only."""
    stack, _ = http_stack
    ctx = ssl.create_default_context(cafile=stack.status()["ca"]["stack"])
    for name, ok in ((f"invocation.{WD}", True), ("invocation.other.example", False), (WD, False)):
        with socket.create_connection(("127.0.0.1", proxy_port(stack)), timeout=5) as sock:
            if ok:
                with ctx.wrap_socket(sock, server_hostname=name) as tls:
                    assert tls.version()
            else:
                with pytest.raises(ssl.SSLCertVerificationError):
                    ctx.wrap_socket(sock, server_hostname=name)


def test_dns_views_answer_as_each_cluster_would(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    stack, _ = http_stack
    dns = stack.status()["dns"]

    async def ask(cluster: str, name: str) -> list[str]:
        return await resolve_a(name, ("127.0.0.1", dns[cluster]["port"]))

    assert asyncio.run(ask("ncpsim-compute-1", f"10-42-0-11.{WD}")) == ["10.100.0.10"]
    assert asyncio.run(ask("ncpsim-compute-1", f"invocation.{WD}")) == ["10.100.0.10"]
    assert asyncio.run(ask("ncpsim-cp", POD)) == ["10.42.0.11"]
    if shutil.which("dig"):
        out = subprocess.run(
            ["dig", "@127.0.0.1", "-p", str(dns["ncpsim-compute-1"]["port"]), "+short", f"10-42-0-12.{WD}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        assert out.strip() == "10.100.0.10"


def test_compute_cluster_dial_to_a_pod_ip_is_unreachable(
    http_stack: tuple[LocalStack, ScenarioResult],
) -> None:
    stack, _ = http_stack
    netmap = LiveNetMap(stack.state_dir / "netmap.json")
    assert netmap.lookup("ncpsim-cp", "10.42.0.11", 8443)[0] == "127.0.0.1"
    with pytest.raises(Unreachable):
        netmap.lookup("ncpsim-compute-1", "10.42.0.11", 8443)


def test_status_json_contract(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    stack, _ = http_stack
    status = stack.status()
    for key in ("backend", "scenario", "workerDomain", "stateDir", "proxy", "dns", "ca", "pods", "logs"):
        assert key in status
    for front in ("http", "h3"):
        assert {"host", "port", "name", "url"} <= set(status["proxy"][front])
    assert status["proxy"]["http"]["url"] == f"https://invocation.{WD}:10084"
    assert Path(status["ca"]["stack"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert {p["role"] for p in status["pods"]} == {"invocation"}
    assert all({"name", "role", "cluster", "ip", "target"} <= set(p) for p in status["pods"])
    assert json.loads(json.dumps(status)) == status


def test_keys_are_private(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    stack, _ = http_stack
    keys = list((stack.state_dir / "certs").rglob("*.key"))
    assert keys
    for key in keys:
        assert key.resolve().stat().st_mode & 0o077 == 0, key
