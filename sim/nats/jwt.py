"""NATS JWTs: the few claim shapes the auth callout exchanges with nats-server.

Why a local encoder: the only PyPI packages for NATS JWTs are unmaintained or pull in
heavy dependencies, while the format is small: a JOSE-like header
``{"typ":"JWT","alg":"ed25519-nkey"}``, base64url (no padding) JSON claims, and an
ed25519 signature by an nkey over ``header.claims``. nats-server checks the
signature against the claims' ``iss`` public nkey, so that is what ``decode``
checks too. Everything here is pure: time is passed in.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys  # type: ignore[import-untyped]

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
AUTH_REQUEST_AUDIENCE = "nats-authorization-request"


class JwtError(ValueError):
    """A token that is malformed or not signed by the key it names."""


@dataclass(frozen=True)
class Permissions:
    """Allow/deny lists for a user JWT. Empty lists are left out: to nats-server an
    absent list means "no restriction", so ``Permissions()`` grants the whole account.
    ``resp_max`` > 0 lets the user answer that many messages per request it receives.
    """

    pub_allow: tuple[str, ...] = ()
    sub_allow: tuple[str, ...] = ()
    pub_deny: tuple[str, ...] = ()
    sub_deny: tuple[str, ...] = ()
    resp_max: int = 0

    def to_claims(self) -> dict[str, Any]:
        claims: dict[str, Any] = {}
        for key, allow, deny in (
            ("pub", self.pub_allow, self.pub_deny),
            ("sub", self.sub_allow, self.sub_deny),
        ):
            part = {name: list(items) for name, items in (("allow", allow), ("deny", deny)) if items}
            if part:
                claims[key] = part
        if self.resp_max > 0:
            claims["resp"] = {"max": self.resp_max, "ttl": 0}
        return claims


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode base64url with or without padding (clients send both)."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise JwtError(f"bad base64url: {exc}") from exc


def public_key_bytes(public_key: str) -> bytes:
    """The raw ed25519 key inside an encoded public nkey (prefix byte, key, crc16)."""
    try:
        raw = base64.b32decode(public_key + "=" * (-len(public_key) % 8))
    except (binascii.Error, ValueError) as exc:
        raise JwtError(f"bad public nkey {public_key!r}") from exc
    if len(raw) != 35 or nkeys.crc16(bytearray(raw[:-2])) != int.from_bytes(raw[-2:], "little"):
        raise JwtError(f"bad public nkey {public_key!r}")
    return raw[1:33]


def verify_signature(public_key: str, data: bytes, signature: bytes) -> bool:
    """True when ``signature`` over ``data`` was made by ``public_key``'s seed."""
    try:
        nacl.signing.VerifyKey(public_key_bytes(public_key)).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, JwtError):
        return False
    return True


def _jti(claims: dict[str, Any]) -> str:
    """The claims' id as nats' Go library derives it (hash of the claims without jti)."""
    body = json.dumps({**claims, "jti": ""}, separators=(",", ":"), sort_keys=True).encode()
    try:
        digest = hashlib.new("sha512_256", body).digest()
    except ValueError:  # an OpenSSL without SHA-512/256; the server does not check jti
        digest = hashlib.sha256(body).digest()
    return base64.b32encode(digest).rstrip(b"=").decode("ascii")


def encode(claims: dict[str, Any], signer: nkeys.KeyPair, now: int) -> str:
    """Sign ``claims`` with ``signer``; sets ``iss``, ``iat`` and ``jti``."""
    full = {**claims, "iss": signer.public_key.decode(), "iat": now}
    full["jti"] = _jti(full)
    head = b64url(json.dumps(HEADER, separators=(",", ":")).encode())
    body = b64url(json.dumps(full, separators=(",", ":")).encode())
    signature = signer.sign(f"{head}.{body}".encode("ascii"))
    return f"{head}.{body}.{b64url(signature)}"


def decode(token: str, verify: bool = True) -> dict[str, Any]:
    """The claims of ``token``; with ``verify``, only if signed by its ``iss``. Refusals in nats-io/jwt's words
    where it has them."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError("expected 3 chunks")
    header, claims = _json_part(parts[0]), _json_part(parts[1])
    if not isinstance(header, dict):
        raise JwtError("JWT header is not an object")
    if str(header.get("typ") or "").upper() != HEADER["typ"]:
        raise JwtError(f"not supported type {json.dumps(str(header.get('typ') or ''))}")
    if header.get("alg") != HEADER["alg"]:
        raise JwtError(f"unexpected {json.dumps(str(header.get('alg') or ''))} algorithm")
    if not isinstance(claims, dict):
        raise JwtError("JWT claims are not an object")
    if verify:
        signed = f"{parts[0]}.{parts[1]}".encode("ascii")
        if not verify_signature(str(claims.get("iss", "")), signed, b64url_decode(parts[2])):
            raise JwtError("claim failed V2 signature verification")
    return claims


def _json_part(part: str) -> Any:
    data = b64url_decode(part)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested past Python's stack
        raise JwtError(f"JWT part is not JSON: {type(exc).__name__}") from exc


def user_claims(
    user_nkey: str, account: str, name: str, permissions: Permissions, now: int, ttl: int = 0
) -> dict[str, Any]:
    """A user JWT's claims; in server-config mode ``aud`` names the account to bind."""
    claims: dict[str, Any] = {
        "sub": user_nkey,
        "aud": account,
        "name": name,
        "nbf": now,
        "nats": {
            **permissions.to_claims(),
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
            "version": 2,
        },
    }
    if ttl > 0:
        claims["exp"] = now + ttl
    return claims


def authorization_response(
    user_nkey: str, server_id: str, user_jwt: str = "", error: str = ""
) -> dict[str, Any]:
    """The callout's answer: ``sub`` is the request's user nkey, ``aud`` the server id."""
    nats: dict[str, Any] = {"type": "authorization_response", "version": 2}
    if user_jwt:
        nats["jwt"] = user_jwt
    if error:
        nats["error"] = error
    return {"sub": user_nkey, "aud": server_id, "nats": nats}


def new_keypair(prefix: int, seed32: bytes) -> nkeys.KeyPair:
    """A keypair of the given role (``nkeys.PREFIX_BYTE_USER``...) from 32 random bytes.

    The caller passes the randomness (``os.urandom(32)`` or a seeded source for replays).
    """
    return nkeys.from_seed(bytearray(nkeys.encode_seed(seed32, prefix)))
