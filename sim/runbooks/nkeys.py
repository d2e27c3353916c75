"""User NKeys for the runbooks, from the real ``nkeys`` library (``U...`` public keys, ``SU...`` seeds).

Generation takes its 32 random bytes from a seeded ``random.Random``, so a rehearsal replays with the
same keys; everything else (encoding, CRC-16 checksum, ed25519 signing, verification) is the
library's, so the keys are the ones nats-server and the auth callout accept.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import nkeys as lib  # type: ignore[import-untyped]

from sim.nats import jwt


@dataclass(frozen=True)
class NKey:
    """A user NKey: the seed is what NKEY_SEED carries to a worker; the public key is what NATS trusts."""

    seed: str
    public: str

    @classmethod
    def generate(cls, rng: random.Random) -> NKey:
        pair = jwt.new_keypair(lib.PREFIX_BYTE_USER, rng.randbytes(32))
        return cls(seed=bytes(pair.seed).decode(), public=pair.public_key.decode())

    def sign(self, nonce: bytes) -> bytes:
        return sign_with_seed(self.seed, nonce)


def _pair(seed: str) -> lib.KeyPair:
    try:
        return lib.from_seed(bytearray(seed.encode()))
    except (lib.NkeysError, ValueError) as exc:
        raise ValueError(f"not an NKey seed: {exc}") from None


def sign_with_seed(seed: str, nonce: bytes) -> bytes:
    return bytes(_pair(seed).sign(nonce))


def public_of_seed(seed: str) -> str:
    return str(_pair(seed).public_key.decode())


def decode_public(public: str) -> bytes:
    """The raw ed25519 key of a user's public NKey; ValueError (naming the checksum) if mistyped."""
    try:
        return jwt.public_key_bytes(public)
    except jwt.JwtError as exc:
        raise ValueError(f"not an NKey: checksum or encoding wrong ({exc})") from None


def verify(public: str, nonce: bytes, signature: bytes) -> bool:
    """NATS's nonce challenge: the client proves it holds the seed behind ``public``."""
    return public.startswith("U") and jwt.verify_signature(public, nonce, signature)
