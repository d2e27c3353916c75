"""Encrypted Secret Store keys: an MEK (AES-256-GCM, in OpenBao) wraps per-namespace NEKs (in Cassandra),
which encrypt the secrets. A pure model with time and randomness passed in.

MEK rotation as rehearsed: add the new MEK first and keep the old ones; let a grace period pass (at
least the interval at which ESS replicas reload the keyring) before the new MEK wraps anything; re-wrap
the NEKs; retire an old MEK only when no NEK is wrapped by it. Reading a NEK needs the exact MEK that
wrapped it, so dropping an old MEK early strands every secret under it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE = 12


@dataclass(frozen=True)
class Mek:
    id: str
    key: bytes
    created: float
    usable_from: float  # created + grace: before this no replica may wrap with it


@dataclass(frozen=True)
class Sealed:
    key_id: str  # the MEK (for a NEK) or NEK (for a secret) that encrypted it
    nonce: bytes
    ciphertext: bytes


class Stranded(LookupError):
    """A secret that can no longer be decrypted, with why."""


@dataclass
class Ess:
    rng: random.Random
    meks: dict[str, Mek] = field(default_factory=dict)  # OpenBao
    neks: dict[str, dict[str, Sealed]] = field(default_factory=dict)  # Cassandra: namespace -> id -> wrapped
    active_nek: dict[str, str] = field(default_factory=dict)
    secrets: dict[tuple[str, str], Sealed] = field(default_factory=dict)

    # -- keys --------------------------------------------------------------------------------------
    def add_mek(self, now: float, grace: float) -> Mek:
        mek = Mek(f"mek-{len(self.meks) + 1}", self.rng.randbytes(32), now, now + grace)
        self.meks[mek.id] = mek
        return mek

    def active_mek(self, now: float) -> Mek:
        usable = [m for m in self.meks.values() if m.usable_from <= now]
        if not usable:
            raise LookupError("no MEK is usable yet")
        return max(usable, key=lambda m: (m.usable_from, m.created))

    def drop_mek(self, mek_id: str) -> None:
        del self.meks[mek_id]

    def neks_wrapped_by(self, mek_id: str) -> list[str]:
        return sorted(ns for ns, keys in self.neks.items() if any(w.key_id == mek_id for w in keys.values()))

    def _seal(self, key: bytes, key_id: str, plain: bytes, aad: bytes) -> Sealed:
        nonce = self.rng.randbytes(NONCE)
        return Sealed(key_id, nonce, AESGCM(key).encrypt(nonce, plain, aad))

    def _nek(self, namespace: str, now: float) -> tuple[str, bytes]:
        """The namespace's active NEK, made (and wrapped by the active MEK) on first use."""
        if namespace not in self.active_nek:
            nek_id = f"nek-{namespace}-1"
            key = self.rng.randbytes(32)
            mek = self.active_mek(now)
            self.neks.setdefault(namespace, {})[nek_id] = self._seal(
                mek.key, mek.id, key, _nek_aad(namespace, nek_id)
            )
            self.active_nek[namespace] = nek_id
        nek_id = self.active_nek[namespace]
        return nek_id, self.unwrap(namespace, nek_id)

    def unwrap(self, namespace: str, nek_id: str, known: set[str] | None = None) -> bytes:
        """Decrypt a NEK. ``known`` is the MEK ids a replica has loaded (all of OpenBao by default)."""
        wrapped = self.neks[namespace][nek_id]
        mek = self.meks.get(wrapped.key_id)
        if mek is None:
            raise Stranded(f"NEK {nek_id} is wrapped by {wrapped.key_id}, which is no longer in OpenBao")
        if known is not None and mek.id not in known:
            raise Stranded(f"NEK {nek_id} is wrapped by {wrapped.key_id}, which this replica has not loaded")
        try:
            return AESGCM(mek.key).decrypt(wrapped.nonce, wrapped.ciphertext, _nek_aad(namespace, nek_id))
        except InvalidTag:
            raise Stranded(f"NEK {nek_id} does not decrypt with {mek.id}") from None

    def rewrap(self, now: float) -> int:
        """Re-encrypt every NEK under the active MEK; the secrets themselves are untouched."""
        mek, count = self.active_mek(now), 0
        for namespace, keys in self.neks.items():
            for nek_id, wrapped in list(keys.items()):
                if wrapped.key_id != mek.id:
                    plain = self.unwrap(namespace, nek_id)
                    keys[nek_id] = self._seal(mek.key, mek.id, plain, _nek_aad(namespace, nek_id))
                    count += 1
        return count

    # -- secrets -----------------------------------------------------------------------------------
    def put(self, namespace: str, name: str, value: bytes, now: float) -> None:
        nek_id, key = self._nek(namespace, now)
        self.secrets[(namespace, name)] = self._seal(key, nek_id, value, _secret_aad(namespace, name))

    def get(self, namespace: str, name: str, known: set[str] | None = None) -> bytes:
        sealed = self.secrets[(namespace, name)]
        key = self.unwrap(namespace, sealed.key_id, known)
        try:
            return AESGCM(key).decrypt(sealed.nonce, sealed.ciphertext, _secret_aad(namespace, name))
        except InvalidTag:
            raise Stranded(f"secret {namespace}/{name} does not decrypt with {sealed.key_id}") from None

    def unreadable(self, known: set[str] | None = None) -> dict[str, str]:
        """Every secret that does not decrypt, as ``namespace/name -> reason``."""
        failed = {}
        for namespace, name in sorted(self.secrets):
            try:
                self.get(namespace, name, known)
            except Stranded as exc:
                failed[f"{namespace}/{name}"] = str(exc)
        return failed


def replica_keyring(ess: Ess, now: float, reload_interval: float) -> set[str]:
    """The MEKs a replica that last reloaded ``reload_interval`` ago holds: the worst case of all replicas."""
    return {m.id for m in ess.meks.values() if m.created <= now - reload_interval}


def _nek_aad(namespace: str, nek_id: str) -> bytes:
    # Binding the namespace in stops a wrapped NEK from being copied to another namespace's row.
    return f"nek:{namespace}:{nek_id}".encode()


def _secret_aad(namespace: str, name: str) -> bytes:
    return f"secret:{namespace}:{name}".encode()
