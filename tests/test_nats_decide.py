"""The callout's decision, from tables: every error string of the public callout."""

from __future__ import annotations

import base64
import json

import pytest
from nats_support import Keys

from sim.nats import jwt
from sim.nats.callout import (
    AuthRequest,
    CalloutSettings,
    CallWebhook,
    Deny,
    Grant,
    decide,
    response_jwt,
    worker_token,
)
from sim.nats.subjects import worker_permissions
from sim.nats.webhook import WebhookAnswer, WebhookRequest, answer_body

KEYS = Keys()
WORKER = Keys.pub(KEYS.worker)
NONCE = "n0nce-from-server"
STD_SIG = base64.b64encode(KEYS.worker.sign(NONCE.encode())).decode()  # what nats-py sends
RAW_SIG = jwt.b64url(KEYS.worker.sign(NONCE.encode()))  # what nats.go sends
NKEY_MODE = CalloutSettings.for_mode("nkey", ((WORKER, "APP"),))
TOKEN_MODE = CalloutSettings.for_mode("token", ((WORKER, "APP"),))
FVID = "0f0e0d0c-1111-2222-3333-444455556666"


def req(**kw: str) -> AuthRequest:
    return AuthRequest(user_nkey="UCLIENTKEY", server_id="NSERVER", nonce=NONCE, **kw)


