"""Table tests for the small pure cores: tokens, +h1 framing, the network map, the access-log format."""

from __future__ import annotations

import random

import pytest

from sim.model.netmap import NetMap, Refused, Unreachable
from sim.model.topology import build
from sim.model.values import DEFAULTS
from sim.protocols.request_attach import (
    INCOMPLETE,
    INNER_TE,
    INVALID_TOKEN,
    MISSING_TOKEN,
    InnerResponse,
    TokenBook,
    parse_inner_response,
    request_h1,
)
from sim.proxy.access_log import AccessRecord, format_record, parse_line
from sim.worker.http_callback import echo_function


def test_tokens_are_single_use_and_per_leg() -> None:
    book = TokenBook(random.Random(1))
    request = book.mint("r1", "request")
    response = book.mint("r1", "response")
    assert len(request) == 64 and request != response
    assert book.redeem(None, "request") == (401, MISSING_TOKEN, None)
    assert book.redeem(f"Bearer {response}", "request") == (401, INVALID_TOKEN, None)  # wrong leg
    assert book.redeem(f"Bearer {request}", "request") == (200, "", "r1")
    assert book.redeem(f"Bearer {request}", "request") == (401, INVALID_TOKEN, None)  # reused
    other_pod = TokenBook(random.Random(2))
    assert other_pod.redeem(f"Bearer {response}", "response")[0] == 401  # tokens live on one pod only


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi",
            InnerResponse(200, (("content-length", "2"),), b"hi"),
        ),
        (b"HTTP/1.1 404 Not Found\r\n\r\n", InnerResponse(404, (), b"")),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhi", INCOMPLETE),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", INNER_TE),
        (b"HTTP/1.1 200 OK\r\ncontent-le", INCOMPLETE),
        (b"", INCOMPLETE),
        (b"not http", INCOMPLETE),
    ],
)
def test_parse_inner_response(raw: bytes, expected: object) -> None:
    assert parse_inner_response(raw) == expected


def test_inner_response_byte_by_byte_prefixes_are_incomplete() -> None:
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"
    for cut in range(len(raw)):
        assert parse_inner_response(raw[:cut]) == INCOMPLETE or cut >= raw.index(b"\r\n\r\n") + 4


def test_echo_function_round_trip_through_h1_framing() -> None:
    request = request_h1("POST", "/", [("content-type", "application/json")], b'{"a":1}')
    answer = parse_inner_response(echo_function(request))
    assert answer == InnerResponse(
        200, (("content-type", "application/json"), ("content-length", "7")), b'{"a":1}'
    )


def netmap() -> NetMap:
    topology = build("t", DEFAULTS, compute=())
    return NetMap(
        bindings={"10.42.0.11:8443/tcp": 4000, "10.100.0.10:10084/tcp": 4001},
        reach={
            "ncpsim-cp": topology.reachable_ranges("ncpsim-cp"),
            "ncpsim-compute-1": ["10.52.0.0/16", "10.53.0.0/16", "10.100.0.0/24"],
        },
    )


@pytest.mark.parametrize(
    ("cluster", "ip", "port", "expected"),
    [
        ("ncpsim-cp", "10.42.0.11", 8443, ("127.0.0.1", 4000)),
        ("ncpsim-compute-1", "10.100.0.10", 10084, ("127.0.0.1", 4001)),
        ("ncpsim-cp", "10.100.0.10", 10084, ("127.0.0.1", 4001)),
        ("ncpsim-compute-1", "10.42.0.11", 8443, Unreachable),  # compute clusters cannot route to pod IPs
        ("ncpsim-cp", "10.42.0.12", 8443, Refused),  # routable, nothing listening
        ("ncpsim-cp", "10.42.0.11", 8080, Refused),
        ("unknown-cluster", "10.100.0.10", 10084, Unreachable),
    ],
)
def test_netmap_lookup(cluster: str, ip: str, port: int, expected: object) -> None:
    if isinstance(expected, type):
        with pytest.raises(expected):
            netmap().lookup(cluster, ip, port)
    else:
        assert netmap().lookup(cluster, ip, port) == expected


def test_access_log_line_round_trips_in_envoy_format() -> None:
    record = AccessRecord(
        start=1795939200.123,
        method="GET",
        path="/v2/nvcf/worker/request-attach",
        status=404,
        flags="NR",
        request_id="abc",
        authority="x:8443",
        user_agent="curl/8",
    )
    line = format_record(record)
    assert line.startswith(
        '[2026-11-29T08:00:00.123Z] "GET /v2/nvcf/worker/request-attach HTTP/1.1" 404 NR 0 0 0 -'
    )
    assert line.endswith('"-" "curl/8" "abc" "x:8443" "-"')
    parsed = parse_line(line)
    assert parsed is not None and parsed["flags"] == "NR" and parsed["status"] == "404"
