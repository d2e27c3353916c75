"""The proxy answers and logs as Envoy does (DESIGN.md section 3; issue 11 item 4; issue 16 items 4, 6, 9, 10).

The access log is checked against Envoy's default format string itself; everything else is the attack:
real request bytes over TLS on 127.0.0.1 against a running stack, judged on the wire, in the proxy's
access log and log file, and in the pods' own events.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from stack_records import Records

from clusters.local import LocalBackend, LocalStack
from scenarios.engine import run_scenario
from scenarios.model import load_scenario
from scenarios.result import ScenarioResult
from sim.protocols.wire import DF_BODY, UF_BODY, UF_TLS_BODY
from sim.proxy.access_log import AccessRecord, format_record, parse_line
from sim.proxy.downstream import IDLE_ENV
from sim.proxy.policy import (
    ProxyPolicy,
    Reject,
    RequestHead,
    decide,
    expects_continue,
    has_body,
    raw_field_values,
    with_host_from_url,
)

WD = "grpc-worker.example.com"
SNI = f"invocation.{WD}"
POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
NO_POD = "10-42-0-99.invocation.nvcf.svc.cluster.local"  # a well-formed pod name no DNS knows
ATTACH = "/v2/nvcf/worker/request-attach"
SHORT = 5.0  # a local reply or a pod's 401 takes milliseconds; this only bounds a broken proxy
IDLE = 0.5  # NCPSIM_PROXY_CONNECTION_IDLE for the idle stack (Envoy's 1 h, scaled down)
TRICKLE = 0.1  # gap between a steady tunnel's bytes: well inside IDLE

# Envoy's default access-log format, as its documentation gives it (configuration/observability/access_log).
ENVOY_DEFAULT_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" '
    '"%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"'
)


# The format string, read as Envoy reads it ------------------------------------------------------------
def envoy_line(record: AccessRecord) -> str:
    """What Envoy would write for `record`: each command operator of the default format replaced by its
    value, "-" for an empty one (Envoy's rule for unset values)."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.start)) + f".{int(record.start * 1000) % 1000:03d}Z"
    values = {
        "START_TIME": start, "REQ(:METHOD)": record.method, "REQ(X-ENVOY-ORIGINAL-PATH?:PATH)": record.path,
        "PROTOCOL": record.protocol, "RESPONSE_CODE": str(record.status), "RESPONSE_FLAGS": record.flags,
        "BYTES_RECEIVED": str(record.bytes_received), "BYTES_SENT": str(record.bytes_sent),
        "DURATION": str(record.duration_ms), "RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)": record.upstream_service_time,
        "REQ(X-FORWARDED-FOR)": record.forwarded_for, "REQ(USER-AGENT)": record.user_agent,
        "REQ(X-REQUEST-ID)": record.request_id, "REQ(:AUTHORITY)": record.authority,
        "UPSTREAM_HOST": record.upstream_host,
    }
    return re.sub(r"%([^%]+)%", lambda m: values[m.group(1)] or "-", ENVOY_DEFAULT_FORMAT)


RECORDS = [
    AccessRecord(start=1767225600.123, method="GET", path=ATTACH, status=200, bytes_sent=211, duration_ms=14,
                 upstream_service_time="13", user_agent="worker-utils/1.3.2",
                 request_id="1c2a3b4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d", authority=f"{POD}:8443",
                 upstream_host="10.42.0.11:8443"),
    AccessRecord(start=1767225600.5, method="POST", path=ATTACH + "?a=1", status=503, flags="UF",
                 bytes_received=97, bytes_sent=len(UF_BODY), request_id="x", authority=f"{POD}:8443",
                 upstream_host="10.42.0.11:8443"),
    AccessRecord(start=1767225601.0, method="CONNECT", path="-", status=404, flags="NR", authority=f"{POD}:8443"),
    AccessRecord(start=1767225601.999, status=400, flags="DPE", bytes_sent=11),  # the codec refused the head
]


@pytest.mark.parametrize("record", RECORDS, ids=["forwarded", "uf", "connect-nr", "codec-error"])
def test_access_log_line_is_envoys_default_format(record: AccessRecord) -> None:
    line = format_record(record)
    assert line == envoy_line(record)
    parsed = parse_line(line)
    assert parsed is not None
    assert (parsed["method"], parsed["status"], parsed["flags"], parsed["rx"], parsed["tx"],
            parsed["request_id"], parsed["upstream_host"]) == (
        record.method, str(record.status), record.flags, str(record.bytes_received), str(record.bytes_sent),
        record.request_id, record.upstream_host)


# The codec checks, as a table (the pure side of the attacks below) --------------------------------------------
def head(method: str, target: str, *headers: tuple[str, str], lengths: tuple[str, ...] | None = None) -> RequestHead:
    return RequestHead(method, target, headers=(("host", f"{POD}:8443"), *headers), content_lengths=lengths)


CODEC = [
    ("one Content-Length", head("POST", f"http://{POD}:8443{ATTACH}", ("content-length", "2"), lengths=("2",)),
     None),
    ("Content-Length twice, h11 folded", head("POST", f"http://{POD}:8443{ATTACH}", ("content-length", "2"),
                                              lengths=("2", "2")), 400),
    ("Content-Length list", head("POST", f"http://{POD}:8443{ATTACH}", ("content-length", "2"), lengths=("2, 2",)),
     400),
    ("CONNECT, Content-Length 0", head("CONNECT", f"{POD}:8443", ("content-length", "0")), None),
    ("CONNECT with a body", head("CONNECT", f"{POD}:8443", ("content-length", "5")), 400),
    ("CONNECT chunked", head("CONNECT", f"{POD}:8443", ("transfer-encoding", "chunked")), 400),
    ("CONNECT gzip", head("CONNECT", f"{POD}:8443", ("transfer-encoding", "gzip")), 501),
]


@pytest.mark.parametrize(("why", "request_head", "status"), CODEC, ids=[c[0] for c in CODEC])
def test_codec_table(why: str, request_head: RequestHead, status: int | None) -> None:
    decision = decide(request_head, ProxyPolicy(connect_enabled=True))
    if status is None:
        assert not isinstance(decision, Reject) or decision.flag != "DPE", why
    else:
        assert isinstance(decision, Reject) and (decision.status, decision.flag, decision.close) == (
            status, "DPE", True), why


def test_raw_heads() -> None:
    raw = b"POST http://p:8443/x HTTP/1.1\r\nContent-Length: 2\r\ncontent-length:2\r\n\r\nContent-Length: 9"
    assert raw_field_values(raw, "content-length") == ("2", "2")  # the body's look-alike is not a field
    assert with_host_from_url(b"GET http://p:8443/x HTTP/1.1\r\nA: b\r\n\r\n") == \
        b"GET http://p:8443/x HTTP/1.1\r\nHost: p:8443\r\nA: b\r\n\r\n"
    assert with_host_from_url(b"GET /x HTTP/1.1\r\n\r\n") is None  # origin-form: no authority to take
    assert with_host_from_url(b"GET http://p/x HTTP/1.1\r\nHost: q\r\n\r\n") is None  # has its Host


@pytest.mark.parametrize(("headers", "body", "expects"), [
    ((), False, False), ((("content-length", "0"),), False, False), ((("content-length", "3"),), True, False),
    ((("transfer-encoding", "chunked"),), True, False), ((("expect", "100-Continue"),), False, True)])
def test_body_and_expect(headers: tuple[tuple[str, str], ...], body: bool, expects: bool) -> None:
    request_head = head("POST", f"http://{POD}:8443{ATTACH}", *headers)
    assert (has_body(request_head), expects_continue(request_head)) == (body, expects)


# Wire helpers ----------------------------------------------------------------------------------------
def tls_context(stack: LocalStack) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=stack.status()["ca"]["stack"])
    return ctx


