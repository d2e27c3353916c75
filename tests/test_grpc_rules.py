"""Pure tables: callback tokens, the callback request check, URLs, retries, gRPC framing, the echo service."""

from __future__ import annotations

import json
import random

import pytest

from sim.protocols.grpc_callback import (
    INVALID_AUTH,
    INVALID_REQUEST_ID,
    MAX_ATTEMPTS,
    METHOD_NOT_ALLOWED,
    MISSING_AUTH,
    MISSING_REQUEST_ID,
    NOT_FOUND,
    TOKEN_ALPHABET,
    TOKEN_LENGTH,
    Accept,
    Reject,
    TokenBook,
    check_callback,
    connect_url,
    new_request_id,
    parse_connect_url,
    retry_delay,
)
from sim.protocols.grpc_tunnel import STREAM, UNARY, Deframer, GrpcError, echo_replies, frame_message

RID = "3b241101-e2bb-4255-8caf-4136c566a962"
TOKEN = "T" * 64


# -- tokens --------------------------------------------------------------------------------------
def test_tokens_are_64_chars_single_use_and_bound_to_their_request() -> None:
    book = TokenBook(random.Random(1))
    token = book.mint(RID, now=100.0)
    assert len(token) == TOKEN_LENGTH and set(token) <= set(TOKEN_ALPHABET)
    assert not book.redeem(token, new_request_id(random.Random(2)), now=101.0)  # another request's id
    assert book.redeem(token, RID, now=101.0)
    assert not book.redeem(token, RID, now=101.0)  # spent


@pytest.mark.parametrize(("redeem_at", "valid"), [(129.9, True), (130.0, False), (500.0, False)])
def test_tokens_live_30_seconds(redeem_at: float, valid: bool) -> None:
    book = TokenBook(random.Random(1))
    token = book.mint(RID, now=100.0)
    assert book.redeem(token, RID, now=redeem_at) is valid
    assert len(book) == 0


def test_revoked_tokens_and_seeded_replays() -> None:
    book = TokenBook(random.Random(5))
    token = book.mint(RID, now=0.0)
    book.revoke(token)
    assert not book.redeem(token, RID, now=1.0)
    assert TokenBook(random.Random(5)).mint(RID, 0.0) == token  # same seed, same token
    assert new_request_id(random.Random(3)) == new_request_id(random.Random(3))


# -- the callback request ------------------------------------------------------------------------
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("method", "path", "headers", "verdict"),
    [
        ("POST", "/v1/proxy", {**AUTH, "x-request-id": RID}, Accept(TOKEN, RID)),
        ("POST", "/v1/proxy?x=1", {**AUTH, "x-request-id": RID.upper()}, Accept(TOKEN, RID)),
        (
            "POST",
            "/v1/proxy",
            {"authorization": f"bearer  {TOKEN} ", "x-request-id": RID},
            Accept(TOKEN, RID),
        ),
        ("POST", "/v1/proxy", {"x-request-id": RID}, Reject(401, MISSING_AUTH)),
        ("POST", "/v1/proxy", {"authorization": "Bearer ", "x-request-id": RID}, Reject(401, MISSING_AUTH)),
        (
            "POST",
            "/v1/proxy",
            {"authorization": f"Basic {TOKEN}", "x-request-id": RID},
            Reject(401, MISSING_AUTH),
        ),
        ("POST", "/v1/proxy", {}, Reject(401, MISSING_AUTH)),  # auth is judged first
        ("POST", "/v1/proxy", AUTH, Reject(400, MISSING_REQUEST_ID)),
        ("POST", "/v1/proxy", {**AUTH, "x-request-id": "  "}, Reject(400, MISSING_REQUEST_ID)),
        ("POST", "/v1/proxy", {**AUTH, "x-request-id": "req-1"}, Reject(400, INVALID_REQUEST_ID)),
        ("POST", "/v1/proxy", {**AUTH, "x-request-id": RID + "0"}, Reject(400, INVALID_REQUEST_ID)),
        ("POST", "/v2/proxy", {**AUTH, "x-request-id": RID}, Reject(404, NOT_FOUND)),
        ("GET", "/v1/proxy", {**AUTH, "x-request-id": RID}, Reject(405, METHOD_NOT_ALLOWED)),
    ],
)
def test_check_callback(method: str, path: str, headers: dict, verdict: Accept | Reject) -> None:
    assert check_callback(method, path, headers) == verdict


