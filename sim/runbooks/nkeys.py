"""NKey-like Ed25519 keys, encoded the way NATS prints them (``U...`` public keys, ``SU...`` seeds).

The encoding is a prefix byte, the raw key and a CRC-16 (XMODEM) checksum, base32 without padding, so a
simulated key looks and fails like a real one (a mistyped character breaks the checksum). The cryptography
library does the signing; no nkeys package is needed.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

PREFIX_USER = 20 << 3  # base32 "U"
PREFIX_SEED = 18 << 3  # base32 "S"; the second byte carries the key type, giving "SU"


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM (poly 0x1021, init 0)."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _encode(prefix: bytes, raw: bytes) -> str:
    body = prefix + raw
    return base64.b32encode(body + crc16(body).to_bytes(2, "little")).decode().rstrip("=")


def _decode(text: str) -> bytes:
    padded = text + "=" * (-len(text) % 8)
    try:
        data = base64.b32decode(padded)
    except ValueError as exc:
        raise ValueError(f"not an NKey: {exc}") from None
    body, check = data[:-2], data[-2:]
    if len(data) < 3 or crc16(body).to_bytes(2, "little") != check:
        raise ValueError("not an NKey: checksum mismatch")
    return body


def encode_public(raw: bytes) -> str:
    return _encode(bytes([PREFIX_USER]), raw)


def encode_seed(raw: bytes) -> str:
    return _encode(bytes([PREFIX_SEED | (PREFIX_USER >> 5), (PREFIX_USER & 31) << 3]), raw)


@dataclass(frozen=True)
class NKey:
    """A user NKey: the seed is what NKEY_SEED carries to a worker; the public key is what NATS trusts."""

    seed: str
    public: str

    @classmethod
    def generate(cls, rng: random.Random) -> NKey:
        raw = rng.randbytes(32)  # seeded, so a replay mints the same keys
        private = Ed25519PrivateKey.from_private_bytes(raw)
        public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return cls(seed=encode_seed(raw), public=encode_public(public))

    def sign(self, nonce: bytes) -> bytes:
        return sign_with_seed(self.seed, nonce)


def sign_with_seed(seed: str, nonce: bytes) -> bytes:
    body = _decode(seed)
    return Ed25519PrivateKey.from_private_bytes(body[2:]).sign(nonce)


def public_of_seed(seed: str) -> str:
    body = _decode(seed)
    private = Ed25519PrivateKey.from_private_bytes(body[2:])
    return encode_public(private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def verify(public: str, nonce: bytes, signature: bytes) -> bool:
    """NATS's nonce challenge: the client proves it holds the seed behind ``public``."""
    try:
        body = _decode(public)
        if body[0] != PREFIX_USER:
            return False
        Ed25519PublicKey.from_public_bytes(body[1:]).verify(signature, nonce)
    except (ValueError, InvalidSignature):
        return False
    return True
