"""The NATS auth callout: who may log in, as whom, to what (decision pure, I/O thin).

Why it behaves this way (public NVCF ``nats-auth-callout`` and the seeds):

- nats-server sends every login not in ``auth_users`` to ``$SYS.REQ.USER.AUTH`` as a
  server-signed JWT; the callout answers with a JWT signed by the issuer account
  key holding either a user JWT (``aud`` = account to bind) or an error string.
- A login with a token is routed by the token's ``account`` and ``pluginName``
  (base64url JSON ``{"account","pluginName","payload"}``); a login with an NKey goes
  to the nkey plugin, which maps known public keys to an account.
- Token mode registers the webhook plugin for APP only, so an old worker-utils
  asking for account ``Worker`` gets ``plugin webhook not found for account Worker``.
- The error text reaches the callout's log and nats-server's log ("Auth callout
  service returned an error: ..."); the client itself only sees
  ``Authorization Violation`` (checked on nats-server 2.15.1).

``decide`` is sans-I/O: it returns Grant, Deny or CallWebhook; after the webhook
the caller asks again with the answer. ``CalloutService`` only moves messages. What
both read from outside their trust (the client's token, nats-server's authorization
request) is read as the Go callout reads it, in its words: sim.nats.token.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nkeys  # type: ignore[import-untyped]

from . import jwt
from .config import APP_ACCOUNT
from .token import TokenError, read_authorization_request, read_token
from .webhook import Webhook, WebhookAnswer, WebhookRequest, permissions_from_json

AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
QUEUE_GROUP = "auth-callout"
MAX_CONCURRENT = 256  # logins handled at once (webhook calls overlap)
NKEY_PLUGIN, WEBHOOK_PLUGIN = "nkey", "webhook"


def worker_token(payload: str, account: str = APP_ACCOUNT, plugin_name: str = WEBHOOK_PLUGIN) -> str:
    """The token a worker connects with: base64url JSON naming account and plugin."""
    data = json.dumps({"account": account, "pluginName": plugin_name, "payload": payload})
    return base64.urlsafe_b64encode(data.encode()).decode("ascii")


@dataclass(frozen=True)
class AuthRequest:
    """The parts of the server's authorization request the decision needs."""

    user_nkey: str
    server_id: str
    client_name: str = ""
    client_user: str = ""
    token: str = ""
    nkey: str = ""
    sig: str = ""
    nonce: str = ""

    @classmethod
    def from_claims(cls, claims: dict[str, Any]) -> AuthRequest:
        nats = _object(claims.get("nats"))
        info, opts = _object(nats.get("client_info")), _object(nats.get("connect_opts"))
        return cls(
            user_nkey=str(nats.get("user_nkey", "")),
            server_id=str(_object(nats.get("server_id")).get("id", "")),
            client_name=str(info.get("name", "")),
            client_user=str(info.get("user", "")),
            token=str(opts.get("auth_token", "")),
            nkey=str(opts.get("nkey", "")),
            sig=str(opts.get("sig", "")),
            nonce=str(info.get("nonce", "")),
        )


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class CalloutSettings:
    """The callout's plugin configuration, read once at start (as the real one does)."""

    nkey_mappings: tuple[tuple[str, str], ...] = ()  # (public user nkey, account)
    webhook_accounts: tuple[str, ...] = ()  # accounts with the webhook plugin (token mode: APP)
    strict_sig_encoding: bool = False  # True: only unpadded base64url signatures, as Go's callout
    user_ttl: int = 0  # seconds; 0 = user JWTs do not expire

    @classmethod
    def for_mode(cls, worker_auth: str, nkey_mappings: tuple[tuple[str, str], ...]) -> CalloutSettings:
        return cls(
            nkey_mappings=nkey_mappings, webhook_accounts=(APP_ACCOUNT,) if worker_auth == "token" else ()
        )


@dataclass(frozen=True)
class Grant:
    account: str
    user: str
    plugin: str
    permissions: jwt.Permissions  # Permissions() = the whole account


@dataclass(frozen=True)
class Deny:
    reason: str
    account: str = ""
    plugin: str = ""
    status: int = 0  # the webhook's HTTP status when it refused


@dataclass(frozen=True)
class CallWebhook:
    request: WebhookRequest


Decision = Grant | Deny | CallWebhook