def connect(stack: LocalStack) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", stack.status()["proxy"]["http"]["port"]), timeout=SHORT)
    return tls_context(stack).wrap_socket(sock, server_hostname=SNI)


class Wire:
    """A worker's connection to the proxy, read response by response (Content-Length framing)."""

    def __init__(self, tls: ssl.SSLSocket):
        self.tls, self.buffer = tls, b""

    def send(self, data: bytes) -> None:
        self.tls.sendall(data)

    def _fill(self) -> bool:
        chunk = self.tls.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def head(self) -> tuple[bytes, dict[str, str]]:
        """The next response head: its status line and headers."""
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"the proxy closed without a response head: {self.buffer!r}"
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        line, *fields = head.decode("latin-1").split("\r\n")
        return line.encode(), {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}

    def response(self, head_request: bool = False) -> tuple[bytes, dict[str, str], bytes]:
        line, headers = self.head()
        length = 0 if head_request else int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            assert self._fill(), "the proxy closed mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return line, headers, body

    def closed_within(self, seconds: float) -> bool:
        """True if the proxy closes the connection within `seconds` (reading and dropping what it sends)."""
        self.tls.settimeout(seconds)
        try:
            while self._fill():
                pass
        except TimeoutError:
            return False
        except (ConnectionError, ssl.SSLError):
            pass
        return True


