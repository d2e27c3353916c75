"""A failed call's error in the report: the status the client got, and the API's own words for it."""

from __future__ import annotations

import json

import pytest

from scenarios.calls import client_got

NATS_DOWN = "failed to send nats request; cause: Error publishing to nats; cause: NoStreamResponseError"


def problem(status: int, detail: str) -> bytes:  # as sim.pods.invocation answers (RFC 9457)
    return json.dumps({"status": status, "title": "Internal Server Error", "detail": detail}).encode()


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (500, problem(500, NATS_DOWN), f"client got 500: {NATS_DOWN}"),
        (401, b"missing bearer token\n", "client got 401: missing bearer token"),  # text/plain
        (502, b"", "client got 502"),
        (500, json.dumps({"status": 500}).encode(), "client got 500"),  # a problem without a detail
        (200, b'{"step": 9}', "client got 200"),  # the wrong body of a success is not an error's words
        (503, problem(503, "x" * 400), "client got 503: " + "x" * 300 + "..."),
    ],
)
def test_the_error_carries_the_apis_words(status: int, body: bytes, said: str) -> None:
    assert client_got(status, body) == said
