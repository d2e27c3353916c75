"""The gRPC callback contract as pure decisions: tokens, the callback request check, URLs, retries.

grpc-proxy (sim.pods.grpcproxy) and the worker (sim.worker.grpc_callback) only move bytes around these. Time and
randomness come in as arguments, so a replay with the same seed mints the same tokens and request ids.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from dns.rule import dashed_ip
from sim.wire import GRPC_CALLBACK_PATH, GRPC_CALLBACK_PORT, GRPC_SUFFIX

TOKEN_TTL = 30.0  # seconds a callback token stays valid
TOKEN_LENGTH = 64
TOKEN_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
CALLBACK_PATH = GRPC_CALLBACK_PATH

# grpc-proxy's answers, word for word (DESIGN.md section 2).
MISSING_AUTH = "HTTP CONNECT request is missing auth"
MISSING_REQUEST_ID = "HTTP CONNECT request is missing request id"
INVALID_REQUEST_ID = "HTTP CONNECT request has an invalid request id"
INVALID_AUTH = "HTTP CONNECT request is missing valid auth"
NOT_FOUND = "404 page not found"  # grpc-proxy is a Go server: its mux's default text
METHOD_NOT_ALLOWED = "method not allowed"

# Worker retries: the first attempt and 5 retries, 10 ms doubling; never after 401/403 (DESIGN.md 2).
MAX_ATTEMPTS = 6
FIRST_DELAY = 0.010
NO_RETRY_STATUSES = (401, 403)


@dataclass
class _Grant:
    request_id: str
    expires: float


class TokenBook:
    """One pod's in-memory, single-use callback tokens."""

    def __init__(self, rng: random.Random, ttl: float = TOKEN_TTL):
        self.rng, self.ttl = rng, ttl
        self._grants: dict[str, _Grant] = {}

    def __len__(self) -> int:
        return len(self._grants)

    def mint(self, request_id: str, now: float) -> str:
        self.expire(now)
        token = "".join(self.rng.choice(TOKEN_ALPHABET) for _ in range(TOKEN_LENGTH))
        self._grants[token] = _Grant(request_id, now + self.ttl)
        return token

    def redeem(self, token: str, request_id: str, now: float) -> bool:
        """True once for a live token minted for `request_id`; it is spent by that use."""
        self.expire(now)
        grant = self._grants.get(token)
        if grant is None or grant.request_id != request_id:
            return False
        del self._grants[token]
        return True

    def revoke(self, token: str) -> None:
        self._grants.pop(token, None)

    def expire(self, now: float) -> None:
        for token in [t for t, g in self._grants.items() if g.expires <= now]:
            del self._grants[token]


def new_request_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


@dataclass(frozen=True)
class Accept:
    token: str
    request_id: str  # canonical form


@dataclass(frozen=True)
class Reject:
    status: int
    message: str


def check_callback(method: str, path: str, headers: Mapping[str, str]) -> Accept | Reject:
    """Judge a callback request's head (header names lower-case); the token itself is checked later."""
    if path.split("?", 1)[0] != CALLBACK_PATH:
        return Reject(404, NOT_FOUND)
    if method != "POST":
        return Reject(405, METHOD_NOT_ALLOWED)
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return Reject(401, MISSING_AUTH)
    raw_id = headers.get("x-request-id", "").strip()
    if not raw_id:
        return Reject(400, MISSING_REQUEST_ID)
    try:
        request_id = str(uuid.UUID(raw_id))
    except ValueError:
        return Reject(400, INVALID_REQUEST_ID)
    return Accept(token.strip(), request_id)


def connect_url(pod_ip: str, worker_domain: str, proxy_enabled: bool) -> str:
    """What a pod hands the worker: its dashed IP under the worker domain, or its own name without a proxy."""
    if proxy_enabled:
        return f"https://{dashed_ip(pod_ip)}.{worker_domain}{CALLBACK_PATH}"
    return f"https://{dashed_ip(pod_ip)}.{GRPC_SUFFIX}:{GRPC_CALLBACK_PORT}{CALLBACK_PATH}"


@dataclass(frozen=True)
class CallbackTarget:
    host: str
    port: int
    path: str


def parse_connect_url(url: str) -> CallbackTarget:
    """The worker's reading of a connect URL (https only; port 443 unless given)."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"connect URL must be https://host[:port]/path, got {url!r}")
    return CallbackTarget(parts.hostname, parts.port or 443, parts.path or "/")


def retry_delay(attempt: int, status: int | None) -> float | None:
    """Seconds to wait before attempt `attempt + 1`, or None to stop (`status` None: no HTTP answer)."""
    if status == 200 or status in NO_RETRY_STATUSES or attempt >= MAX_ATTEMPTS:
        return None
    return FIRST_DELAY * 2.0 ** (attempt - 1)


def work_message(request_id: str, token: str, url: str, pod: str) -> dict[str, str]:
    return {
        "requestId": request_id,
        "functionId": "grpc-echo",
        "kind": "grpc",
        "connectUrl": url,
        "token": token,
        "pod": pod,
    }