def request(line: str, *headers: tuple[str, str], body: bytes = b"", host: str | None = f"{POD}:8443") -> bytes:
    fields = ([("Host", host)] if host else []) + list(headers)
    return (line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n").encode("latin-1") + body


def marked(name: str) -> tuple[str, str]:
    return ("X-Request-Id", f"ef-{name}")


def pod_events(stack: LocalStack) -> list[dict]:
    events = []
    for path in sorted((stack.state_dir / "events").glob("invocation-service-*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


def reached_pod(stack: LocalStack, request_id: str) -> bool:
    return any(e.get("requestId") == request_id for e in pod_events(stack) if e["kind"] == "pod.request")


# What the worker callbacks of a replay leave --------------------------------------------------------------
def test_callback_lines_carry_the_proxys_own_request_id(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    """Workers send no X-Request-Id, so each line names an id the proxy generated (a uuid4, as Envoy's),
    which the pod received; the replay still finds both lines of every callback."""
    stack, result = http_stack
    assert result.ok, result.failures
    received = {e.get("xRequestId") for e in pod_events(stack) if e["kind"].startswith("attach.")}
    for trace in result.steps[0].traces:
        assert [rec["method"] for rec in trace.proxy] == ["GET", "POST"]
        for rec in trace.proxy:
            assert rec["request_id"] != trace.request_id
            assert uuid.UUID(rec["request_id"]).version == 4
            assert rec["request_id"] in received
        assert trace.proxy[0]["rx"] == "0" and int(trace.proxy[1]["rx"]) > 0  # GET has no body, POST has


def test_forwarded_bytes_are_body_bytes(http_stack: tuple[LocalStack, ScenarioResult]) -> None:
    stack, _ = http_stack
    records = Records(stack.state_dir)
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"POST http://{POD}:8443{ATTACH} HTTP/1.1", marked("bytes"), ("Content-Length", "2"),
                          body=b"{}"))
        line, _, body = wire.response()
    assert line == b"HTTP/1.1 401 Unauthorized"
    rec = records.access_line(request_id="ef-bytes")
    assert (rec["status"], rec["rx"], rec["tx"]) == ("401", "2", str(len(body)))


@pytest.mark.parametrize(("name", "target", "status", "flag"), [
    ("nr", f"http://{POD}:8443/v2/nvcf/pexec/functions/x", 404, "NR"),
    ("df", f"http://{NO_POD}:8443{ATTACH}", 503, "DF"),
])
def test_local_reply_bytes_are_its_body(http_stack, name: str, target: str, status: int, flag: str) -> None:
    stack, _ = http_stack
    records = Records(stack.state_dir)
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"GET {target} HTTP/1.1", marked(f"local-{name}")))
        line, _, body = wire.response()
    assert int(line.split()[1]) == status
    rec = records.access_line(request_id=f"ef-local-{name}")
    assert (rec["status"], rec["flags"], rec["tx"]) == (str(status), flag, str(len(body)))
    assert (len(body) > 0) is (flag == "DF")  # Envoy's NR reply has no body; DF says why


