"""The proxy's failures as Envoy shows them, on stacks of their own (issue 11 items 3 and 4; issue 16 item 10):
UF names the host tried, gRPC traces carry the worker's cause, idle connections and tunnels close after
Envoy's idle timeout (shortened), and a pod that dies mid-response reads in ncpsim's words on the worker.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_wire import NO_POD, POD, SHORT, DyingPod, Wire, connect, marked, rebind, request
from stack_records import Records

from clusters.local import LocalBackend, LocalStack
from scenarios.devenv import call_step, run_steps
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.result import ScenarioResult
from sim.proxy.policy import upstream_reset
from sim.wire import DF_BODY

CHAIN_FAILED = "verify cert failed: X509_verify_cert: certificate verification error at depth 0: "
from sim.proxy.downstream import IDLE_ENV

IDLE = 0.5  # NCPSIM_PROXY_CONNECTION_IDLE for the idle stack (Envoy's 1 h, scaled down)
TRICKLE = 0.1  # gap between a steady tunnel's bytes: well inside IDLE


# UF: the host tried (issue 11 item 4); gRPC traces carry the worker's cause (issue 11 item 3) ------------------
EXPIRED_POD_CERTS = """
name: expired-pod-certs
summary: Both kinds of pod serve an expired certificate; the proxy refuses them as upstreams (503 UF)
seed: 7
values:
  workerCallbackProxy: {enabled: true, workerDomain: grpc-worker.example.com, service: {type: LoadBalancer}}
  global: {nvcaOperator: {agent: {workerCallbackCaPem: "@stack-ca"}}}
  nats: {config: {cluster: {enabled: false}}}   # one NATS server: not about the NATS cluster
topology:
  invocationReplicas: 1
  grpcProxyReplicas: 1
  computeClusters:
    - workers: [{count: 1, trust: system}]
steps:
  - name: the invocation pod's certificate expired
    fault: {expire: invocation}
  - name: HTTP callbacks
    invoke: {function: http-echo, count: 2}
    expect: {outcome: failure, proxyStatus: 503, proxyFlag: UF}
  - name: the grpc-proxy pod's certificate expired
    fault: {expire: grpc-proxy}
  - name: a gRPC call the client gives up on first
    invoke: {function: grpc-echo, count: 1, timeout: 0.3}   # shorter than the worker's five retries
    expect: {outcome: failure, proxyStatus: 503, proxyFlag: UF}