def decide(request: AuthRequest, settings: CalloutSettings, answer: WebhookAnswer | None = None) -> Decision:
    """Route ``request`` to its plugin and judge it; pure."""
    if request.token:
        try:
            account, plugin, payload = read_token(request.token)
        except TokenError as exc:
            return Deny(f"failed to decode auth request: {exc}")
    elif request.nkey:
        account, plugin, payload = "", NKEY_PLUGIN, ""
    else:
        return Deny("missing token in auth request")
    if not plugin:
        return Deny("plugin name not specified", account)
    if plugin == NKEY_PLUGIN and account == "" and settings.nkey_mappings:
        return _nkey(request, settings)
    if plugin == WEBHOOK_PLUGIN and account in settings.webhook_accounts:
        if answer is None:
            return CallWebhook(WebhookRequest(account, plugin, payload))
        return _webhook(answer, account)
    return Deny(f"plugin {plugin} not found for account {account}", account, plugin)


def _nkey(request: AuthRequest, settings: CalloutSettings) -> Decision:
    if not request.nkey or not request.sig:
        return Deny("missing nkey or signature", plugin=NKEY_PLUGIN)
    account = dict(settings.nkey_mappings).get(request.nkey)
    if account is None:
        return Deny("nkey not found in mappings", plugin=NKEY_PLUGIN)
    try:
        signature = _signature(request.sig, settings.strict_sig_encoding)
    except (ValueError, binascii.Error, jwt.JwtError):
        return Deny("invalid signature format", account, NKEY_PLUGIN)
    if not jwt.verify_signature(request.nkey, request.nonce.encode(), signature):
        return Deny("signature verification failed", account, NKEY_PLUGIN)
    return Grant(account, request.client_user or request.user_nkey, NKEY_PLUGIN, jwt.Permissions())


def _signature(sig: str, strict: bool) -> bytes:
    """Go clients send unpadded base64url; nats-py sends padded standard base64."""
    if strict and any(c in sig for c in "+/="):
        raise ValueError("signature is not unpadded base64url")
    if "+" in sig or "/" in sig:
        return base64.b64decode(sig, validate=True)
    return jwt.b64url_decode(sig)


def _webhook(answer: WebhookAnswer, account: str) -> Decision:
    """Map the webhook's answer as the public callout's webhook plugin does."""
    status = answer.status
    if status == 0:
        return Deny(f"webhook request failed: {answer.error}", account, WEBHOOK_PLUGIN)
    if status in (401, 403):
        return Deny("webhook authentication failed", account, WEBHOOK_PLUGIN, status)
    if status == 408:
        return Deny("webhook request timeout", account, WEBHOOK_PLUGIN, status)
    if status == 429:
        return Deny("webhook rate limited", account, WEBHOOK_PLUGIN, status)
    if 400 <= status < 500:
        return Deny(f"webhook client error: {status}", account, WEBHOOK_PLUGIN, status)
    if status >= 500:
        return Deny(f"webhook service error: {status}", account, WEBHOOK_PLUGIN, status)
    try:
        body = json.loads(answer.body)
        user = str(body.get("userId") or "")
    except (ValueError, AttributeError):
        return Deny("failed to decode webhook response", account, WEBHOOK_PLUGIN, status)
    if not user:
        return Deny("webhook response missing userId", account, WEBHOOK_PLUGIN, status)
    permissions = permissions_from_json(body.get("permissions")) or jwt.Permissions()
    return Grant(str(body.get("account") or account), user, WEBHOOK_PLUGIN, permissions)


def response_jwt(
    request: AuthRequest, decision: Grant | Deny, issuer: nkeys.KeyPair, now: int, ttl: int = 0
) -> str:
    """The signed authorization response for ``decision``; pure but for the key."""
    if isinstance(decision, Deny):
        claims = jwt.authorization_response(request.user_nkey, request.server_id, error=decision.reason)
    else:
        user = jwt.user_claims(
            request.user_nkey, decision.account, decision.user, decision.permissions, now, ttl
        )
        claims = jwt.authorization_response(
            request.user_nkey, request.server_id, user_jwt=jwt.encode(user, issuer, now)
        )
    return jwt.encode(claims, issuer, now)


def log_line(logger: logging.Logger, level: int, message: str, **fields: Any) -> None:
    """``<message> {json fields}``: greppable like the real callout's structured lines; ``event`` is the
    message alone, which zap's sampler counts by (sim.nats.zaplog)."""
    logger.log(level, "%s %s", message, json.dumps(fields, sort_keys=True), extra={"event": message})