# HEAD (issue 16 item 4) ------------------------------------------------------------------------------------
def test_head_through_the_proxy_gets_the_pods_head_and_the_connection_goes_on(http_stack) -> None:
    """The pod answers HEAD with its problem reply's head and no body; the proxy relays that, and the
    next request on the same connection is read correctly."""
    stack, _ = http_stack
    records = Records(stack.state_dir)
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"HEAD http://{POD}:8443{ATTACH} HTTP/1.1", marked("head")))
        line, headers, _ = wire.response(head_request=True)
        assert line == b"HTTP/1.1 404 Not Found" and int(headers["content-length"]) > 0
        wire.send(request(f"GET http://{POD}:8443{ATTACH} HTTP/1.1", marked("after-head")))
        after, _, _ = wire.response()
    assert after == b"HTTP/1.1 401 Unauthorized"
    rec = records.access_line(request_id="ef-head")
    assert (rec["method"], rec["status"], rec["flags"], rec["tx"]) == ("HEAD", "404", "-", "0")
    assert rec["upstream_host"] == "10.42.0.11:8443"
    assert reached_pod(stack, "ef-head")


@pytest.mark.parametrize(("name", "target", "status"), [
    ("nr", f"http://{POD}:8443/v2/nvcf/x", 404), ("df", f"http://{NO_POD}:8443{ATTACH}", 503)])
def test_head_local_reply_has_no_body(http_stack, name: str, target: str, status: int) -> None:
    stack, _ = http_stack
    records = Records(stack.state_dir)
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"HEAD {target} HTTP/1.1", marked(f"head-{name}")))
        line, headers, _ = wire.response(head_request=True)
        wire.send(request(f"GET http://{POD}:8443{ATTACH} HTTP/1.1", marked(f"head-{name}-after")))
        after, _, _ = wire.response()  # a body sent on the HEAD reply would be read here as a status line
    assert int(line.split()[1]) == status and after == b"HTTP/1.1 401 Unauthorized"
    assert int(headers["content-length"]) == (len(DF_BODY) if name == "df" else 0)  # the GET's, kept
    assert records.access_line(request_id=f"ef-head-{name}")["tx"] == "0"


# Expect: 100-continue (issue 16 item 9) ---------------------------------------------------------------------
def test_expect_100_continue_is_answered_by_the_proxy(http_stack) -> None:
    """A worker that waits for 100 before sending its body gets it from the proxy (Envoy answers it
    itself), then the pod's answer to the whole request."""
    stack, _ = http_stack
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"POST http://{POD}:8443{ATTACH} HTTP/1.1", marked("expect"), ("Content-Length", "2"),
                          ("Expect", "100-continue")))
        interim, _ = wire.head()
        assert interim == b"HTTP/1.1 100 Continue"
        wire.send(b"{}")
        line, _, _ = wire.response()
    assert line == b"HTTP/1.1 401 Unauthorized"
    assert reached_pod(stack, "ef-expect")


# Codec refusals Envoy makes before routing (issue 16 item 9) -------------------------------------------------
CODEC_CASES = [
    ("connect-content-length", request(f"CONNECT {POD}:8443 HTTP/1.1", marked("connect-content-length"),
                                       ("Content-Length", "5"), body=b"hello"), b"HTTP/1.1 400 Bad Request"),
    ("connect-chunked", request(f"CONNECT {POD}:8443 HTTP/1.1", marked("connect-chunked"),
                                ("Transfer-Encoding", "chunked"), body=b"0\r\n\r\n"), b"HTTP/1.1 400 Bad Request"),
    ("connect-gzip", request(f"CONNECT {POD}:8443 HTTP/1.1", marked("connect-gzip"), ("Transfer-Encoding", "gzip")),
     b"HTTP/1.1 501 Not Implemented"),
    ("duplicate-content-length", request(f"POST http://{POD}:8443{ATTACH} HTTP/1.1", marked("duplicate-content-length"),
                                         ("Content-Length", "2"), ("Content-Length", "2"), body=b"{}"),
     b"HTTP/1.1 400 Bad Request"),
    ("content-length-list", request(f"POST http://{POD}:8443{ATTACH} HTTP/1.1", marked("content-length-list"),
                                    ("Content-Length", "2, 2"), body=b"{}"), b"HTTP/1.1 400 Bad Request"),
]


