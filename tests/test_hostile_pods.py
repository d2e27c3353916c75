"""The pods' client APIs hold their shape (issue 31, item 2): every hostile function name and poll value gets the
NVCF API's answer before any work is published, the pod logs one line and keeps serving, and a dead bus is the
API's 500 (HTTP) or UNAVAILABLE (gRPC) until it is back, when the next good call succeeds.

The pure checks (sim.protocols.pexec) are tables; the attack runs against a real stack on loopback, the pods'
own events and log files saying what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sim.client.grpc_client import EchoClient
from sim.model.values import NatsValues
from sim.nats.publisher import publish_deadline
from sim.protocols.pexec import (
    HEAD_BUFFER,
    HEAD_FIELDS,
    NO_ROUTE,
    POLL_DETAIL,
    URI_MAX,
    Problem,
    function_id,
    head_refusal,
    head_size,
    poll_seconds,
    unreadable_head,
)
from sim.runtime.log import OneLine, Repeats

FUNCTIONS = ("http-echo", "grpc-echo")
PEXEC = "/v2/nvcf/pexec/functions/"
SHORT = 20.0  # a refusal takes milliseconds, a good call a worker's round trip, a dead bus 3.5 s (below)
# Seconds one publish attempt waits for JetStream (the pods' default is 2 s): a dead bus is the API's answer
# after three attempts and their pauses (sim.nats.publisher.publish_deadline), 3.5 s here instead of 8 s.
PUBLISH_TIMEOUT = 0.5
UNTRACEABLE = ("Traceback", "Unhandled exception")


# -- the pure checks -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rest", "expect"),
    [
        ("http-echo", "http-echo"),
        ("http-echo/versions/v1", "http-echo"),
        ("http%2Decho", "http-echo"),  # axum percent-decodes the parameter
        ("nosuch", Problem(404, "function not found")),
        ("a" * 4096, Problem(404, "function not found")),  # well formed, unknown
        ("3b241101-e2bb-4255-8caf-4136c566a962", Problem(404, "function not found")),  # an NVCF id
        ("", NO_ROUTE),
        ("http-echo/versions/", NO_ROUTE),
        ("http-echo/other/v1", NO_ROUTE),
        ("a/b", NO_ROUTE),
        ("a.b", 400),
        ("a*", 400),
        ("a>", 400),
        ("%2e", 400),
        ("%2e%2e", 400),
        ("-x", 400),
        ("a%00b", 400),
        ("%ff", Problem(400, "Invalid UTF-8 in `function_id`", plain=True)),
    ],
)
def test_function_id(rest: str, expect: str | Problem | int) -> None:
    got = function_id(rest, FUNCTIONS)
    if isinstance(expect, int):
        assert isinstance(got, Problem) and got.status == expect and got.plain, got
        assert got.detail.startswith("Invalid URL: function id ") and len(got.detail) < 200, got
    else:
        assert got == expect


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        (None, 60),
        ("10", 10),
        ("+10", 10),  # u64::from_str takes one leading +
        ("0", 0),  # ncpsim's "at once" (the service's minimum is 1 s: not modelled, said in pexec.py)
        ("3600", 3600),
        ("0" * 5000 + "7", 7),  # leading zeros never overflow a u64 (nor Python's int-from-text limit)
        ("caf\u00e9", 60),  # not visible ASCII: HeaderValue::to_str fails, the header counts as absent
        *((bad, 400) for bad in ("abc", "nan", "inf", "", "-1", "1.5", "1e3", "++1", " ", "3601", "9" * 25)),
    ],
)
def test_poll_seconds(value: str | None, expect: int) -> None:
    headers = {} if value is None else {"nvcf-poll-seconds": value}
    got = poll_seconds(headers)
    assert got == (Problem(400, POLL_DETAIL) if expect == 400 else expect)


def test_an_event_stream_waits_twenty_minutes_by_default() -> None:
    assert poll_seconds({"accept": "text/event-stream"}) == 1200
    assert poll_seconds({"accept": "text/event-stream", "nvcf-poll-seconds": "5"}) == 5


# -- the one-line log -------------------------------------------------------------------------------------
def record(message: str, error: Exception | None = None, name: str = "nats.aio.client") -> logging.LogRecord:
    exc_info = (type(error), error, error.__traceback__) if error else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, (), exc_info)


def test_a_record_and_its_exception_are_one_line() -> None:
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except ConnectionRefusedError as exc:
        error = exc
    line = OneLine("%(name)s %(levelname)s %(message)s").format(record("nats: encountered\nerror", error))
    assert line == (
        "nats.aio.client ERROR nats: encountered\\nerror: ConnectionRefusedError: [Errno 111] Connection refused"
    )
    # Negative control: the default formatter writes the traceback, lines of it.
    assert logging.Formatter().format(record("x", error)).count("\n") > 1


def test_a_librarys_repeated_line_is_said_once_a_window() -> None:
    now = [0.0]
    repeats = Repeats(window=30.0, clock=lambda: now[0])
    error = ConnectionRefusedError(111, "Connection refused")
    said = []
    for t in (0.0, 0.5, 1.0, 29.9, 30.0, 30.5):
        now[0] = t
        said.append(repeats.filter(record("nats: encountered error", error)))
    assert said == [True, False, False, False, True, False]
    assert repeats.filter(record("nats: encountered error", TimeoutError()))  # another error is another line


# -- the attack on a running stack ---------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes

    @property
    def problem(self) -> dict[str, Any]:
        assert self.content_type == "application/problem+json", self
        return json.loads(self.body)


def post(
    conn: http.client.HTTPConnection, path: str, poll: str | None = "10", body: bytes = b"ping"
) -> Answer:
    headers = {"Content-Type": "text/plain", **({"NVCF-POLL-SECONDS": poll} if poll is not None else {})}
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    return Answer(response.status, response.getheader("content-type") or "", response.read())


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    poll: str | None
    status: int
    says: str  # in the body's detail (problem+json) or the text/plain body


NAMES = [
    Hostile("unknown", PEXEC + "nosuch", "10", 404, "function not found"),
    Hostile("dot", PEXEC + "a.b", "10", 400, "Invalid URL: function id 'a.b'"),
    Hostile("star", PEXEC + "a*", "10", 400, "Invalid URL"),
    Hostile("gt", PEXEC + "a>", "10", 400, "Invalid URL"),
    Hostile("pct-2e", PEXEC + "%2e", "10", 400, "Invalid URL: function id '.'"),
    Hostile("empty", PEXEC, "10", 404, "Not Found"),
    Hostile("4kib", PEXEC + "a" * 4096, "10", 404, "function not found"),
    Hostile("bad-utf8", PEXEC + "%ff%fe", "10", 400, "Invalid UTF-8"),
]
POLLS = [
    Hostile(f"poll-{label}", PEXEC + "http-echo", value, 400, POLL_DETAIL)
    for label, value in [("abc", "abc"), ("nan", "nan"), ("empty", ""), ("negative", "-1"), ("over", "3601")]
]
CASES = NAMES + POLLS


def events(state: Path, kind: str) -> list[dict[str, Any]]:
    path = state / "events" / "invocation-service-0.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in found if e["kind"] == kind]


def log_lines(state: Path, component: str = "invocation-service-0") -> list[str]:
    return (state / "logs" / f"{component}.log").read_text().splitlines()


def client_port(state: Path, ip: str, port: int) -> int:
    return json.loads((state / "netmap.json").read_text())["bindings"][f"{ip}:{port}/tcp"]


@pytest.fixture(scope="module")
def stack(ncpsim_stack_module) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    yield ncpsim_stack_module(
        values={
            "workerCallbackProxy": {
                "enabled": True,
                "workerDomain": "grpc-worker.example.com",
                "service": {"type": "LoadBalancer"},
            },
            "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}},
            "nats": {
                "config": {
                    "cluster": {"enabled": False},  # one server: stopping it is a dead bus
                    # nats-server's own auth timeout, not ncpsim's 10 s: the worker's sign-in to the
                    # restarted server, if it comes before the callout's, is refused after 2 s, made anew
                    "merge": {"authorization": {"timeout": 2}},
                },
                "jetstream": {"publishTimeoutSeconds": PUBLISH_TIMEOUT},
            },
        },
        topology={
            "invocationReplicas": 1,
            "grpcProxyReplicas": 1,
            "computeClusters": [{"workers": [{"count": 1, "trust": "system"}]}],
        },
    )


@pytest.fixture
def conn(stack: Any) -> Iterator[http.client.HTTPConnection]:
    port = client_port(stack.state_dir, "10.42.0.11", 8080)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=SHORT)
    try:
        yield connection
    finally:
        connection.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_call_is_refused_logged_and_the_next_call_works(
    case: Hostile, stack: Any, conn: http.client.HTTPConnection
) -> None:
    state = stack.state_dir
    published, logged = len(events(state, "work.published")), len(log_lines(state))
    answer = post(conn, case.path, case.poll)
    assert answer.status == case.status, answer
    said = answer.body.decode() if answer.content_type == "text/plain" else answer.problem["detail"]
    assert case.says in said, answer
    if answer.content_type != "text/plain":
        assert answer.problem["status"] == case.status and answer.problem["title"], answer
    # One line in the pod's log, naming the refusal; no work for a worker to run.
    new = log_lines(state)[logged:]
    assert len(new) == 1 and f": {case.status} " in new[0] and "WARNING" in new[0], new
    assert len(events(state, "work.published")) == published, "a refused call published work"
    # The same connection, then the pod, keep serving: the next good call is answered by a worker.
    good = post(conn, PEXEC + "http-echo")
    assert good.status == 200 and good.body == b"ping", good


def raw_exchange(port: int, head: bytes) -> bytes:
    """Send a request head as bytes and read until the pod closes. hyper answers a head past its buffer
    before it has all come and closes with bytes unread (a reset): the head is sent beside the reading, and
    the reset, on either side, ends the exchange after what was read."""

    def send() -> None:
        with contextlib.suppress(OSError):
            sock.sendall(head)

    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=SHORT) as sock:
        sender = threading.Thread(target=send)
        sender.start()
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
        finally:
            sender.join(SHORT)
    return got


@pytest.mark.parametrize(
    ("name", "head", "status"),
    [
        ("1mb-id", f"POST {PEXEC}{'a' * 1024 * 1024} HTTP/1.1\r\nhost: x\r\n\r\n", 431),
        ("100kb-id", f"POST {PEXEC}{'a' * 100 * 1024} HTTP/1.1\r\nhost: x\r\n\r\n", 414),
        ("101-fields", f"POST {PEXEC}http-echo HTTP/1.1\r\nhost: x\r\n" + "x-h: v\r\n" * 100 + "\r\n", 431),
        ("bad-head", "POST\x00 / HTTP/1.1\r\n\r\n", 400),
    ],
)
def test_a_head_past_hypers_limits_is_refused_and_the_next_call_works(
    name: str, head: str, status: int, stack: Any
) -> None:
    """hyper's head limits (sim.protocols.pexec): the status with no body, the connection closed, one line."""
    state = stack.state_dir
    logged = len(log_lines(state))
    got = raw_exchange(client_port(state, "10.42.0.11", 8080), head.encode())
    assert got.startswith(f"HTTP/1.1 {status} ".encode()), got[:200]
    assert got.endswith(b"\r\n\r\n") and b"content-length: 0" in got, got[:200]
    new = log_lines(state)[logged:]
    assert len(new) == 1 and f"request head refused: {status} " in new[0] and len(new[0]) < 300, new
    with contextlib.closing(
        http.client.HTTPConnection("127.0.0.1", client_port(state, "10.42.0.11", 8080))
    ) as c:
        good = post(c, PEXEC + "http-echo")
    assert good.status == 200 and good.body == b"ping", good


