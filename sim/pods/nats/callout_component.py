"""The nats-auth-callout-service component, with the NVCF API's worker-token webhook as its stand-in.

The callout reads its plugin configuration (``nats.workerAuth``, the webhook URL) only at start-up,
as the real one does, so a change needs a restart of this component. Its log (stdout, so the
component's log file) has the real callout's lines: ``Authentication successful``, ``Authentication
failed``, ``Authentication denied``.

The NVCF API is not a component of ncpsim; its webhook answers in-process here, behind the same
interface the HTTP webhook has: a URL whose host is not where the API serves fails as a lookup would
(``webhook request failed``), a valid worker token gets the user ``worker-<fvid>`` scoped to that
function version, anything else 403.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

from sim.runtime.component import Context, Ready

from .callout import CalloutService
from .client import connect_once
from .component import endpoints_path
from .stack import (
    DEFAULT_WEBHOOK_URL,
    REGION,
    NatsValues,
    StackKeys,
    callout_settings,
    check_worker_token,
)
from .webhook import Webhook, WebhookAnswer, WebhookRequest, token_checker
from .workqueue import QueueSettings, ensure_stream

SERVER_WAIT = 15.0  # seconds to find nats-server (it starts beside this component)
CONNECT_TIMEOUT = 2.0  # one attempt
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
LOGGER = "ncpsim.nats.callout"  # CalloutService's default logger


def served_at(url: str) -> str:
    """Where the NVCF API's stand-in serves: at the values' webhook URL when it names an in-cluster Service
    on the webhook's path (the seed: "If the API runs elsewhere, set the URL"; ncpsim cannot see where
    the customer's API runs, so it takes the values at their word), else at its default Service."""
    parts, default = urlsplit(url), urlsplit(DEFAULT_WEBHOOK_URL)
    in_cluster = (parts.hostname or "").endswith(".svc.cluster.local") and parts.scheme == default.scheme
    return url if in_cluster and parts.path == default.path else DEFAULT_WEBHOOK_URL


def api_webhook(keys: StackKeys, url: str, served_url: str = DEFAULT_WEBHOOK_URL) -> Webhook:
    """The webhook the callout calls at ``url``; only ``served_url``'s host:port answers."""

    async def check(token: str) -> str | None:
        return check_worker_token(keys, token)

    checker = token_checker(check, (REGION,))
    parts, served = urlsplit(url), urlsplit(served_url)

    async def webhook(request: WebhookRequest) -> WebhookAnswer:
        if (parts.hostname, parts.port) != (served.hostname, served.port) or parts.path != served.path:
            reason = (
                f"dial tcp: lookup {parts.hostname}: no such host"
                if parts.hostname != served.hostname
                else "404 Not Found"
            )
            return WebhookAnswer(0, error=f'Post "{url}": {reason}')
        return await checker(request)

    return webhook


def _server_url(ctx: Context) -> str | None:
    """Where nats-server listens. Locally: the supervisor's file, if its server is alive (the file of
    an earlier `ncpsim up` may still be there while this one's supervisor starts), since the network
    map has no binding before every control-plane component is ready. Elsewhere (a k3d pod), or
    after a restart: the address the component's network gives."""
    try:
        found = json.loads(endpoints_path(ctx.state_dir).read_text())
        os.kill(int(found["pid"]), 0)
        return str(found["url"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        return ctx.nats_url()
    except OSError:
        return None


async def _start(service_for: Callable[[str], CalloutService], ctx: Context) -> CalloutService:
    """Connect once nats-server is up; the supervisor starts it beside this component."""
    delay = 0.002
    while True:
        url = _server_url(ctx)
        if url is not None:
            service = service_for(url)
            try:
                await service.start(connect_timeout=CONNECT_TIMEOUT)
                return service
            except Exception:  # noqa: BLE001 - a stale file or a server still starting: look again
                await service.stop()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


def _log_to_stdout(logger: logging.Logger) -> None:
    """The component's log file is its stdout; only this logger is touched (tests run this in-process)."""
    if not any(getattr(h, "ncpsim_callout", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.ncpsim_callout = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


async def _create_streams(url: str, keys: StackKeys, ctx: Context, values: NatsValues) -> None:
    nc = await connect_once(
        url,
        reconnect=False,
        nkeys_seed_str=keys.internal["nvcf-api"],
        name="nvcf-api",
        connect_timeout=CONNECT_TIMEOUT,
    )
    try:
        js = nc.jetstream()
        for function in ctx.topology.functions:
            await ensure_stream(js, REGION, function, QueueSettings(ack_wait=values.ack_wait))
    finally:
        await nc.close()


async def run(ctx: Context, ready: Ready) -> None:
    _log_to_stdout(logging.getLogger(LOGGER))
    keys = StackKeys.derive(ctx.topology.seed)
    values = NatsValues.from_values(ctx.values)
    served = served_at(values.webhook_url)
    settings, webhook = callout_settings(keys, values), api_webhook(keys, values.webhook_url, served)

    def service_for(url: str) -> CalloutService:
        return CalloutService(url, keys.callout_user, keys.issuer, settings, webhook)

    service = await asyncio.wait_for(_start(service_for, ctx), SERVER_WAIT)
    # The NVCF API makes each function version's stream when the function is deployed; its stand-in
    # lives here, and this component is ready before any worker binds to a consumer.
    await asyncio.wait_for(_create_streams(service.url, keys, ctx, values), SERVER_WAIT)
    ctx.events.emit("nats.callout.ready", mode=values.worker_auth, webhook=values.webhook_url, api=served)
    ready({})
    try:
        await asyncio.Event().wait()
    finally:
        await service.stop()