class CalloutService:
    """Connects as the callout user and answers ``$SYS.REQ.USER.AUTH``."""

    def __init__(
        self,
        url: str | Sequence[str],
        user_seed: str,
        issuer_seed: str,
        settings: CalloutSettings,
        webhook: Webhook | None = None,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
        webhook_url: str = "",
        record: Callable[..., object] | None = None,
    ) -> None:
        self.servers = [url] if isinstance(url, str) else list(url)  # every server of the cluster
        self.settings, self.webhook, self.clock = settings, webhook, clock
        self.webhook_url = webhook_url  # only for the debug line of each webhook request
        # Each decision, whatever the log's level and sampling keep of it (a stack's events).
        self.record = record or (lambda **_fields: None)
        self._user_seed = user_seed
        self._issuer = nkeys.from_seed(bytearray(issuer_seed.encode()))
        self.log = logger or logging.getLogger("ncpsim.nats.callout")
        self._nc: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)

    async def start(self, connect_timeout: float = 5.0) -> None:
        from .client import connect_once  # nats-py only here: decide() stays importable without it

        self._nc = await connect_once(
            self.servers,
            nkeys_seed_str=self._user_seed,
            name="nats-auth-callout",
            connect_timeout=connect_timeout,
            reconnect_time_wait=0.1,  # before the workers (0.5 s): they need it to sign in again
        )
        await self._nc.subscribe(AUTH_SUBJECT, queue=QUEUE_GROUP, cb=self._on_request)
        await self._nc.flush()
        log_line(
            self.log, logging.INFO, "Connected to NATS server", url=f"nats://{self._nc.connected_url.netloc}"
        )

    @property
    def url(self) -> str:
        """The server it signed in to first."""
        return self.servers[0]

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._nc is not None:
            from .client import close_client  # nats-py only here, as in start()

            await close_client(self._nc)
            self._nc = None

    async def _on_request(self, msg: Any) -> None:
        # nats-py runs one callback at a time per subscription; a slow webhook must
        # not hold up other logins, so each request gets its own named task.
        task = asyncio.create_task(self._answer(msg), name=f"callout-{id(msg)}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Any) -> None:
        async with self._slots:
            try:
                request = AuthRequest.from_claims(read_authorization_request(msg.data.decode("latin-1")))
            except TokenError as exc:  # callout.go's words, as its error callback logs them; no answer
                log_line(self.log, logging.ERROR, str(exc))
                return  # nothing trustworthy to answer; the server times the login out
            log_line(self.log, logging.INFO, "Auth request received", client_name=request.client_name)
            decision = await self.judge(request)
            answer = response_jwt(request, decision, self._issuer, int(self.clock()), self.settings.user_ttl)
            try:
                await msg.respond(answer.encode())
            except Exception as exc:  # noqa: BLE001 - connection gone; the server times the login out
                log_line(self.log, logging.ERROR, "Failed to send auth response", error=str(exc))

    async def judge(self, request: AuthRequest) -> Grant | Deny:
        """decide(), calling the webhook when it asks to; logs like the real callout."""
        decision = decide(request, self.settings)
        if isinstance(decision, CallWebhook):
            wr = decision.request
            log_line(
                self.log,
                logging.INFO,
                "Performing webhook authentication",
                account=wr.account,
                plugin_name=wr.plugin_name,
            )
            log_line(  # the worker's token (payload) stays out of the log
                self.log,
                logging.DEBUG,
                "Sending webhook request",
                method="POST",
                url=self.webhook_url,
                account=wr.account,
                plugin_name=wr.plugin_name,
                client_name=request.client_name,
            )
            try:
                if self.webhook is None:
                    raise RuntimeError("no webhook configured")
                answer = await self.webhook(wr)
            except Exception as exc:  # noqa: BLE001 - a broken webhook is a refused login, not a hang
                answer = WebhookAnswer(0, error=str(exc))
            if answer.status in (401, 403):
                log_line(self.log, logging.WARNING, "Authentication denied", status_code=answer.status)
            decision = decide(request, self.settings, answer)
        assert not isinstance(decision, CallWebhook)
        self.record(
            outcome="failed" if isinstance(decision, Deny) else "successful",
            account=decision.account,
            plugin=decision.plugin,
            client_name=request.client_name,
            error=decision.reason if isinstance(decision, Deny) else "",
        )
        if isinstance(decision, Deny):
            log_line(
                self.log,
                logging.ERROR,
                "Authentication failed",
                error=decision.reason,
                account=decision.account,
                plugin_name=decision.plugin,
                client_name=request.client_name,
            )
        else:
            log_line(
                self.log,
                logging.INFO,
                "Authentication successful",
                account=decision.account,
                plugin=decision.plugin,
                user_id=decision.user,
                client_name=request.client_name,
            )
        return decision