def raw_token(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


DENIALS = [
    # (case, request, settings, reason)
    ("nothing presented", req(), TOKEN_MODE, "missing token in auth request"),
    ("token not base64 json", req(token="%%%"), TOKEN_MODE, "failed to decode auth request"),
    (
        "no plugin name",
        req(token=raw_token({"account": "APP", "payload": "t"})),
        TOKEN_MODE,
        "plugin name not specified",
    ),
    (
        "old worker-utils asks for Worker",
        req(token=worker_token("t", account="Worker")),
        TOKEN_MODE,
        "plugin webhook not found for account Worker",
    ),
    (
        "token in nkey mode",
        req(token=worker_token("t")),
        NKEY_MODE,
        "plugin webhook not found for account APP",
    ),
    (
        "unknown plugin",
        req(token=worker_token("t", plugin_name="oauth")),
        TOKEN_MODE,
        "plugin oauth not found for account APP",
    ),
    ("nkey without signature", req(nkey=WORKER), NKEY_MODE, "missing nkey or signature"),
    (
        "nkey not mapped",
        req(nkey=Keys.pub(KEYS.stranger), sig=STD_SIG),
        NKEY_MODE,
        "nkey not found in mappings",
    ),
    ("signature not base64", req(nkey=WORKER, sig="***"), NKEY_MODE, "invalid signature format"),
    (
        "signature by another key",
        req(nkey=WORKER, sig=jwt.b64url(KEYS.stranger.sign(NONCE.encode()))),
        NKEY_MODE,
        "signature verification failed",
    ),
    (
        "nats-py signature, strict like Go",
        req(nkey=WORKER, sig=STD_SIG),
        CalloutSettings(nkey_mappings=((WORKER, "APP"),), strict_sig_encoding=True),
        "invalid signature format",
    ),
    (
        "nkey plugin not configured",
        req(nkey=WORKER, sig=RAW_SIG),
        CalloutSettings(),
        "plugin nkey not found for account ",
    ),
]


@pytest.mark.parametrize("case,request_,settings,reason", DENIALS, ids=[d[0] for d in DENIALS])
def test_denials(case: str, request_: AuthRequest, settings: CalloutSettings, reason: str) -> None:
    decision = decide(request_, settings)
    assert isinstance(decision, Deny), decision
    assert decision.reason.startswith(reason), decision.reason
    if reason.endswith("not found for account "):
        assert decision.reason == reason  # the account is printed empty, as the Go callout does


@pytest.mark.parametrize("sig", [STD_SIG, RAW_SIG], ids=["nats-py std base64", "go raw base64url"])
def test_shared_nkey_maps_to_app_with_the_whole_account(sig: str) -> None:
    decision = decide(req(nkey=WORKER, sig=sig, client_user=WORKER), NKEY_MODE)
    assert decision == Grant("APP", WORKER, "nkey", jwt.Permissions())


def test_token_goes_to_the_webhook_then_to_its_answer() -> None:
    request = req(token=worker_token("secret"))
    first = decide(request, TOKEN_MODE)
    assert first == CallWebhook(WebhookRequest("APP", "webhook", "secret"))
    granted = decide(request, TOKEN_MODE, WebhookAnswer(200, answer_body(FVID, "APP", ("r1",))))
    assert granted == Grant("APP", f"worker-{FVID}", "webhook", worker_permissions(FVID, ("r1",)))


WEBHOOK_ANSWERS = [
    (WebhookAnswer(0, error="connection refused"), "webhook request failed: connection refused", 0),
    (WebhookAnswer(401), "webhook authentication failed", 401),
    (WebhookAnswer(403), "webhook authentication failed", 403),
    (WebhookAnswer(408), "webhook request timeout", 408),
    (WebhookAnswer(429), "webhook rate limited", 429),
    (WebhookAnswer(404), "webhook client error: 404", 404),
    (WebhookAnswer(503), "webhook service error: 503", 503),
    (WebhookAnswer(200, b"not json"), "failed to decode webhook response", 200),
    (WebhookAnswer(200, b'{"account":"APP"}'), "webhook response missing userId", 200),
]


@pytest.mark.parametrize("answer,reason,status", WEBHOOK_ANSWERS, ids=[w[1] for w in WEBHOOK_ANSWERS])
def test_webhook_answers(answer: WebhookAnswer, reason: str, status: int) -> None:
    assert decide(req(token=worker_token("t")), TOKEN_MODE, answer) == Deny(reason, "APP", "webhook", status)


def test_worker_permissions_are_the_function_versions_own() -> None:
    own = worker_permissions(FVID, ("r1",))
    assert f"$JS.API.CONSUMER.MSG.NEXT.rq_r1_{FVID}.rq_r1_{FVID}_workers" in own.pub_allow
    assert f"$JS.ACK.rq_r1_{FVID}.rq_r1_{FVID}_workers.>" in own.pub_allow
    assert not any(s.endswith(".*.*") or s == "$JS.ACK.>" for s in own.pub_allow)
    source = worker_permissions(FVID, ("r1",), scope="source")
    assert "$JS.API.CONSUMER.MSG.NEXT.*.*" in source.pub_allow and "$JS.ACK.>" in source.pub_allow
    assert own.pub_allow == own.sub_allow and own.resp_max == 1


def test_response_jwt_carries_user_jwt_or_error() -> None:
    request = req(token=worker_token("t"))
    granted = jwt.decode(
        response_jwt(request, Grant("APP", "w", "webhook", jwt.Permissions()), KEYS.issuer, 50)
    )
    assert granted["aud"] == "NSERVER" and granted["sub"] == "UCLIENTKEY"
    user = jwt.decode(granted["nats"]["jwt"])
    assert user["aud"] == "APP" and user["sub"] == "UCLIENTKEY" and user["iss"] == Keys.pub(KEYS.issuer)
    denied = jwt.decode(response_jwt(request, Deny("nope"), KEYS.issuer, 50))
    assert denied["nats"]["error"] == "nope" and "jwt" not in denied["nats"]


def test_request_from_server_claims() -> None:
    claims = {
        "nats": {
            "user_nkey": "UK",
            "server_id": {"id": "NS"},
            "client_info": {"name": "w", "user": "x", "nonce": "n"},
            "connect_opts": {"auth_token": "tok", "nkey": "UN", "sig": "s"},
        }
    }
    assert AuthRequest.from_claims(claims) == AuthRequest("UK", "NS", "w", "x", "tok", "UN", "s", "n")
    assert AuthRequest.from_claims({}) == AuthRequest("", "")


DEEP = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit: json.loads raises RecursionError


def test_deeply_nested_json_is_refused_not_raised() -> None:
    """Issue 31: nesting past the interpreter's stack in a sign-in's token, a JWT or a webhook request is a
    refusal in the callout's and the API's words, never an exception out of the component."""
    token = base64.urlsafe_b64encode(DEEP.encode()).decode()
    denied = decide(req(token=token), TOKEN_MODE)
    assert isinstance(denied, Deny) and denied.reason == (  # encoding/json's words past its 10,000 levels
        "failed to decode auth request: failed to unmarshal auth request: invalid character '[' exceeded max depth"
    )
    with pytest.raises(jwt.JwtError, match="not JSON"):
        jwt.decode(f"{jwt.b64url(DEEP.encode())}.{jwt.b64url(b'{}')}.sig", verify=False)


def test_the_api_refuses_a_deeply_nested_webhook_request() -> None:
    import asyncio

    from sim.pods.nats.api import ApiStandin

    api = ApiStandin.__new__(ApiStandin)  # answer() reads only the request: no context needed
    status, body = asyncio.run(api.answer("POST", "/v2/nvcf/webhook/nats-auth", DEEP.encode()))
    assert status == 400 and b"malformed webhook request" in body