"""


@pytest.fixture(scope="module")
def expired(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScenarioResult]:
    root = tmp_path_factory.mktemp("ncpsim-uf")
    scenario = root / "expired-pod-certs.yaml"
    scenario.write_text(EXPIRED_POD_CERTS)
    stack = LocalStack("fidelity-uf", root=root)
    try:
        yield run_scenario(load_scenario(str(scenario)), LocalBackend(stack.root), stack.name, keep=True)
    finally:
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


def test_uf_names_the_host_tried_and_counts_its_body(expired: ScenarioResult) -> None:
    """Each callback's GET gets 503 UF; the line names the pod address the proxy dialed and the reply's
    body bytes, and the replay gives it to the callback though no request id links them."""
    assert expired.ok, expired.failures
    traces = expired.steps[1].traces
    assert len(traces) == 2
    for trace in traces:
        assert [
            (rec["method"], rec["status"], rec["flags"], rec["upstream_host"]) for rec in trace.proxy
        ] == [("GET", "503", "UF", "10.42.0.11:8443")]
        # Envoy's body: the reset reason, then the TLS error and the validator's detail (the certificate's
        # own problem, ahead of the name)
        body = upstream_reset("tls", f"{CHAIN_FAILED}certificate has expired")
        assert trace.proxy[0]["tx"] == str(len(body))
        assert trace.error == f"GET request failed with status code 503: {body}"
    assert len({trace.proxy[0]["request_id"] for trace in traces}) == 2  # one line each, none shared


def test_grpc_trace_carries_the_workers_cause(expired: ScenarioResult) -> None:
    """The client gives up first (DEADLINE_EXCEEDED); the trace still says what the worker got."""
    (trace,) = expired.steps[3].traces
    assert trace.outcome == "failure" and trace.worker_stage == "callback"
    assert "DEADLINE_EXCEEDED" not in (trace.error or "")
    assert trace.error == f"unexpected status 503 from CONNECT proxy: {upstream_reset('quic-tls')}"
    assert trace.cause == f"HTTP 503: {upstream_reset('quic-tls')}"  # ncpsim's account, in the events


# Idle timeouts (issue 16 item 10) ------------------------------------------------------------------------------
CONNECT_ON = "workerCallbackProxy:\n  invocation:\n    connect:\n      enabled: true\n"


@pytest.fixture(scope="module")
def idle_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """CONNECT on, and Envoy's 1 h idle timeout shortened to IDLE through the proxy's environment."""
    root = tmp_path_factory.mktemp("ncpsim-idle")
    values = root / "connect-on.yaml"
    values.write_text(CONNECT_ON)
    stack = LocalStack("fidelity-idle", root=root)
    saved = os.environ.get(IDLE_ENV)
    os.environ[IDLE_ENV] = str(IDLE)
    try:
        try:
            result = run_scenario(
                load_scenario("http-callback", values), LocalBackend(stack.root), stack.name, keep=True
            )
        finally:
            if saved is None:
                os.environ.pop(IDLE_ENV, None)
            else:
                os.environ[IDLE_ENV] = saved
        assert result.ok, result.failures
        yield stack
    finally:
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


def test_an_idle_connection_is_closed(idle_stack: LocalStack) -> None:
    started = time.monotonic()
    with connect(idle_stack) as tls:
        assert Wire(tls).closed_within(SHORT)
    assert IDLE <= time.monotonic() - started < SHORT


def tunnel(stack: LocalStack) -> Wire:
    wire = Wire(connect(stack))
    wire.send(request(f"CONNECT {POD}:8443 HTTP/1.1", marked("tunnel")))
    line, _ = wire.head()
    assert line == b"HTTP/1.1 200 OK"
    return wire


def test_an_idle_connect_tunnel_is_closed_and_logged(idle_stack: LocalStack) -> None:
    records = Records(idle_stack.state_dir)
    started = time.monotonic()
    wire = tunnel(idle_stack)
    with wire.tls:
        assert wire.closed_within(SHORT)
    assert IDLE <= time.monotonic() - started < SHORT
    rec = records.access_line(method="CONNECT", request_id="ef-tunnel")
    assert (rec["status"], rec["flags"], rec["upstream_host"]) == ("200", "-", "10.42.0.11:8443")


def test_connect_to_an_unknown_pod_says_dns(idle_stack: LocalStack) -> None:
    records = Records(idle_stack.state_dir)
    with connect(idle_stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"CONNECT {NO_POD}:8443 HTTP/1.1", marked("connect-df"), host=f"{NO_POD}:8443"))
        line, _, body = wire.response()
    assert (line, body) == (b"HTTP/1.1 503 Service Unavailable", DF_BODY.encode())
    rec = records.access_line(request_id="ef-connect-df")
    assert (rec["flags"], rec["tx"], rec["upstream_host"]) == ("DF", str(len(DF_BODY)), "-")


def test_a_tunnel_with_steady_bytes_is_not_idle(idle_stack: LocalStack) -> None:
    """Negative control: idle means no bytes either way, not a long tunnel."""
    wire = tunnel(idle_stack)
    with wire.tls:
        wire.send(b"\x16\x03\x01\x40\x00")  # a TLS record head announcing 16 KiB: the pod waits for it all
        for _ in range(int(2 * IDLE / TRICKLE)):
            wire.send(b"\x00")  # a byte of that record every TRICKLE seconds
            time.sleep(TRICKLE)
        assert not wire.closed_within(TRICKLE)


# A pod that dies mid-response, as the worker tells it (issue 16 item 10) ---------------------------------------
QUIET = """
name: quiet
summary: One invocation pod and one worker behind the proxy, nothing called yet (the proxy has no parked connection)
seed: 9
values:
  workerCallbackProxy: {enabled: true, workerDomain: grpc-worker.example.com, service: {type: LoadBalancer}}
  global: {nvcaOperator: {agent: {workerCallbackCaPem: "@stack-ca"}}}
  nats: {config: {cluster: {enabled: false}}}   # one NATS server: not about the NATS cluster
