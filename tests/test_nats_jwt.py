"""NATS JWT encode/decode; the real server's acceptance is in test_auth.py."""

from __future__ import annotations

import base64
import json

import pytest
from nats_support import Keys

from sim.nats import jwt

KEYS = Keys()


def test_round_trip_keeps_claims_and_sets_issuer() -> None:
    token = jwt.encode({"sub": "U1", "nats": {"type": "user"}}, KEYS.issuer, now=1000)
    head = token.split(".")[0]
    assert "=" not in token
    assert json.loads(jwt.b64url_decode(head)) == {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = jwt.decode(token)
    assert claims["sub"] == "U1" and claims["iat"] == 1000
    assert claims["iss"] == Keys.pub(KEYS.issuer)
    assert len(claims["jti"]) == 52  # base32 of a 256-bit hash, unpadded


@pytest.mark.parametrize("tamper", ["claims", "signature", "issuer"])
def test_decode_refuses_tampering(tamper: str) -> None:
    token = jwt.encode({"sub": "U1"}, KEYS.issuer, now=1000)
    head, body, sig = token.split(".")
    claims = jwt.decode(token)
    if tamper == "claims":
        body = jwt.b64url(json.dumps({**claims, "sub": "U2"}).encode())
    elif tamper == "signature":
        sig = jwt.b64url(bytes(64))
    else:
        body = jwt.b64url(json.dumps({**claims, "iss": Keys.pub(KEYS.other_account)}).encode())
    with pytest.raises(jwt.JwtError):
        jwt.decode(f"{head}.{body}.{sig}")
    assert jwt.decode(f"{head}.{body}.{sig}", verify=False)["iat"] == 1000


@pytest.mark.parametrize(
    "token", ["", "a.b", "a.b.c.d", "!!.e30.x", jwt.b64url(b'{"alg":"HS256"}') + ".e30.x"]
)
def test_decode_refuses_malformed(token: str) -> None:
    with pytest.raises(jwt.JwtError):
        jwt.decode(token)


def test_public_key_checksum_and_signature() -> None:
    pub = Keys.pub(KEYS.worker)
    assert len(jwt.public_key_bytes(pub)) == 32
    broken = pub[:-1] + ("A" if pub[-1] != "A" else "B")
    with pytest.raises(jwt.JwtError):
        jwt.public_key_bytes(broken)
    sig = KEYS.worker.sign(b"nonce")
    assert jwt.verify_signature(pub, b"nonce", sig)
    assert not jwt.verify_signature(pub, b"other", sig)
    assert not jwt.verify_signature(Keys.pub(KEYS.stranger), b"nonce", sig)


def test_b64url_accepts_padding_or_not() -> None:
    assert jwt.b64url_decode(base64.urlsafe_b64encode(b"ab").decode()) == b"ab"
    assert jwt.b64url_decode(jwt.b64url(b"ab")) == b"ab"


PERMS = [
    (jwt.Permissions(), {}),
    (jwt.Permissions(pub_allow=("a",)), {"pub": {"allow": ["a"]}}),
    (
        jwt.Permissions(sub_allow=("b",), sub_deny=("c",), resp_max=1),
        {"sub": {"allow": ["b"], "deny": ["c"]}, "resp": {"max": 1, "ttl": 0}},
    ),
]


@pytest.mark.parametrize("perms,expected", PERMS)
def test_permissions_leave_out_empty_lists(perms: jwt.Permissions, expected: dict) -> None:
    assert perms.to_claims() == expected


def test_user_and_response_claims() -> None:
    user = jwt.user_claims("UX", "APP", "worker-f", jwt.Permissions(pub_allow=("a",)), now=10, ttl=5)
    assert user["aud"] == "APP" and user["sub"] == "UX" and user["exp"] == 15 and user["nbf"] == 10
    assert user["nats"]["type"] == "user" and user["nats"]["version"] == 2 and user["nats"]["subs"] == -1
    assert "exp" not in jwt.user_claims("UX", "APP", "n", jwt.Permissions(), now=10)
    ok = jwt.authorization_response("UX", "NSERVER", user_jwt="j")
    assert ok == {
        "sub": "UX",
        "aud": "NSERVER",
        "nats": {"type": "authorization_response", "version": 2, "jwt": "j"},
    }
    assert jwt.authorization_response("UX", "NSERVER", error="no")["nats"]["error"] == "no"
