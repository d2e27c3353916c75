"""The NVCF API's stand-in, where the auth callout meets it: the worker-token webhook served over HTTP/1.1 at
the API's Service, and the work streams the API makes when a function is deployed.

Why served for real: the callout resolves the webhook URL's host in the control plane's DNS view and
dials it through the network map, as it would any in-cluster name, so a URL that names where the API
runs (``api.namespace``, ``api.service.*`` in the values) reaches it, and any other fails as it fails in
the field: no such host, connection refused on a port the Service does not have, 404 from the API on
another path. The API itself is not a component of ncpsim: its stand-in runs in the callout's process.
"""

from __future__ import annotations

import asyncio
import json

import h11
from nats import errors as nats_errors

from sim.model.values import NatsValues
from sim.nats.client import close_client, connect_once
from sim.nats.stack import REGION, StackKeys, check_worker_token
from sim.nats.webhook import WebhookRequest, token_checker
from sim.nats.workqueue import QueueSettings, ensure_stream
from sim.protocols.http1 import H11Stream, read_body, respond
from sim.runtime.component import Context, connection_handler

WEBHOOK_PATH = "/v2/nvcf/webhook/nats-auth"
CONNECT_TIMEOUT = 2.0  # one sign-in attempt
STREAM_ATTEMPT = 0.25  # seconds one stream request may wait for JetStream's answer (none without a leader)


class ApiStandin:
    """The webhook's HTTP server; ``start`` returns the binding of the API's Service address."""

    def __init__(self, ctx: Context, keys: StackKeys) -> None:
        self.ctx = ctx

        async def check(token: str) -> str | None:
            return check_worker_token(keys, token)

        self.check = token_checker(check, (REGION,))
        self._server: asyncio.Server | None = None

    async def start(self) -> dict[str, int]:
        self._server = await asyncio.start_server(connection_handler(self.serve), "127.0.0.1", 0)
        return {self.ctx.topology.api_service.address: self._server.sockets[0].getsockname()[1]}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = H11Stream(h11.SERVER, reader, writer)
        try:
            event = await stream.next_event()
            if isinstance(event, h11.Request):
                body = await read_body(stream)
                status, answer = await self.answer(
                    event.method.decode(), event.target.decode("latin-1"), body
                )
                await respond(stream, status, answer, [("content-type", "application/json")], close=True)
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()

    async def answer(self, method: str, target: str, body: bytes) -> tuple[int, bytes]:
        if target.split("?", 1)[0] != WEBHOOK_PATH:
            return 404, b'{"status":404,"detail":"Not Found"}'
        if method != "POST":
            return 405, b'{"status":405,"detail":"Method Not Allowed"}'
        try:
            data = json.loads(body)
            request = WebhookRequest(str(data["account"]), str(data["pluginName"]), str(data["payload"]))
        except (ValueError, KeyError, TypeError, RecursionError):  # nesting deeper than a request holds
            return 400, b'{"status":400,"detail":"malformed webhook request"}'
        answer = await self.check(request)
        return answer.status, answer.body

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def create_streams(servers: list[str], keys: StackKeys, ctx: Context, values: NatsValues) -> None:
    """Each function version's stream, replicated as the cluster allows; a clustered JetStream answers
    only once its servers have elected a meta leader, so a request left unanswered meanwhile is asked again."""
    nc = await connect_once(
        servers,
        nkeys_seed_str=keys.internal["nvcf-api"],
        name="nvcf-api",
        connect_timeout=CONNECT_TIMEOUT,
        reconnect_time_wait=0.1,
    )
    settings = QueueSettings(ack_wait=values.ack_wait, replicas=values.stream_replicas)
    try:
        js = nc.jetstream(timeout=STREAM_ATTEMPT)
        for function in ctx.topology.functions:
            delay = 0.01
            while True:
                try:
                    await ensure_stream(js, REGION, function, settings)
                    break
                except (nats_errors.Error, TimeoutError) as exc:  # no meta leader yet: 503 or no answer
                    ctx.events.emit("nats.streams.waiting", function=function, error=str(exc)[:200])
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.1)
        ctx.events.emit("nats.streams.ready", functions=list(ctx.topology.functions))
    finally:
        await close_client(nc)