topology:
  invocationReplicas: 1
  grpcProxyReplicas: 0
  computeClusters:
    - workers: [{count: 1, trust: system}]
steps:
  - name: nothing yet
    setValues: {}
"""


@pytest.fixture(scope="module")
def quiet_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    root = tmp_path_factory.mktemp("ncpsim-quiet")
    scenario = root / "quiet.yaml"
    scenario.write_text(QUIET)
    stack = LocalStack("fidelity-quiet", root=root)
    try:
        result = run_scenario(load_scenario(str(scenario)), LocalBackend(stack.root), stack.name, keep=True)
        assert result.ok, result.failures
        yield stack
    finally:
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


def test_a_pod_dying_mid_response_reads_in_ncpsims_words_on_the_worker(quiet_stack: LocalStack) -> None:
    """The pod's TLS port is handed to a stand-in that stops half-way through its 200: the worker's error
    says what happened in ncpsim's words, not h11's ("peer closed connection without sending complete
    message body ..."), and the proxy's line says UC."""
    dying = DyingPod(quiet_stack.state_dir / "certs" / "secrets" / "invocation-service-worker-tls")
    original = rebind(quiet_stack.state_dir, "10.42.0.11:8443/tcp", dying.port)
    try:
        session = run_steps(quiet_stack, [call_step("http-echo", 1)], Path(__file__))
    finally:
        rebind(quiet_stack.state_dir, "10.42.0.11:8443/tcp", original["bindings"]["10.42.0.11:8443/tcp"])
        dying.close()
    (trace,) = session.steps[0].traces
    assert dying.served.is_set() and trace.outcome == "failure"
    url = "http://10-42-0-11.invocation.nvcf.svc.cluster.local:8443/v2/nvcf/worker/request-attach"
    assert trace.error == f'failed to send GET request: Get "{url}": unexpected EOF'  # net/http's words
    assert trace.cause == "connection closed mid-response"  # ncpsim's, beside them
    assert [(rec["method"], rec["status"], rec["flags"]) for rec in trace.proxy] == [("GET", "200", "UC")]


def test_a_pod_refusing_connections_is_uf_with_the_host_tried(quiet_stack: LocalStack) -> None:
    """Nothing listens at the pod's TLS port any more: 503 UF, the line names the address dialed, and the
    proxy's event says why in ncpsim's words (not the socket library's)."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # a port nothing listens on: the dial is refused
    original = rebind(quiet_stack.state_dir, "10.42.0.11:8443/tcp", port)
    try:
        records = Records(quiet_stack.state_dir)
        session = run_steps(quiet_stack, [call_step("http-echo", 1)], Path(__file__))
        (trace,) = session.steps[0].traces
        assert [(rec["status"], rec["flags"], rec["upstream_host"]) for rec in trace.proxy] == [
            ("503", "UF", "10.42.0.11:8443")
        ]
        failed = records.event("proxy.upstream.failed", requestId=trace.proxy[0]["request_id"])
        assert failed["detail"] == "connection refused by 10.42.0.11:8443"
    finally:
        rebind(quiet_stack.state_dir, "10.42.0.11:8443/tcp", original["bindings"]["10.42.0.11:8443/tcp"])
