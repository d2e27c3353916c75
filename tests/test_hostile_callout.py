"""Forged sign-ins at the NATS auth callout (issue 31, a class beyond the named cases): JWTs with `alg: none`, signed
by a key that is not the issuer's, expired, or with a signature for another payload; a 1 MiB token; segments that
are not base64; JSON that is not an object, fields of the wrong type, payloads nested past any parser's depth.

Two inputs reach the callout from outside its trust, and each is read as the NVCF callout's Go code reads it
(sim.nats.token): the client's token (types.Request, through encoding/json) and nats-server's authorization
request (a JWT synadia's callout.go answers only when a server issued it for itself). Both are tables here; the
sign-ins then run against a running token-mode stack: every forged one is refused (the client sees nats-server's
`Authorization Violation`, or nats-server's own refusal of a token longer than its control line), the callout
writes one ERROR line naming the client and the reason in its words, keeps serving, and the next good worker
sign-in and invocation succeed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
import pytest
from nats_support import connect

from sim.nats import jwt
from sim.nats.callout import AUTH_SUBJECT, CalloutService, CalloutSettings, worker_token
from sim.nats.stack import StackKeys, worker_credentials
from sim.nats.token import TokenError, read_authorization_request, read_token

SHORT = 5.0
UNTRACEABLE = ("Traceback", "Unhandled exception")
NOW = 1_800_000_000
DEEP = 1200  # levels: past Python's parser (about 1,000), within Go's (10,000) and under nats-server's 4 KiB line


def b64(data: bytes | str) -> str:
    return base64.urlsafe_b64encode(data.encode() if isinstance(data, str) else data).rstrip(b"=").decode()


def key(prefix: int) -> nkeys.KeyPair:
    return jwt.new_keypair(prefix, os.urandom(32))


USER, ACCOUNT, SERVER = (
    key(p) for p in (nkeys.PREFIX_BYTE_USER, nkeys.PREFIX_BYTE_ACCOUNT, nkeys.PREFIX_BYTE_SERVER)
)


def pub(kp: nkeys.KeyPair) -> str:
    return str(kp.public_key.decode())


def forged(claims: dict[str, Any], signer: nkeys.KeyPair, now: int = NOW) -> dict[str, str]:
    """The four forged JWTs of the issue, around `claims`: each one a token a client can present."""
    good = jwt.encode(claims, signer, now)
    head, _, sig = good.split(".")
    other = jwt.encode({**claims, "name": "other"}, signer, now).split(".")[1]
    return {
        "alg-none": f"{b64(json.dumps({'typ': 'JWT', 'alg': 'none'}))}.{good.split('.')[1]}.",
        "wrong-key": jwt.encode(claims, key(nkeys.PREFIX_BYTE_ACCOUNT), now),
        "expired": jwt.encode({**claims, "exp": now - 3600}, signer, now - 7200),
        "other-payload": f"{head}.{other}.{sig}",
    }


# -- the sign-in token, as types.Request reads it ---------------------------------------------------------------
def request_json(**fields: Any) -> str:
    return b64(json.dumps(fields))


NESTED = "[" * DEEP + "]" * DEEP
USER_JWTS = forged({"sub": pub(USER), "aud": "APP", "nats": {"type": "user", "version": 2}}, ACCOUNT)
TOKENS: list[tuple[str, str, tuple[str, str, str] | str]] = [
    # (case, token, (account, pluginName, payload) or the refusal after "failed to decode auth request: ")
    ("worker token", worker_token("t"), ("APP", "webhook", "t")),
    ("padded", base64.urlsafe_b64encode(b'{"account":"APP"}').decode(), ("APP", "", "")),
    (
        "keys in any case",
        request_json(ACCOUNT="APP", PluginName="webhook", payload="t"),
        ("APP", "webhook", "t"),
    ),
    ("unknown keys ignored", request_json(account="APP", extra=[1, {"a": None}]), ("APP", "", "")),
    ("null: an empty request", b64("null"), ("", "", "")),
    ("null fields", request_json(account=None, pluginName="webhook"), ("", "webhook", "")),
    *(
        (f"a JWT ({name})", token, f"illegal base64 data at input byte {token.index('.')}")
        for name, token in USER_JWTS.items()
    ),
    ("not base64", "!!!.***.$$$", "illegal base64 data at input byte 0"),
    ("three pads", "QUJD" * 3 + "A===", "illegal base64 data at input byte 13"),
    ("lone last character", "QUJDR", "illegal base64 data at input byte 4"),
    (
        "1 MiB",
        "A" * (1 << 20),
        "failed to unmarshal auth request: invalid character '\\x00' looking for beginning of value",
    ),
    (
        "not JSON",
        b64(b"\xff\xfe not json"),
        "failed to unmarshal auth request: invalid character '\ufffd' looking for beginning of value",
    ),
    ("cut short", b64('{"account":'), "failed to unmarshal auth request: unexpected end of JSON input"),
    (
        "an array",
        b64("[1, 2]"),
        "failed to unmarshal auth request: json: cannot unmarshal array into Go value of type types.Request",
    ),
    (
        "a string",
        b64('"APP"'),
        "failed to unmarshal auth request: json: cannot unmarshal string into Go value of type types.Request",
    ),
    (
        "a number",
        b64("5"),
        "failed to unmarshal auth request: json: cannot unmarshal number into Go value of type types.Request",
    ),
    (
        "a bool",
        b64("true"),
        "failed to unmarshal auth request: json: cannot unmarshal bool into Go value of type types.Request",
    ),
    (
        "fields of the wrong type",
        request_json(account=["APP"], pluginName={"x": 1}, payload=7),
        "failed to unmarshal auth request: json: cannot unmarshal array into Go struct field Request.account of type string",
    ),
    (
        "nested array",
        b64(NESTED),
        "failed to unmarshal auth request: json: cannot unmarshal array into Go value of type types.Request",
    ),
    (
        "nested payload",
        b64('{"account":"APP","pluginName":"webhook","payload":' + NESTED + "}"),
        "failed to unmarshal auth request: json: cannot unmarshal array into Go struct field Request.payload of type string",
    ),
    (
        "nested, ignored",
        b64('{"x":' + NESTED + ',"account":"APP","pluginName":"p","payload":"t"}'),
        ("APP", "p", "t"),
    ),
    (
        "nested 10,001",
        b64("[" * 10_001 + "]" * 10_001),
        "failed to unmarshal auth request: invalid character '[' exceeded max depth",
    ),
]


@pytest.mark.parametrize(("case", "token", "expect"), TOKENS, ids=[t[0] for t in TOKENS])
def test_a_token_is_read_as_the_go_callout_reads_it(case: str, token: str, expect: Any) -> None:
    if isinstance(expect, tuple):
        assert read_token(token) == expect
        return
    with pytest.raises(TokenError) as refused:
        read_token(token)
    assert str(refused.value) == (
        expect if expect.startswith("failed") else f"failed to decode auth request: {expect}"
    )


# -- nats-server's authorization request, as callout.go checks it ----------------------------------------------
REQUEST = {
    "sub": pub(USER),
    "aud": "nats-authorization-request",
    "nats": {
        "server_id": {"id": pub(SERVER)},
        "user_nkey": pub(USER),
        "type": "authorization_request",
        "version": 2,
    },
}
REQUESTS = forged(REQUEST, SERVER)
OTHER_SERVER = key(nkeys.PREFIX_BYTE_SERVER)
AUTH_REQUESTS: list[tuple[str, str, str | None]] = [
    # (case, token, the "bad request" line, or None: answered)
    ("from the server", jwt.encode(REQUEST, SERVER, NOW), None),
    ("expired (callout.go never checks exp)", REQUESTS["expired"], None),
    (
        "alg none",
        REQUESTS["alg-none"],
        'bad request: error decoding auth request: unexpected "none" algorithm',
    ),
    ("signed by an account key", REQUESTS["wrong-key"], 'bad request: expected server: "{iss}"'),
    (
        "iss right, signature for another payload",
        REQUESTS["other-payload"],
        "bad request: error decoding auth request: claim failed V2 signature verification",
    ),
    (
        "another server's",
        jwt.encode(REQUEST, OTHER_SERVER, NOW),
        f'bad request: issuers don\'t match: "nats-authorization-request" != "{pub(SERVER)}"',
    ),
    (
        "another audience",
        jwt.encode({**REQUEST, "aud": "APP"}, SERVER, NOW),
        'bad request: unexpected audience: "APP"',
    ),
    (
        "no type",
        f"{b64(json.dumps({'alg': 'ed25519-nkey'}))}.{b64('{}')}.",
        'bad request: error decoding auth request: not supported type ""',
    ),
    (
        "claims an array",
        f"{b64(json.dumps(jwt.HEADER))}.{b64('[]')}.",
        "bad request: error decoding auth request: JWT claims are not an object",
    ),
    (
        "claims nested 10,000 deep",
        f"{b64(json.dumps(jwt.HEADER))}.{b64('[' * 10_000 + ']' * 10_000)}.",
        "bad request: error decoding auth request: JWT part is not JSON: RecursionError",
    ),
    (
        "not base64",
        "!!.??.**",
        "bad request: error decoding auth request: bad base64url: Only base64 data is allowed",
    ),
    ("two chunks", "a.b", "bad request: error decoding auth request: expected 3 chunks"),
    (
        "header an array",
        f"{b64('[]')}.{b64('{}')}.",
        "bad request: error decoding auth request: JWT header is not an object",
    ),
    (
        "nats not an object",
        jwt.encode({**REQUEST, "nats": "s"}, SERVER, NOW),
        'bad request: issuers don\'t match: "nats-authorization-request" != ""',
    ),
    (
        "over 1 MiB",
        "e" * (1 << 20) + "..",
        f"bad request: error decoding auth request: token size {(1 << 20) + 2} exceeds maximum of 1048576 bytes: token too large",
    ),
]


@pytest.mark.parametrize(("case", "token", "line"), AUTH_REQUESTS, ids=[r[0] for r in AUTH_REQUESTS])
def test_the_callout_answers_only_a_servers_own_request(case: str, token: str, line: str | None) -> None:
    if line is None:
        assert read_authorization_request(token)["nats"]["user_nkey"] == pub(USER)
        return
    with pytest.raises(TokenError) as refused:
        read_authorization_request(token)
    iss = jwt.decode(token, verify=False)["iss"] if "{iss}" in line else ""
    assert str(refused.value).startswith(line.format(iss=iss)), str(refused.value)


@dataclass
class Message:
    data: bytes
    answers: list[bytes]

    async def respond(self, data: bytes) -> None:
        self.answers.append(data)


def test_a_forged_request_is_one_line_and_no_answer(caplog: pytest.LogCaptureFixture) -> None:
    """In the service: a forged request is dropped unanswered with one ERROR line (the server times the sign-in
    out); the server's own request is answered. The second half is the negative control."""
    service = CalloutService("nats://127.0.0.1:1", "", bytes(ACCOUNT.seed).decode(), CalloutSettings())
    caplog.set_level(logging.INFO, logger="ncpsim.nats.callout")
    for token in [token for _, token, line in AUTH_REQUESTS if line is not None]:
        message = Message(token.encode(), [])
        asyncio.run(service._answer(message))
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert (
            message.answers == [] and len(errors) == 1 and errors[0].getMessage().startswith("bad request")
        ), errors
        assert "\n" not in errors[0].getMessage()
        caplog.clear()
    good = Message(jwt.encode(REQUEST, SERVER, int(time.time())).encode(), [])
    asyncio.run(service._answer(good))
    assert (
        len(good.answers) == 1
        and jwt.decode(good.answers[0].decode())["nats"]["error"] == "missing token in auth request"
    )


