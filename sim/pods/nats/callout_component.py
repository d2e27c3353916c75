"""The nats-auth-callout-service component, with the NVCF API's stand-in beside it (sim.pods.nats.api).

The callout reads its configuration (``nats.workerAuth``, the webhook URL, and its logging,
``natsAuthCalloutService.serviceConfig.logging``) only at start-up, as the real one does, so a change
needs a restart of this component. Its log (stdout, so the component's log file) has the real callout's
lines, ``Authentication successful``, ``Authentication failed``, ``Authentication denied``, through zap's
level and sampler (sim.nats.zaplog): a burst of logins keeps about 100 of each line a second.

The webhook URL is a URL like any other: its host is resolved in the control plane's DNS view and dialed
through the network map, and a failure is the callout's Go words (``webhook request failed: Post "URL":
dial tcp: lookup HOST on 10.43.0.10:53: no such host``, ``... connect: connection refused``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import sys
from collections.abc import Callable

from dns.client import NameNotResolved
from sim.model.netmap import Refused, Unreachable
from sim.model.values import NatsValues
from sim.nats.callout import CalloutService
from sim.nats.stack import StackKeys, callout_settings
from sim.nats.webhook import Dial, http_webhook
from sim.nats.zaplog import LogSettings, Sampler
from sim.runtime.component import Context, Ready

from .api import ApiStandin, create_streams

SERVER_WAIT = 15.0  # seconds to find the NATS servers (they start beside this component)
CONNECT_TIMEOUT = 2.0  # one attempt
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
LOGGER = "ncpsim.nats.callout"  # CalloutService's default logger
ZAP_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


class ZapSampling(logging.Filter):
    """The callout's zap sampler on a Python logger: per level and message (``log_line``'s ``event``)."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.sampler = Sampler(settings)

    def filter(self, record: logging.LogRecord) -> bool:
        level = {"WARNING": "warn", "CRITICAL": "error"}.get(record.levelname, record.levelname.lower())
        message = str(getattr(record, "event", record.getMessage()))
        return self.sampler.allow(level, message, record.created)


def _log_to_stdout(logger: logging.Logger, settings: LogSettings) -> None:
    """The component's log file is its stdout; only this logger is touched (tests run this in-process)."""
    for handler in [h for h in logger.handlers if getattr(h, "ncpsim_callout", False)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(ZapSampling(settings))
    handler.ncpsim_callout = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(ZAP_LEVELS[settings.level])


def cluster_dial(ctx: Context) -> Dial:
    """How the callout (a Go program) dials a URL's host from the control plane: the cluster's DNS view,
    then the network map; failures in Go's words."""
    dns_ip = ctx.topology.cluster(ctx.cluster).dns_ip

    async def dial(
        host: str, port: int, tls: ssl.SSLContext | None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            ip = str(ipaddress.ip_address(host))
        except ValueError:
            try:
                ip = (await ctx.resolve(host))[0]
            except NameNotResolved as exc:
                why = "no such host" if exc.rcode in ("NXDOMAIN", "NODATA") else "server misbehaving"
                raise OSError(f"dial tcp: lookup {host} on {dns_ip}:53: {why}") from None
        try:
            return await ctx.open_tcp(ip, port, tls=tls, server_hostname=host if tls else None)
        except Refused:
            raise OSError(f"dial tcp {ip}:{port}: connect: connection refused") from None
        except Unreachable:
            raise OSError(f"dial tcp {ip}:{port}: connect: no route to host") from None
        except TimeoutError:
            raise OSError(f"dial tcp {ip}:{port}: i/o timeout") from None

    return dial


async def _start(service_for: Callable[[list[str]], CalloutService], ctx: Context) -> CalloutService:
    """Connect once every NATS server is mapped (their supervisors start beside this component), with
    all of them in the list: the callout fails over to another when its server restarts."""
    delay = 0.002
    while True:
        try:
            servers = ctx.nats_servers(every=True)
        except OSError:
            servers = []
        if servers:
            service = service_for(servers)
            try:
                await service.start(connect_timeout=CONNECT_TIMEOUT)
                return service
            except Exception:  # noqa: BLE001 - a server still starting: look again
                await service.stop()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


async def run(ctx: Context, ready: Ready) -> None:
    log_settings = LogSettings.from_values(ctx.values)
    logger = logging.getLogger(LOGGER)
    _log_to_stdout(logger, log_settings)
    keys = StackKeys.of(ctx.topology)
    values = NatsValues.from_values(ctx.values)
    settings = callout_settings(keys, values)
    webhook = http_webhook(values.webhook_url, dial=cluster_dial(ctx))
    api = ApiStandin(ctx, keys)
    bindings = await api.start()

    def service_for(servers: list[str]) -> CalloutService:
        return CalloutService(
            servers,
            keys.callout_user,
            keys.issuer,
            settings,
            webhook,
            logger,
            webhook_url=values.webhook_url,
            record=lambda **fields: ctx.events.emit("nats.callout.login", **fields),
        )

    try:
        service = await asyncio.wait_for(_start(service_for, ctx), SERVER_WAIT)
        try:
            # The NVCF API makes each function version's stream when the function is deployed, before any
            # worker of it exists: the API's Service is up (and workers sign in) once they are made.
            await asyncio.wait_for(create_streams(service.servers, keys, ctx, values), SERVER_WAIT)
            ctx.events.emit("nats.callout.ready", mode=values.worker_auth, webhook=values.webhook_url)
            ready(bindings)
            await asyncio.Event().wait()
        finally:
            await service.stop()
    finally:
        await api.close()