@pytest.mark.parametrize(("name", "raw", "status_line"), CODEC_CASES, ids=[c[0] for c in CODEC_CASES])
def test_codec_refusals(http_stack, name: str, raw: bytes, status_line: bytes) -> None:
    stack, _ = http_stack
    records = Records(stack.state_dir)
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(raw)
        line, headers, body = wire.response()
        assert wire.closed_within(SHORT)  # a codec error ends the connection
    assert line == status_line and headers.get("connection") == "close"
    assert body == status_line.split(b" ", 2)[2]  # Envoy's codec replies with the status text
    # h11 refuses a Transfer-Encoding other than chunked while parsing, before there is a request id.
    rec = records.access_line(status=line.split()[1].decode(), flags="DPE",
                              request_id="-" if name == "connect-gzip" else f"ef-{name}")
    assert rec["upstream_host"] == "-"
    assert not reached_pod(stack, f"ef-{name}")


def test_absolute_form_without_host_is_forwarded_with_the_urls_authority(http_stack) -> None:
    stack, _ = http_stack
    records = Records(stack.state_dir)
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"GET http://{POD}:8443{ATTACH} HTTP/1.1", marked("no-host"), host=None))
        line, _, _ = wire.response()
    assert line == b"HTTP/1.1 401 Unauthorized"
    rec = records.access_line(request_id="ef-no-host")
    assert (rec["authority"], rec["upstream_host"]) == (f"{POD}:8443", "10.42.0.11:8443")
    assert reached_pod(stack, "ef-no-host")


def test_origin_form_without_host_is_still_refused(http_stack) -> None:
    """Negative control: only an absolute URL supplies the authority; origin-form without Host is 400."""
    stack, _ = http_stack
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"GET {ATTACH} HTTP/1.1", marked("origin-no-host"), host=None))
        line, _, _ = wire.response()
    assert line == b"HTTP/1.1 400 Bad Request"


# One logged line per connection, never a traceback (issue 16 item 6) --------------------------------------------
def test_a_refused_request_with_a_body_still_to_come_closes_the_connection(http_stack) -> None:
    """A refused request whose body never completes: Envoy replies at once with Connection: close and
    closes, rather than wait for the rest (it counts a response before the request was complete). The
    proxy used to wait, then leave an h11 traceback in its log when the worker hung up mid-body."""
    stack, _ = http_stack
    log = stack.state_dir / "logs" / "worker-callback-proxy.log"
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"POST http://{POD}:8443/v2/nvcf/x HTTP/1.1", marked("cut"), ("Content-Length", "10"),
                          body=b"abc"))
        line, headers, _ = wire.response()
        assert (line, headers.get("connection")) == (b"HTTP/1.1 404 Not Found", "close")
        assert wire.closed_within(SHORT)
    Records(stack.state_dir, since_start=True).access_line(request_id="ef-cut", status="404", flags="NR")
    assert "Traceback" not in log.read_text()


def test_a_refused_request_without_a_body_keeps_the_connection(http_stack) -> None:
    """Negative control: with nothing still to come, the connection serves the next request."""
    stack, _ = http_stack
    with connect(stack) as tls:
        wire = Wire(tls)
        wire.send(request(f"POST http://{POD}:8443/v2/nvcf/x HTTP/1.1", marked("no-body"), ("Content-Length", "0")))
        line, headers, _ = wire.response()
        assert line == b"HTTP/1.1 404 Not Found" and "connection" not in headers
        wire.send(request(f"GET http://{POD}:8443{ATTACH} HTTP/1.1", marked("no-body-after")))
        after, _, _ = wire.response()
    assert after == b"HTTP/1.1 401 Unauthorized"