# -- the sign-ins, against a running stack -------------------------------------------------------------------------
CONTROL_LINE = (
    "maximum control line exceeded",
    "Connection",
    "connection",
)  # nats-server refuses before the callout


@dataclass(frozen=True)
class SignIn:
    name: str
    options: dict[str, Any]
    reason: str | None  # the callout's error for this client; None: nats-server refuses before the callout


def token(value: str) -> dict[str, Any]:
    return {"token": value}


def nested_payload(depth: int) -> str:
    return b64('{"account":"APP","pluginName":"webhook","payload":' + "[" * depth + "]" * depth + "}")


SIGN_INS = [
    *(
        SignIn(
            f"token-{n}",
            token(t),
            f"failed to decode auth request: failed to decode auth request: illegal base64 data at input byte {t.index('.')}",
        )
        for n, t in USER_JWTS.items()
    ),
    *(
        SignIn(f"payload-{n}", token(worker_token(t)), "webhook authentication failed")
        for n, t in USER_JWTS.items()
    ),
    SignIn(
        "payload-not-a-worker-token",
        token(worker_token("worker|http-echo|" + "0" * 32)),
        "webhook authentication failed",
    ),
    SignIn(
        "not-base64",
        token("!!!.***.$$$"),
        "failed to decode auth request: failed to decode auth request: illegal base64 data at input byte 0",
    ),
    SignIn(
        "json-array",
        token(b64("[1, 2]")),
        "failed to decode auth request: failed to unmarshal auth request: json: cannot unmarshal array into Go value of type types.Request",
    ),
    SignIn("json-null", token(b64("null")), "plugin name not specified"),
    SignIn(
        "fields-wrong-type",
        token(request_json(account=["APP"], pluginName={"x": 1}, payload=7)),
        "failed to decode auth request: failed to unmarshal auth request: json: cannot unmarshal array into Go struct field Request.account of type string",
    ),
    SignIn(
        "nested-1200",
        token(b64(NESTED)),
        "failed to decode auth request: failed to unmarshal auth request: json: cannot unmarshal array into Go value of type types.Request",
    ),
    SignIn(
        "nested-payload-1200",
        token(nested_payload(DEEP)),
        "failed to decode auth request: failed to unmarshal auth request: json: cannot unmarshal array into Go struct field Request.payload of type string",
    ),
    SignIn("nested-payload-10000", token(nested_payload(10_000)), None),
    SignIn("token-1MiB", token("A" * (1 << 20)), None),
    SignIn("payload-1MiB", token(worker_token("A" * (1 << 20))), None),
    *(
        SignIn(
            f"connect-jwt-{n}",
            {
                "user_jwt_cb": (lambda t=t: t.encode()),
                "signature_cb": (lambda nonce: base64.b64encode(USER.sign(nonce.encode()))),
            },
            "missing token in auth request",
        )
        for n, t in USER_JWTS.items()
    ),
    SignIn("stranger-nkey", {"nkeys_seed_str": bytes(USER.seed).decode()}, "nkey not found in mappings"),
]
assert len({s.name for s in SIGN_INS}) == len(SIGN_INS)