def test_rejection_messages_are_word_for_word() -> None:
    assert (MISSING_AUTH, MISSING_REQUEST_ID, INVALID_REQUEST_ID, INVALID_AUTH) == (
        "HTTP CONNECT request is missing auth",
        "HTTP CONNECT request is missing request id",
        "HTTP CONNECT request has an invalid request id",
        "HTTP CONNECT request is missing valid auth",
    )


# -- URLs and retries ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("proxy", "url", "host", "port"),
    [
        (
            True,
            "https://10-42-0-41.grpc-worker.example.com/v1/proxy",
            "10-42-0-41.grpc-worker.example.com",
            443,
        ),
        (
            False,
            "https://10-42-0-41.grpc-headless.nvcf.svc.cluster.local:10084/v1/proxy",
            "10-42-0-41.grpc-headless.nvcf.svc.cluster.local",
            10084,
        ),
    ],
)
def test_connect_urls(proxy: bool, url: str, host: str, port: int) -> None:
    assert connect_url("10.42.0.41", "grpc-worker.example.com", proxy) == url
    target = parse_connect_url(url)
    assert (target.host, target.port, target.path) == (host, port, "/v1/proxy")


@pytest.mark.parametrize("url", ["http://a.example.com/v1/proxy", "https:///v1/proxy", "a.example.com"])
def test_connect_url_must_be_https(url: str) -> None:
    with pytest.raises(ValueError):
        parse_connect_url(url)


@pytest.mark.parametrize(
    ("attempt", "status", "delay"),
    [
        (1, None, 0.010),
        (2, 503, 0.020),
        (3, 400, 0.040),
        (5, None, 0.160),
        (MAX_ATTEMPTS, None, None),
        (1, 200, None),
        (1, 401, None),
        (1, 403, None),
    ],
)
def test_retry_delay(attempt: int, status: int | None, delay: float | None) -> None:
    assert retry_delay(attempt, status) == (pytest.approx(delay) if delay else None)


def test_five_retries_after_the_first_attempt() -> None:
    delays = [retry_delay(n, None) for n in range(1, 10)]
    assert delays.index(None) == 5 and MAX_ATTEMPTS == 6


# -- gRPC framing and the echo service -----------------------------------------------------------
MESSAGES = [b"", b"a", b"x" * 70000]
WIRE = b"".join(frame_message(m) for m in MESSAGES)


def test_deframer_whole_and_byte_by_byte() -> None:
    assert Deframer().feed(WIRE) == MESSAGES
    deframer, got = Deframer(), []
    for i in range(len(WIRE)):
        got += deframer.feed(WIRE[i : i + 1])
    assert got == MESSAGES and not deframer.partial


def test_deframer_keeps_trailing_partial_message() -> None:
    deframer = Deframer()
    assert deframer.feed(WIRE + frame_message(b"next")[:7]) == MESSAGES
    assert deframer.partial
    assert deframer.feed(frame_message(b"next")[7:]) == [b"next"]


def test_deframer_refuses_compressed_messages() -> None:
    with pytest.raises(GrpcError):
        Deframer().feed(b"\x01\x00\x00\x00\x01x")


def test_echo_replies() -> None:
    assert echo_replies(UNARY, b"\x00raw") == [b"\x00raw"]
    replies = echo_replies(STREAM, json.dumps({"text": "hi", "count": 3}).encode())
    assert [json.loads(r) for r in replies] == [
        {"seq": 0, "text": "hi"},
        {"seq": 1, "text": "hi"},
        {"seq": 2, "text": "hi"},
    ]


@pytest.mark.parametrize(
    ("path", "request_body", "status"),
    [
        ("/ncpsim.Echo/Nope", b"", 12),
        (STREAM, b"not json", 3),
        (STREAM, b'{"text": "x"}', 3),
        (STREAM, b'{"text": "x", "count": -1}', 3),
        (STREAM, b'{"text": "x", "count": 10001}', 3),
    ],
)
def test_echo_errors(path: str, request_body: bytes, status: int) -> None:
    with pytest.raises(GrpcError) as err:
        echo_replies(path, request_body)
    assert err.value.status == status
