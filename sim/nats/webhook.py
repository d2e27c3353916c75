"""The callout's webhook leg: the request it POSTs, the answer it reads.

Why: in token mode the callout does not judge worker tokens itself; it POSTs
``{"account", "pluginName", "payload"}`` to the NVCF API's webhook
(``/v2/nvcf/webhook/nats-auth``), which answers ``{"userId", "account",
"permissions", "ttl"}`` (public NVCF source). A webhook here is any async callable
from a WebhookRequest to a WebhookAnswer: ``http_webhook`` speaks real HTTP/1.1
with asyncio streams, ``token_checker`` adapts a plain ``check(token) -> fvid``
for tests and in-process stand-ins, and ``answer_body`` builds the API's answer
so an HTTP stand-in returns exactly what the adapter would.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from .jwt import Permissions
from .subjects import worker_permissions, worker_user_id

USER_AGENT = "auth-callout-service/1.0"
WEBHOOK_TIMEOUT = 5.0  # seconds for one webhook POST, connect to last byte


@dataclass(frozen=True)
class WebhookRequest:
    account: str
    plugin_name: str
    payload: str

    def to_json(self) -> bytes:
        return json.dumps(
            {"account": self.account, "pluginName": self.plugin_name, "payload": self.payload}
        ).encode()


@dataclass(frozen=True)
class WebhookAnswer:
    """What came back: ``status`` 0 means no HTTP answer at all (``error`` says why)."""

    status: int
    body: bytes = b""
    error: str = ""


Webhook = Callable[[WebhookRequest], Awaitable[WebhookAnswer]]


def permissions_to_json(p: Permissions) -> dict[str, Any]:
    out: dict[str, Any] = {
        "publish": {"allow": list(p.pub_allow), "deny": list(p.pub_deny)},
        "subscribe": {"allow": list(p.sub_allow), "deny": list(p.sub_deny)},
    }
    if p.resp_max:
        out["response"] = {"maxMsgs": p.resp_max}
    return out


def permissions_from_json(data: Any) -> Permissions | None:
    """The webhook's ``permissions`` object; None when absent (whole account)."""
    if not isinstance(data, dict):
        return None

    def items(section: str, key: str) -> tuple[str, ...]:
        return tuple(str(s) for s in ((data.get(section) or {}).get(key) or ()))

    return Permissions(
        pub_allow=items("publish", "allow"),
        pub_deny=items("publish", "deny"),
        sub_allow=items("subscribe", "allow"),
        sub_deny=items("subscribe", "deny"),
        resp_max=int((data.get("response") or {}).get("maxMsgs") or 0),
    )


def answer_body(
    fvid: str, account: str, regions: tuple[str, ...], scope: Literal["own", "source"] = "own"
) -> bytes:
    """The API's 200 body for a valid worker token of function version ``fvid``."""
    return json.dumps(
        {
            "userId": worker_user_id(fvid),
            "account": account,
            "permissions": permissions_to_json(worker_permissions(fvid, regions, scope)),
            "ttl": None,  # the API never limits a worker connection's lifetime
        }
    ).encode()


def token_checker(
    check: Callable[[str], Awaitable[str | None]],
    regions: tuple[str, ...],
    scope: Literal["own", "source"] = "own",
) -> Webhook:
    """A webhook from ``check(token) -> function version id | None`` (None: 403)."""

    async def webhook(request: WebhookRequest) -> WebhookAnswer:
        fvid = await check(request.payload)
        if fvid is None:
            return WebhookAnswer(403, b'{"detail":"invalid worker token"}')
        return WebhookAnswer(200, answer_body(fvid, request.account, regions, scope))

    return webhook


# How the callout reaches the webhook's host: (host, port, TLS context or None) -> a connection. Raises
# OSError whose text is the dialer's own (in the stack: Go's, "dial tcp ...: connect: connection refused").
Dial = Callable[
    [str, int, ssl.SSLContext | None], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
]


async def _open(
    host: str, port: int, tls: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(host, port, ssl=tls)


def http_webhook(
    url: str,
    timeout: float = WEBHOOK_TIMEOUT,
    ssl_context: ssl.SSLContext | None = None,
    dial: Dial = _open,
) -> Webhook:
    """A webhook that POSTs JSON to ``url`` (http or https) over HTTP/1.1; ``dial`` reaches its host."""

    async def webhook(request: WebhookRequest) -> WebhookAnswer:
        try:
            status, body = await asyncio.wait_for(_post(url, request.to_json(), ssl_context, dial), timeout)
        except TimeoutError:
            # Go's net/http, when the client's timeout runs out before an answer
            return WebhookAnswer(0, error=f'Post "{url}": context deadline exceeded')
        except (OSError, ValueError) as exc:
            return WebhookAnswer(0, error=f'Post "{url}": {exc}')
        return WebhookAnswer(status, body)

    return webhook


async def _post(url: str, body: bytes, ssl_context: ssl.SSLContext | None, dial: Dial) -> tuple[int, bytes]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"unsupported webhook URL {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    context = (ssl_context or ssl.create_default_context()) if tls else None
    reader, writer = await dial(parts.hostname, port, context)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = (
            f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nUser-Agent: {USER_AGENT}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        await writer.drain()
        return await _read_response(reader)
    finally:
        writer.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status_line = (await reader.readline()).decode("latin-1")
    fields = status_line.split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not fields[1].isdigit():
        raise ValueError(f"bad HTTP status line {status_line.strip()!r}")
    headers: dict[str, str] = {}
    while (line := (await reader.readline()).decode("latin-1").strip()) != "":
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while (size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16)) > 0:
            body += await reader.readexactly(size)
            await reader.readline()
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
    return int(fields[1]), body
