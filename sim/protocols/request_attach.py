"""Pure parts of the invocation-service stand-in: tokens, and the `+h1` request/response framing."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

import h11

from sim.protocols.h1plain import head_end, plain_request_out, plain_response, request_bytes

INVALID_TOKEN = "The provided authorization token is invalid or has expired"
MISSING_TOKEN = "Missing authorization token"
INCOMPLETE = "Incomplete HTTP response"
INNER_TE = "Transfer-Encoding in the inner response is not supported"
H1_TYPE = "application/octet-stream+h1"


@dataclass
class TokenBook:
    """Per-pod, in-memory, single-use bearer tokens (a callback on another pod finds nothing)."""

    rng: random.Random
    _tokens: dict[str, tuple[str, str]] = field(default_factory=dict)  # token -> (request id, leg)

    def mint(self, request_id: str, leg: str) -> str:
        token = f"{self.rng.getrandbits(256):064x}"
        self._tokens[token] = (request_id, leg)
        return token

    def redeem(self, authorization: str | None, leg: str) -> tuple[int, str, str | None]:
        """(status, message, request id): 200 and the request id, or the 401 the pod answers."""
        if not authorization or not authorization.startswith("Bearer "):
            return 401, MISSING_TOKEN, None
        entry = self._tokens.get(authorization[len("Bearer ") :].strip())
        if entry is None or entry[1] != leg:
            return 401, INVALID_TOKEN, None
        del self._tokens[authorization[len("Bearer ") :].strip()]
        return 200, "", entry[0]


def token_fingerprint(authorization: str | None) -> str | None:
    """A short, one-way name for a bearer token, so events can say which token a leg carried without
    writing the token: the worker records the ones it was handed, the pod the one it received."""
    if not authorization:
        return None
    token = authorization.removeprefix("Bearer ").strip()
    return hashlib.sha256(token.encode("latin-1", errors="replace")).hexdigest()[:12]


def request_h1(method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """The client's request as an HTTP/1.1 message: what a worker gets with Accept +h1."""
    hdrs = [(k, v) for k, v in headers if k.lower() not in ("content-length", "transfer-encoding")]
    if not any(k.lower() == "host" for k, _ in hdrs):
        hdrs.insert(0, ("host", "function"))
    hdrs.append(("content-length", str(len(body))))
    if plain_request_out(method, path, hdrs, len(body)):  # the common request: h11's bytes, without h11
        return request_bytes(method, path, hdrs) + body
    conn = h11.Connection(h11.CLIENT)
    out = conn.send(h11.Request(method=method, target=path, headers=hdrs)) or b""
    if body:
        out += conn.send(h11.Data(data=body)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


@dataclass(frozen=True)
class InnerResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def parse_inner_response(raw: bytes) -> InnerResponse | str:
    """A worker's POSTed response, or the 400 message the pod answers. A plain one (sim.protocols.h1plain) is
    read without h11, as h11 reads it."""
    end = head_end(raw)
    plain = plain_response(raw[:end]) if end >= 0 else None
    if plain is not None and len(raw) >= end + plain.length:
        return InnerResponse(plain.status, plain.headers, raw[end : end + plain.length])
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "function")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    conn.receive_data(b"")
    status, chunks = 0, []
    headers: tuple[tuple[str, str], ...] = ()
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                headers = tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in event.headers)
                if any(k == "transfer-encoding" for k, _ in headers):
                    return INNER_TE
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return InnerResponse(status, headers, b"".join(chunks))
            elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return INCOMPLETE
    except h11.RemoteProtocolError:
        return INCOMPLETE