@dataclass
class Tried:
    error: str  # the client's, or "signed in"
    lines: list[str]  # the callout's ERROR lines naming this client


async def sign_in(url: str, name: str, options: dict[str, Any]) -> str:
    try:
        nc, _ = await connect(url, name=name, **options)
    except Exception as exc:  # noqa: BLE001 - a refusal is what is tried here: nats-py raises several kinds
        return f"{type(exc).__name__}: {exc}"
    await nc.close()
    return "signed in"


@pytest.fixture(scope="module")
def token_stack(ncpsim_stack_module: Any) -> Any:
    """A token-mode stack from the catalogue: one NATS server, the webhook at the API's Service, two workers."""
    return ncpsim_stack_module("nats-api-namespace-right")


@pytest.fixture(scope="module")
def tried(token_stack: Any) -> Iterator[dict[str, Tried]]:
    url = f"nats://{token_stack.status['nats']['host']}:{token_stack.status['nats']['port']}"
    log = Path(token_stack.status["logs"]["nats-auth-callout"])

    async def run_all() -> dict[str, Tried]:
        found = {}
        for row in SIGN_INS:
            name = f"hostile-{row.name}"
            error = await sign_in(url, name, row.options)
            mine = f'"client_name": "{name}"'
            found[row.name] = Tried(
                error, [ln for ln in log.read_text().splitlines() if mine in ln and " ERROR " in ln]
            )
        return found

    yield asyncio.run(run_all())


