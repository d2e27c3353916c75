"""Worker sign-in on the real nats-server: static NKey, and the auth callout (nkey and token)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest
from nats_support import (  # noqa: F401 - fixtures
    SHORT,
    Keys,
    WebhookStandIn,
    connect,
    keys_fixture,
    refused,
    run,
    server_log,
    start_server_fixture,
)

from sim.nats import jwt
from sim.nats.callout import AUTH_SUBJECT, CalloutService, CalloutSettings, worker_token
from sim.nats.client import NotSignedIn, connect_once
from sim.nats.server import NatsServer
from sim.nats.webhook import answer_body, http_webhook, token_checker
from sim.nats.workqueue import QueueSettings, WorkPuller, ensure_stream, publish_work

REGION = "r1"
FV_A = "aaaaaaaa-0000-4000-8000-00000000000a"
FV_B = "bbbbbbbb-0000-4000-8000-00000000000b"
TOKENS = {"tok-A": FV_A, "tok-B": FV_B}
VIOLATION = "Authorization Violation"


async def check(token: str) -> str | None:
    return TOKENS.get(token)


@pytest.fixture(autouse=True)
def _callout_info_logs(caplog: pytest.LogCaptureFixture) -> None:
    """The callout's success lines are INFO; the suite's default capture level would drop them."""
    caplog.set_level(logging.INFO, logger="ncpsim.nats.callout")


def callout_server(
    start_server: Callable[..., NatsServer], keys: Keys, mode: str, **kw: object
) -> NatsServer:
    return start_server(
        worker_auth=mode, callout=keys.callout_block(), internal_users=keys.internal_users(), **kw
    )


def callout(server: NatsServer, keys: Keys, mode: str, webhook=None) -> CalloutService:  # type: ignore[no-untyped-def]
    settings = CalloutSettings.for_mode(mode, keys.nkey_mappings())
    return CalloutService(
        server.endpoints.url,
        keys.seed(keys.callout_user),
        keys.seed(keys.issuer),
        settings,
        webhook if webhook is not None else token_checker(check, (REGION,)),
    )


def callout_lines(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "ncpsim.nats.callout")


def test_static_nkey_mode(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    server = start_server(worker_nkey=keys.pub(keys.worker), internal_users=keys.internal_users())
    url = server.endpoints.url

    async def body() -> None:
        assert VIOLATION in await refused(url)
        assert VIOLATION in await refused(url, nkeys_seed_str=keys.seed(keys.stranger))
        assert VIOLATION in await refused(url, token=worker_token("tok-A"))
        nc, _ = await connect(url, nkeys_seed_str=keys.seed(keys.worker))
        await ensure_stream(
            nc.jetstream(), REGION, FV_A, QueueSettings(storage="memory")
        )  # the whole APP account
        await nc.close()

    run(body())
    assert "authentication error" in server_log(server, wait_for="authentication error")


def test_callout_nkey_mode(
    start_server: Callable[..., NatsServer], keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    server = callout_server(start_server, keys, "nkey")
    url = server.endpoints.url

    async def body() -> None:
        service = callout(server, keys, "nkey")
        await service.start()
        try:
            nc, _ = await connect(url, nkeys_seed_str=keys.seed(keys.worker), name="worker-nkey")
            await nc.close()
            nc, _ = await connect(url, nkeys_seed_str=keys.seed(keys.invocation))  # auth_users: no callout
            await nc.close()
            assert VIOLATION in await refused(url, nkeys_seed_str=keys.seed(keys.stranger))
            assert VIOLATION in await refused(url)
            assert VIOLATION in await refused(url, token=worker_token("tok-A"))
        finally:
            await service.stop()

    run(body())
    lines = callout_lines(caplog)
    for reason in (
        "nkey not found in mappings",
        "missing token in auth request",
        "plugin webhook not found for account APP",
    ):
        assert reason in lines
        refusal = (
            f"Auth callout service returned an error: {reason}"  # logged a moment after the client has it
        )
        assert refusal in server_log(server, wait_for=refusal)
    assert '"account": "APP", "client_name": "worker-nkey", "plugin": "nkey"' in lines
    assert lines.count("Authentication successful") == 1  # invocation-service bypassed the callout


def test_token_mode_scopes_a_worker_to_its_function(
    start_server: Callable[..., NatsServer], keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    server = callout_server(start_server, keys, "token")
    url = server.endpoints.url

    async def body() -> None:
        service = callout(server, keys, "token")
        await service.start()
        internal, _ = await connect(url, nkeys_seed_str=keys.seed(keys.invocation))
        try:
            js = internal.jetstream()
            for fv in (FV_A, FV_B):
                await ensure_stream(js, REGION, fv, QueueSettings(storage="memory"))
                await publish_work(js, REGION, fv, "req-1", f"work for {fv}".encode())
            worker, rec = await connect(url, token=worker_token("tok-A"), name="worker-a")
            # its own function: a core subscription and a pull from its consumer, acked
            await worker.subscribe(f"rq.{REGION}.{FV_A}.>")
            await worker.flush()
            own = await WorkPuller(worker, REGION, FV_A).start()
            msg = await own.fetch(SHORT)
            assert msg is not None and msg.data == f"work for {FV_A}".encode()
            await own.ack(msg)
            assert rec.errors == []
            # another function: both refused as permission violations
            await worker.subscribe(f"rq.{REGION}.{FV_B}.>")
            await rec.wait_for(f'permissions violation for subscription to "rq.{REGION}.{FV_B}.>"')
            other = await WorkPuller(worker, REGION, FV_B).start()
            assert await other.fetch(1.0) is None
            # nats-py lowercases the server's -ERR text, subject included
            await rec.wait_for(
                f'permissions violation for publish to "$js.api.consumer.msg.next.rq_{REGION}_{FV_B}'
            )
            await worker.close()
            # ...and B's work is still there for B's own worker
            worker_b, _ = await connect(url, token=worker_token("tok-B"))
            msg_b = await (await WorkPuller(worker_b, REGION, FV_B).start()).fetch(SHORT)
            assert msg_b is not None and msg_b.data == f"work for {FV_B}".encode()
            await worker_b.close()
            # refusals
            assert VIOLATION in await refused(url, token=worker_token("stolen"))
            assert VIOLATION in await refused(url, token=worker_token("tok-A", account="Worker"))
            nc, _ = await connect(url, nkeys_seed_str=keys.seed(keys.worker))  # NKey logins unchanged
            await nc.close()
        finally:
            await internal.close()
            await service.stop()

    run(body())
    # nats-server logs each a moment after the client has seen it: read once both are in
    refusal = "Auth callout service returned an error: webhook authentication failed"
    violation = f'"APP/user:worker-{FV_A}" - Subscription Violation - Subject "rq.{REGION}.{FV_B}.>"'
    server_log(server, wait_for=refusal)
    lines, log = callout_lines(caplog), server_log(server, wait_for=violation)
    assert (
        f'"account": "APP", "client_name": "worker-a", "plugin": "webhook", "user_id": "worker-{FV_A}"'
        in lines
    )
    assert 'Authentication denied {"status_code": 403}' in lines
    assert refusal in log
    assert "plugin webhook not found for account Worker" in lines
    assert violation in log


def test_token_mode_over_http_webhook(
    start_server: Callable[..., NatsServer], keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    server = callout_server(start_server, keys, "token")
    url = server.endpoints.url

    def answer(body: dict) -> tuple[int, bytes]:
        fvid = TOKENS.get(body["payload"])
        return (200, answer_body(fvid, body["account"], (REGION,))) if fvid else (403, b"{}")

    async def body() -> None:
        api = WebhookStandIn(answer)
        service = callout(server, keys, "token", http_webhook(await api.start(), timeout=SHORT))
        await service.start()
        try:
            nc, _ = await connect(url, token=worker_token("tok-B"))
            await nc.close()
            assert VIOLATION in await refused(url, token=worker_token("nope"))
            assert api.requests[0]["body"] == {"account": "APP", "pluginName": "webhook", "payload": "tok-B"}
            assert api.requests[0]["line"] == "POST /v2/nvcf/webhook/nats-auth HTTP/1.1"
            await api.stop()  # the API goes away: the webhook is unreachable
            assert VIOLATION in await refused(url, token=worker_token("tok-B"))
        finally:
            await service.stop()

    run(body())
    assert "Authentication denied" in callout_lines(caplog)
    failed = "Auth callout service returned an error: webhook request failed: "
    assert failed in server_log(server, wait_for=failed)


def test_no_callout_running_times_the_login_out(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    server = callout_server(start_server, keys, "token", auth_timeout=0.5)

    async def body() -> float:
        t0 = time.monotonic()
        assert VIOLATION in await refused(server.endpoints.url, token=worker_token("tok-A"))
        return time.monotonic() - t0

    waited = run(body())
    assert 0.4 < waited < 0.5 + SHORT
    assert "authentication error" in server_log(server, wait_for="authentication error")


@pytest.mark.parametrize(
    "forge",
    [
        "response signed by another account",
        "user JWT signed by another account",
        "response signature corrupted",
    ],
)
def test_server_checks_the_callouts_signatures(
    start_server: Callable[..., NatsServer], keys: Keys, forge: str
) -> None:
    """Negative controls for the JWTs: the passing tests above depend on real signatures."""
    server = callout_server(start_server, keys, "token")
    url = server.endpoints.url

    async def responder(msg) -> None:  # type: ignore[no-untyped-def]
        n = jwt.decode(msg.data.decode())["nats"]
        now = int(time.time())
        user_signer = keys.other_account if forge.startswith("user") else keys.issuer
        outer_signer = keys.other_account if forge.startswith("response signed") else keys.issuer
        user = jwt.encode(
            jwt.user_claims(n["user_nkey"], "APP", "x", jwt.Permissions(), now), user_signer, now
        )
        token = jwt.encode(
            jwt.authorization_response(n["user_nkey"], n["server_id"]["id"], user_jwt=user), outer_signer, now
        )
        if forge.endswith("corrupted"):
            token = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        await msg.respond(token.encode())

    async def body() -> None:
        nc, _ = await connect(url, nkeys_seed_str=keys.seed(keys.callout_user))
        await nc.subscribe(AUTH_SUBJECT, cb=responder)
        try:
            assert VIOLATION in await refused(url, token=worker_token("tok-A"))
        finally:
            await nc.close()

    run(body())
    assert "authentication error" in server_log(server, wait_for="authentication error")


def test_connected_workers_outlive_the_callout(start_server: Callable[..., NatsServer], keys: Keys) -> None:
    """Only new logins need the callout: as the runbook says, running workers stay connected."""
    server = callout_server(start_server, keys, "token", auth_timeout=0.5)
    url = server.endpoints.url

    async def body() -> None:
        service = callout(server, keys, "token")
        await service.start()
        worker, rec = await connect(url, token=worker_token("tok-A"))
        await service.stop()
        assert VIOLATION in await refused(url, token=worker_token("tok-A"))
        await worker.subscribe(f"rq.{REGION}.{FV_A}.x")
        await worker.flush()
        assert worker.is_connected and rec.errors == []
        await worker.close()

    run(body())


def test_a_sign_in_slower_than_the_servers_first_ping_is_not_taken_for_connected(
    start_server: Callable[..., NatsServer], keys: Keys
) -> None:
    """nats-server PINGs a new client after ~2 s (here 0.2 s: its ping interval, when shorter); with a
    slower callout nats-py's connect() returns half connected. connect_once says so (NotSignedIn), so a
    worker retries instead of pulling on a dead client. The callout answers only once the client has given
    up: slower than the first PING, and answered before the server stops (a sign-in still waiting holds
    nats-server's shutdown)."""
    server = callout_server(start_server, keys, "token", auth_timeout=8, ping_interval=0.2)
    url = server.endpoints.url

    async def body() -> None:
        gave_up, answered = asyncio.Event(), asyncio.Event()

        async def slow(token: str) -> str | None:
            await gave_up.wait()
            answered.set()
            return TOKENS.get(token)

        service = callout(server, keys, "token", token_checker(slow, (REGION,)))
        await service.start()
        try:
            with pytest.raises(NotSignedIn):
                await connect_once(url, reconnect=False, token=worker_token("tok-A"), connect_timeout=SHORT)
            gave_up.set()
            await answered.wait()
        finally:
            gave_up.set()
            await service.stop()

    run(body())