# UF: the host tried (issue 11 item 4); gRPC traces carry the worker's cause (issue 11 item 3) ------------------
EXPIRED_POD_CERTS = """
name: expired-pod-certs
summary: Both kinds of pod serve an expired certificate; the proxy refuses them as upstreams (503 UF)
seed: 7
values:
  workerCallbackProxy: {enabled: true, workerDomain: grpc-worker.example.com, service: {type: LoadBalancer}}
  global: {nvcaOperator: {agent: {workerCallbackCaPem: "@stack-ca"}}}
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
        assert [(rec["method"], rec["status"], rec["flags"], rec["upstream_host"]) for rec in trace.proxy] == [
            ("GET", "503", "UF", "10.42.0.11:8443")]
        assert trace.proxy[0]["tx"] == str(len(UF_TLS_BODY))
        assert "CERTIFICATE_VERIFY_FAILED" in (trace.error or "")
    assert len({trace.proxy[0]["request_id"] for trace in traces}) == 2  # one line each, none shared


def test_grpc_trace_carries_the_workers_cause(expired: ScenarioResult) -> None:
    """The client gives up first (DEADLINE_EXCEEDED); the trace still says what the worker got."""
    (trace,) = expired.steps[3].traces
    assert trace.outcome == "failure" and trace.worker_stage == "callback"
    assert "DEADLINE_EXCEEDED" not in (trace.error or "")
    assert "HTTP 503" in (trace.error or "") and "CERTIFICATE_VERIFY_FAILED" in (trace.error or "")


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
            result = run_scenario(load_scenario("http-callback", values), LocalBackend(stack.root), stack.name,
                                  keep=True)
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


# A pod that dies mid-response (issue 16 item 10): the reason in ncpsim's words, no traceback ------------------
class DyingPod:
    """Stands in for pod 10.42.0.12's TLS listener (the stack's own pod certificate): reads a request head,
    writes the start of a 200 whose body never completes, and drops the connection."""

    PARTIAL = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: text/plain\r\n\r\nonly part"

    def __init__(self, secret: Path):
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(secret / "tls.crt", secret / "tls.key")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.served = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="dying-pod", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                with contextlib.suppress(OSError, ssl.SSLError), conn, \
                        self.tls.wrap_socket(conn, server_side=True) as tls:
                    data = b""
                    while b"\r\n\r\n" not in data and (chunk := tls.recv(65536)):
                        data += chunk
                    tls.sendall(self.PARTIAL)
                self.served.set()

    def close(self) -> None:
        self.listener.close()
        self.thread.join(SHORT)


def rebind(state: Path, address: str, port: int) -> dict:
    """Point a virtual address at another real port in the stack's network map (components re-read it)."""
    path = state / "netmap.json"
    original = json.loads(path.read_text())
    changed = {**original, "bindings": {**original["bindings"], address: port}}
    tmp = path.with_suffix(".test")
    tmp.write_text(json.dumps(changed))
    tmp.replace(path)  # a new inode: readers notice the change
    return original


def test_a_pod_dying_mid_response_is_logged_in_ncpsims_words(http_stack) -> None:
    """Pod .12 is killed and its address handed to a stand-in that stops half-way through a response. The
    worker's side gets the truncated response and the connection closed; the proxy logs the stream with
    UC, says why in its own words, and leaves no traceback. (Runs last: it takes pod .12 away.)"""
    stack, _ = http_stack
    pod2 = "10-42-0-12.invocation.nvcf.svc.cluster.local"
    stack.components.kill("invocation-service-1")
    dying = DyingPod(stack.state_dir / "certs" / "secrets" / "invocation-service-worker-tls")
    original = rebind(stack.state_dir, "10.42.0.12:8443/tcp", dying.port)
    try:
        records = Records(stack.state_dir)
        # Connections the proxy parked to the killed pod are spent first (503 UC each); then it dials again.
        for attempt in range(10):
            with connect(stack) as tls:
                wire = Wire(tls)
                wire.send(request(f"GET http://{pod2}:8443{ATTACH} HTTP/1.1", marked(f"dying-{attempt}"),
                                  host=f"{pod2}:8443"))
                line, _ = wire.head()
                if dying.served.wait(0.2 if line.startswith(b"HTTP/1.1 503") else SHORT):
                    assert line == b"HTTP/1.1 200 OK" and wire.closed_within(SHORT)
                    assert wire.buffer == b"only part"
                    break
        else:
            pytest.fail("the proxy never dialed the stand-in pod")
        rec = records.access_line(request_id=f"ef-dying-{attempt}")
        assert (rec["status"], rec["flags"], rec["tx"]) == ("200", "UC", str(len(b"only part")))
        event = records.event("proxy.stream.failed", requestId=f"ef-dying-{attempt}")
        assert event["reason"] == "upstream connection closed mid-response"
    finally:
        rebind(stack.state_dir, "10.42.0.12:8443/tcp", original["bindings"]["10.42.0.12:8443/tcp"])
        dying.close()
    log = (stack.state_dir / "logs" / "worker-callback-proxy.log").read_text()
    assert "Traceback" not in log and "h11" not in log