@pytest.mark.parametrize("row", SIGN_INS, ids=[s.name for s in SIGN_INS])
def test_a_forged_sign_in_is_refused_in_one_line(row: SignIn, tried: dict[str, Tried]) -> None:
    got = tried[row.name]
    if row.reason is None:  # longer than nats-server's 4 KiB control line: the callout never sees it
        assert any(w in got.error for w in CONTROL_LINE) and got.lines == [], got
        return
    assert "Authorization Violation" in got.error and len(got.lines) == 1, got
    [line] = got.lines
    fields = json.loads(line[line.index("{") :])
    assert " ERROR Authentication failed {" in line and fields["error"] == row.reason, line


def test_the_callout_keeps_serving_good_sign_ins(token_stack: Any, tried: dict[str, Tried]) -> None:
    """The negative control: a worker's own token, through the same sign-in, gets in; so does the stack's worker,
    whose invocation succeeds; the callout never restarted and no component wrote a traceback."""
    url = f"nats://{token_stack.status['nats']['host']}:{token_stack.status['nats']['port']}"
    keys = StackKeys.of(token_stack.topology)
    good = worker_credentials(keys, "token", "hostile-good", "http-echo")
    assert asyncio.run(sign_in(url, "hostile-good", dict(good.connect_kwargs))) == "signed in"
    traces = token_stack.invoke("http-echo", count=2)
    assert [t.outcome for t in traces] == ["success", "success"], [(t.error, t.cause) for t in traces]
    assert len(token_stack.events("component.ready", component="nats-auth-callout")) == 1
    logs = {p.name: p.read_text(errors="replace") for p in (token_stack.state_dir / "logs").glob("*.log")}
    assert logs and [name for name, text in logs.items() if any(w in text for w in UNTRACEABLE)] == []


