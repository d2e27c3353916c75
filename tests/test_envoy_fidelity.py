"""The proxy answers and logs as Envoy does (DESIGN.md section 3; issue 11 item 4; issue 16 items 4, 6, 9, 10).

The access log is checked against Envoy's default format string itself; everything else is the attack:
real request bytes over TLS on 127.0.0.1 against a running stack, judged on the wire, in the proxy's
access log and log file, and in the pods' own events.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
from proxy_wire import (
    ATTACH,
    NO_POD,
    POD,
    SHORT,
    WD,
    DyingPod,
    Wire,
    connect,
    marked,
    pod_events,
    reached_pod,
    rebind,
    request,
)
from stack_records import Records

from clusters.local import LocalStack
from scenarios.result import ScenarioResult
from scenarios.trace import CallTrace, join, proxy_lines
from sim.proxy.access_log import AccessRecord, format_record, parse_line
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
from sim.wire import DF_BODY, UF_BODY

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
    start = (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.start))
        + f".{int(record.start * 1000) % 1000:03d}Z"
    )
    values = {
        "START_TIME": start,
        "REQ(:METHOD)": record.method,
        "REQ(X-ENVOY-ORIGINAL-PATH?:PATH)": record.path,
        "PROTOCOL": record.protocol,
        "RESPONSE_CODE": str(record.status),
        "RESPONSE_FLAGS": record.flags,
        "BYTES_RECEIVED": str(record.bytes_received),
        "BYTES_SENT": str(record.bytes_sent),
        "DURATION": str(record.duration_ms),
        "RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)": record.upstream_service_time,
        "REQ(X-FORWARDED-FOR)": record.forwarded_for,
        "REQ(USER-AGENT)": record.user_agent,
        "REQ(X-REQUEST-ID)": record.request_id,
        "REQ(:AUTHORITY)": record.authority,
        "UPSTREAM_HOST": record.upstream_host,
    }
    return re.sub(r"%([^%]+)%", lambda m: values[m.group(1)] or "-", ENVOY_DEFAULT_FORMAT)


RECORDS = [
    AccessRecord(
        start=1767225600.123,
        method="GET",
        path=ATTACH,
        status=200,
        bytes_sent=211,
        duration_ms=14,
        upstream_service_time="13",
        user_agent="worker-utils/1.3.2",
        request_id="1c2a3b4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d",
        authority=f"{POD}:8443",
        upstream_host="10.42.0.11:8443",
    ),
    AccessRecord(
        start=1767225600.5,
        method="POST",
        path=ATTACH + "?a=1",
        status=503,
        flags="UF",
        bytes_received=97,
        bytes_sent=len(UF_BODY),
        request_id="x",
        authority=f"{POD}:8443",
        upstream_host="10.42.0.11:8443",
    ),
    AccessRecord(
        start=1767225601.0, method="CONNECT", path="-", status=404, flags="NR", authority=f"{POD}:8443"
    ),
    AccessRecord(start=1767225601.999, status=400, flags="DPE", bytes_sent=11),  # the codec refused the head
]


@pytest.mark.parametrize("record", RECORDS, ids=["forwarded", "uf", "connect-nr", "codec-error"])
def test_access_log_line_is_envoys_default_format(record: AccessRecord) -> None:
    line = format_record(record)
    assert line == envoy_line(record)
    parsed = parse_line(line)
    assert parsed is not None
    assert (
        parsed["method"],
        parsed["status"],
        parsed["flags"],
        parsed["rx"],
        parsed["tx"],
        parsed["request_id"],
        parsed["upstream_host"],
    ) == (
        record.method,
        str(record.status),
        record.flags,
        str(record.bytes_received),
        str(record.bytes_sent),
        record.request_id,
        record.upstream_host,
    )


# The codec checks, as a table (the pure side of the attacks below) --------------------------------------------
def head(
    method: str, target: str, *headers: tuple[str, str], lengths: tuple[str, ...] | None = None
) -> RequestHead:
    return RequestHead(method, target, headers=(("host", f"{POD}:8443"), *headers), content_lengths=lengths)


CODEC = [
    (
        "one Content-Length",
        head("POST", f"http://{POD}:8443{ATTACH}", ("content-length", "2"), lengths=("2",)),
        None,
    ),
    (
        "Content-Length twice, h11 folded",
        head("POST", f"http://{POD}:8443{ATTACH}", ("content-length", "2"), lengths=("2", "2")),
        400,
    ),
    (
        "Content-Length list",
        head("POST", f"http://{POD}:8443{ATTACH}", ("content-length", "2"), lengths=("2, 2",)),
        400,
    ),
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
            status,
            "DPE",
            True,
        ), why


def test_raw_heads() -> None:
    raw = b"POST http://p:8443/x HTTP/1.1\r\nContent-Length: 2\r\ncontent-length:2\r\n\r\nContent-Length: 9"
    assert raw_field_values(raw, "content-length") == ("2", "2")  # the body's look-alike is not a field
    assert (
        with_host_from_url(b"GET http://p:8443/x HTTP/1.1\r\nA: b\r\n\r\n")
        == b"GET http://p:8443/x HTTP/1.1\r\nHost: p:8443\r\nA: b\r\n\r\n"
    )
    assert with_host_from_url(b"GET /x HTTP/1.1\r\n\r\n") is None  # origin-form: no authority to take
    assert with_host_from_url(b"GET http://p/x HTTP/1.1\r\nHost: q\r\n\r\n") is None  # has its Host


@pytest.mark.parametrize(
    ("headers", "body", "expects"),
    [
        ((), False, False),
        ((("content-length", "0"),), False, False),
        ((("content-length", "3"),), True, False),
        ((("transfer-encoding", "chunked"),), True, False),
        ((("expect", "100-Continue"),), False, True),
    ],
)
def test_body_and_expect(headers: tuple[tuple[str, str], ...], body: bool, expects: bool) -> None:
    request_head = head("POST", f"http://{POD}:8443{ATTACH}", *headers)
    assert (has_body(request_head), expects_continue(request_head)) == (body, expects)


# What the worker callbacks of a replay leave --------------------------------------------------------------
def test_callback_lines_carry_the_proxys_own_request_id(
    http_stack: tuple[LocalStack, ScenarioResult],
) -> None:
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
        wire.send(
            request(
                f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
                marked("bytes"),
                ("Content-Length", "2"),
                body=b"{}",
            )
        )
        line, _, body = wire.response()
    assert line == b"HTTP/1.1 401 Unauthorized"
    rec = records.access_line(request_id="ef-bytes")
    assert (rec["status"], rec["rx"], rec["tx"]) == ("401", "2", str(len(body)))


@pytest.mark.parametrize(
    ("name", "target", "status", "flag"),
    [
        ("nr", f"http://{POD}:8443/v2/nvcf/pexec/functions/x", 404, "NR"),
        ("df", f"http://{NO_POD}:8443{ATTACH}", 503, "DF"),
    ],
)
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


@pytest.mark.parametrize(
    ("name", "target", "status"),
    [("nr", f"http://{POD}:8443/v2/nvcf/x", 404), ("df", f"http://{NO_POD}:8443{ATTACH}", 503)],
)
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
        wire.send(
            request(
                f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
                marked("expect"),
                ("Content-Length", "2"),
                ("Expect", "100-continue"),
            )
        )
        interim, _ = wire.head()
        assert interim == b"HTTP/1.1 100 Continue"
        wire.send(b"{}")
        line, _, _ = wire.response()
    assert line == b"HTTP/1.1 401 Unauthorized"
    assert reached_pod(stack, "ef-expect")


# Codec refusals Envoy makes before routing (issue 16 item 9) -------------------------------------------------
CODEC_CASES = [
    (
        "connect-content-length",
        request(
            f"CONNECT {POD}:8443 HTTP/1.1",
            marked("connect-content-length"),
            ("Content-Length", "5"),
            body=b"hello",
        ),
        b"HTTP/1.1 400 Bad Request",
    ),
    (
        "connect-chunked",
        request(
            f"CONNECT {POD}:8443 HTTP/1.1",
            marked("connect-chunked"),
            ("Transfer-Encoding", "chunked"),
            body=b"0\r\n\r\n",
        ),
        b"HTTP/1.1 400 Bad Request",
    ),
    (
        "connect-gzip",
        request(f"CONNECT {POD}:8443 HTTP/1.1", marked("connect-gzip"), ("Transfer-Encoding", "gzip")),
        b"HTTP/1.1 501 Not Implemented",
    ),
    (
        "duplicate-content-length",
        request(
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            marked("duplicate-content-length"),
            ("Content-Length", "2"),
            ("Content-Length", "2"),
            body=b"{}",
        ),
        b"HTTP/1.1 400 Bad Request",
    ),
    (
        "content-length-list",
        request(
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            marked("content-length-list"),
            ("Content-Length", "2, 2"),
            body=b"{}",
        ),
        b"HTTP/1.1 400 Bad Request",
    ),
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
    rec = records.access_line(
        status=line.split()[1].decode(),
        flags="DPE",
        request_id="-" if name == "connect-gzip" else f"ef-{name}",
    )
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
        wire.send(
            request(
                f"POST http://{POD}:8443/v2/nvcf/x HTTP/1.1",
                marked("cut"),
                ("Content-Length", "10"),
                body=b"abc",
            )
        )
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
        wire.send(
            request(f"POST http://{POD}:8443/v2/nvcf/x HTTP/1.1", marked("no-body"), ("Content-Length", "0"))
        )
        line, headers, _ = wire.response()
        assert line == b"HTTP/1.1 404 Not Found" and "connection" not in headers
        wire.send(request(f"GET http://{POD}:8443{ATTACH} HTTP/1.1", marked("no-body-after")))
        after, _, _ = wire.response()
    assert after == b"HTTP/1.1 401 Unauthorized"


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
                wire.send(
                    request(
                        f"GET http://{pod2}:8443{ATTACH} HTTP/1.1",
                        marked(f"dying-{attempt}"),
                        host=f"{pod2}:8443",
                    )
                )
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


# The replay's correlation without X-Request-Id (scenarios.trace), as a table ----------------------------------
def line(
    request_id: str,
    at: float,
    status: str = "200",
    flags: str = "-",
    authority: str = f"{POD}:8443",
    method: str = "GET",
) -> dict[str, str]:
    rec = parse_line(
        format_record(
            AccessRecord(
                start=at,
                method=method,
                path=ATTACH,
                status=int(status),
                flags=flags,
                request_id=request_id,
                authority=authority,
            )
        )
    )
    assert rec is not None
    return rec


def callback(
    rid: str,
    at: float,
    end: float,
    stage: str,
    statuses: list[int],
    tokens: tuple[str, str],
    target: str = f"http://{POD}:8443",
) -> list[dict]:
    return [
        {
            "kind": "worker.callback.start",
            "requestId": rid,
            "callback": "http",
            "ts": at,
            "target": target,
            "proxy": f"https://invocation.{WD}:10084",
            "connect": False,
            "tokens": list(tokens),
        },
        {
            "kind": "worker.callback.result",
            "requestId": rid,
            "callback": "http",
            "ts": end,
            "stage": stage,
            "statuses": statuses,
            "ok": stage == "done",
        },
    ]


def leg(kind: str, rid: str | None, proxy_id: str, token: str) -> dict:
    return {
        "kind": kind,
        "requestId": rid,
        "xRequestId": proxy_id,
        "token": token,
        "pod": "invocation-service-0",
        "ts": 0.0,
    }


T0 = 1767225600.0
EVENTS = [
    # a: both legs reached its pod
    *callback("a", T0, T0 + 0.1, "done", [200, 200], ("ta1", "ta2")),
    leg("attach.get", "a", "p-a1", "ta1"),
    leg("attach.post", "a", "p-a2", "ta2"),
    # b and c: concurrent, same pod, both refused by the proxy (UF), so no pod saw either id
    *callback("b", T0 + 1.0, T0 + 1.2, "get", [503], ("tb1", "tb2")),
    *callback("c", T0 + 1.05, T0 + 1.3, "get", [503], ("tc1", "tc2")),
    # d: landed on another pod, whose token check failed (its event names the proxy's id, not d's)
    *callback("d", T0 + 2.0, T0 + 2.1, "get", [401], ("td1", "td2")),
    leg("attach.get", "p-d1", "p-d1", "td1"),
    # e: failed before sending anything (TLS): no line of its own, though one of b/c's falls in its time
    *callback("e", T0 + 0.99, T0 + 1.02, "tls", [], ("te1", "te2")),
]
ACCESS = [
    line("p-a1", T0 + 0.01),
    line("p-a2", T0 + 0.05, method="POST"),
    line("p-b", T0 + 1.011, "503", "UF"),
    line("p-c", T0 + 1.06, "503", "UF"),
    line("p-d1", T0 + 2.01, "401"),
]


@pytest.mark.parametrize(
    ("rid", "ids"), [("a", ["p-a1", "p-a2"]), ("b", ["p-b"]), ("c", ["p-c"]), ("d", ["p-d1"]), ("e", [])]
)
def test_lines_are_joined_without_a_request_id(rid: str, ids: list[str]) -> None:
    assert [rec["request_id"] for rec in proxy_lines(rid, EVENTS, ACCESS)] == ids


def tunnel(rid: str, at: float, end: float) -> list[dict]:
    """A legacy worker's callback whose TLS to the pod failed inside the proxy's CONNECT tunnel."""
    events = callback(rid, at, end, "tls", [200], (f"t{rid}1", f"t{rid}2"))
    return [{**e, "connect": True} if e["kind"] == "worker.callback.start" else e for e in events]


@pytest.mark.parametrize("log_order", ["as the tunnels closed", "as they opened"])
def test_crossing_tunnels_to_one_pod_each_get_their_line(log_order: str) -> None:
    """Two CONNECTs to one pod, the shorter callback inside the longer: its tunnel closes first, so its line
    is first in the log though the longer one's CONNECT came earlier (seen under load, legacy-worker-connect-on).
    Each gets a line, whichever order the log has them in."""
    events = [*tunnel("long", T0, T0 + 10.0), *tunnel("short", T0 + 1.0, T0 + 3.0)]
    access = [line("p-short", T0 + 1.5, method="CONNECT"), line("p-long", T0 + 0.5, method="CONNECT")]
    if log_order == "as they opened":
        access.reverse()
    assert [rec["request_id"] for rec in proxy_lines("long", events, access)] == ["p-long"]
    assert [rec["request_id"] for rec in proxy_lines("short", events, access)] == ["p-short"]


def test_a_line_goes_to_the_callback_that_ends_first() -> None:
    """Both callbacks' times hold the first line; only the longer one's holds the second."""
    events = [*tunnel("long", T0, T0 + 10.0), *tunnel("short", T0 + 1.0, T0 + 1.3)]
    access = [line("p-1", T0 + 1.2, method="CONNECT"), line("p-2", T0 + 5.0, method="CONNECT")]
    assert [rec["request_id"] for rec in proxy_lines("short", events, access)] == ["p-1"]
    assert [rec["request_id"] for rec in proxy_lines("long", events, access)] == ["p-2"]


def test_a_leg_refused_by_another_pod_is_traced_to_its_worker() -> None:
    trace = join(
        CallTrace(step=1, index=4, function="http-echo", pod="invocation-service-1", request_id="d"),
        EVENTS,
        ACCESS,
    )
    assert [leg["pod"] for leg in trace.pod_legs] == ["invocation-service-0"] and trace.landed == "other"