@pytest.mark.parametrize(
    ("values", "attempt", "deadline"),
    [
        ({}, 2.0, 8.0),  # three attempts of 2 s, the pauses between them (1 s), a margin (1 s)
        ({"nats": {"jetstream": {"publishTimeoutSeconds": PUBLISH_TIMEOUT}}}, PUBLISH_TIMEOUT, 3.5),
    ],
)
def test_the_pods_give_up_on_a_dead_bus_after_every_publish_attempt(
    values: dict[str, Any], attempt: float, deadline: float
) -> None:
    assert NatsValues.from_values(values).publish_timeout == attempt
    assert publish_deadline(attempt) == pytest.approx(deadline)


def test_head_refusal_follows_hyper() -> None:
    assert head_refusal(HEAD_BUFFER, "/" * URI_MAX, HEAD_FIELDS) is None
    assert head_refusal(HEAD_BUFFER, "/" * (URI_MAX + 1), HEAD_FIELDS) == 414
    assert head_refusal(100, "/", HEAD_FIELDS + 1) == 431
    assert head_refusal(HEAD_BUFFER + 1, "/", 1) == 431
    assert head_size("GET", "/", [("host", "x")]) == len(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert unreadable_head(431) == 431 and unreadable_head(400) == 400 and unreadable_head(413) == 400


def test_no_component_logged_a_traceback(stack: Any, conn: http.client.HTTPConnection) -> None:
    """Run after the cases above (pytest keeps file order): not a line of any log is a traceback."""
    assert post(conn, PEXEC + "http-echo").status == 200  # negative control: the logs are being written
    for log in sorted((stack.state_dir / "logs").glob("*.log")):
        text = log.read_text()
        assert not any(word in text for word in UNTRACEABLE), f"{log.name}:\n{text[-3000:]}"


def test_a_dead_bus_is_the_apis_error_and_the_next_call_after_it_works(
    stack: Any, conn: http.client.HTTPConnection
) -> None:
    """nats-server stopped: the invocation pod answers the API's 500 (it died in client_connected_cb with
    NoStreamResponseError), grpc-proxy answers UNAVAILABLE; started again, the next call of each succeeds."""
    state = stack.state_dir
    grpc_port = client_port(state, "10.42.0.41", 10081)
    stopped = stack.fault({"stop": "nats-0"})
    assert stopped.ok, stopped.failures
    try:
        logged = len(log_lines(state))
        refused, unavailable = asyncio.run(dead_bus_calls(conn, grpc_port))  # each waits out the publish
        assert isinstance(refused, Answer) and refused.status == 500, refused
        assert refused.problem["detail"].startswith("failed to send nats request; cause: "), refused
        new = log_lines(state)[logged:]  # nats-py's own reconnect lines may be there too, one line each
        assert len([x for x in new if ": 500 failed to send nats request" in x]) == 1, new
        assert isinstance(unavailable, grpc.aio.AioRpcError), unavailable
        assert unavailable.code() == grpc.StatusCode.UNAVAILABLE
        assert "NATS unreachable" in (unavailable.details() or "")
    finally:
        # One step: the bus started, then the worker's next pull (nats-py reconnects on its own schedule,
        # every 0.5 s, sim.nats.work), counted from before the start, so a quick one is not missed.
        started = stack.fault({"start": "nats-0"}, wait={"event": "worker.work.pulling", "timeout": 40})
        assert started.ok, started.failures
    good = post(conn, PEXEC + "http-echo")
    assert good.status == 200 and good.body == b"ping", good
    assert asyncio.run(unary(grpc_port)) == b"after"
    for log in sorted((state / "logs").glob("*.log")):  # every component lived through the outage
        text = log.read_text()
        assert not any(word in text for word in UNTRACEABLE), f"{log.name}:\n{text[-3000:]}"


async def dead_bus_calls(
    conn: http.client.HTTPConnection, grpc_port: int
) -> tuple[Answer | BaseException, bytes | BaseException]:
    """The HTTP call and the gRPC call at once (two pods, two publishes): what each ended with."""
    return await asyncio.gather(
        asyncio.to_thread(post, conn, PEXEC + "http-echo"), unary(grpc_port), return_exceptions=True
    )


async def unary(port: int) -> bytes:
    async with EchoClient(("127.0.0.1", port)) as echo:
        return await echo.unary(b"after", timeout=SHORT)