def test_no_sign_in_can_put_a_forged_request_before_the_callout(
    token_stack: Any, tried: dict[str, Tried]
) -> None:
    """nats-server alone publishes on $SYS.REQ.USER.AUTH in AUTH: the callout's own user is denied it, and a
    publish from APP (where the stack's internal users are) is another account's subject. The forged requests
    of the table above stay a defence in depth: no line of the callout's log shows one arrived."""
    url = f"nats://{token_stack.status['nats']['host']}:{token_stack.status['nats']['port']}"
    keys = StackKeys.of(token_stack.topology)
    log = Path(token_stack.status["logs"]["nats-auth-callout"])

    async def publish(seed: str) -> list[str]:
        nc, recorded = await connect(url, nkeys_seed_str=seed, name="hostile-publisher")
        try:
            await nc.publish(AUTH_SUBJECT, REQUESTS["wrong-key"].encode())
            await nc.flush()
            await asyncio.sleep(0.1)  # a permission violation arrives asynchronously
        finally:
            await nc.close()
        return recorded.errors

    denied = asyncio.run(publish(keys.callout_user))
    assert any(
        f'permissions violation for publish to "{AUTH_SUBJECT}"'.lower() in e.lower() for e in denied
    ), denied
    assert asyncio.run(publish(keys.internal["nvcf-api"])) == []
    assert "bad request" not in log.read_text()
