"""The stack's NATS, as every component must agree on it: keys, worker credentials, names (pure).

Why derived, not stored: the nats-server supervisor, the callout, the pods and every worker host
start at once, each in its own process, and must hold the same keys. Deriving them from the stack's
own secret (``Topology.secret``: 32 bytes of OS randomness drawn when the stack is created, kept in
its owner-only state folder) needs no file to race on, a restarted component gets the same keys, and a
process without the stack's files cannot guess them. Never from the scenario's seed: that is public,
and a key derived from it would let any local process sign in as the API or as the workers. They are
real ed25519 NKeys (``nkeys``); nothing outside the simulation trusts them.

Who signs in how (public NVCF chart, seed "Worker NATS Authentication"):

- invocation-service and grpc-proxy: their own NKeys, ``auth_users`` that bypass the callout;
- the callout service: its own NKey in account AUTH, also in ``auth_users``;
- workers in ``nkey`` mode: the shared worker NKey (NKEY_SEED), mapped to APP by the callout;
- workers in ``token`` mode: base64url ``{"account","pluginName","payload"}`` whose payload is the
  worker's own token, which the NVCF API's webhook (a stand-in here) checks: an HMAC of the worker
  and function version under a key only the API holds. The API's own tokens are encrypted and valid
  3 hours (NvcfIssuedToken.VALIDITY); ncpsim's never expire: not modelled.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

import nkeys  # type: ignore[import-untyped]

from sim.model.topology import Topology
from sim.model.values import AUTH_TIMEOUT, NatsValues

from . import jwt
from .callout import WEBHOOK_PLUGIN, CalloutSettings, worker_token
from .config import APP_ACCOUNT, CalloutBlock, ClusterBlock, NkeyUser, ServerConfig

REGION = "ncpsim"  # the stack's one region, in stream and subject names
OLD_WORKER_ACCOUNT = "Worker"  # what a worker-utils that ignores NVCF_NATS_ACCOUNT asks for
INTERNAL_ROLES = ("invocation-service", "grpc-proxy", "nvcf-api")


def _keypair(secret: str, role: str, prefix: int) -> nkeys.KeyPair:
    raw = hashlib.sha256(f"ncpsim-nats:{secret}:{role}".encode()).digest()
    return jwt.new_keypair(prefix, raw)


@dataclass(frozen=True)
class StackKeys:
    """Seeds (S...) of every NATS identity of one stack; public keys derived on demand."""

    callout_user: str
    issuer: str  # account key that signs the callout's answers
    worker: str  # the shared worker NKey
    internal: Mapping[str, str]  # role -> seed (invocation-service, grpc-proxy, nvcf-api)
    token_secret: bytes  # the API's key for worker tokens

    @classmethod
    def of(cls, topology: Topology, generation: int = 0) -> StackKeys:
        """The stack's keys, from its secret; a topology saved before stacks had one keeps its old keys
        (its seed's), so a running stack's restarted components still agree with the rest."""
        return cls.derive(topology.secret or f"seed:{topology.seed}", generation)

    @classmethod
    def derive(cls, secret: str, generation: int = 0) -> StackKeys:
        """``generation`` > 0: the shared worker NKey after that many rotations."""
        user, account = nkeys.PREFIX_BYTE_USER, nkeys.PREFIX_BYTE_ACCOUNT
        worker_role = "worker" if generation == 0 else f"worker-{generation}"
        return cls(
            callout_user=_seed(_keypair(secret, "callout", user)),
            issuer=_seed(_keypair(secret, "issuer", account)),
            worker=_seed(_keypair(secret, worker_role, user)),
            internal={role: _seed(_keypair(secret, role, user)) for role in INTERNAL_ROLES},
            token_secret=hashlib.sha256(f"ncpsim-nats:{secret}:token-secret".encode()).digest(),
        )

    def internal_users(self) -> tuple[NkeyUser, ...]:
        return tuple(NkeyUser(role, public_key(seed)) for role, seed in sorted(self.internal.items()))

    def callout_block(self) -> CalloutBlock:
        return CalloutBlock(issuer=public_key(self.issuer), user=public_key(self.callout_user))

    def nkey_mappings(self) -> tuple[tuple[str, str], ...]:
        return ((public_key(self.worker), APP_ACCOUNT),)


def _seed(kp: nkeys.KeyPair) -> str:
    return bytes(kp.seed).decode()


def public_key(seed: str) -> str:
    return str(nkeys.from_seed(bytearray(seed.encode())).public_key.decode())


def server_config(
    keys: StackKeys,
    store_dir: str,
    port: int = 0,
    monitor_port: int = 0,
    cluster: ClusterBlock | None = None,
    name: str = "ncpsim-nats",
    pid_file: str = "",
    auth_timeout: float = AUTH_TIMEOUT,
) -> ServerConfig:
    """The config the nats chart renders: the callout on in both modes (nkey logins map through it);
    the server's config is the same in both modes, only the callout's plugins differ. ``name``: the pod's
    (the chart's server_name is $POD_NAME), unique in a cluster; ``auth_timeout``: NatsValues'."""
    return ServerConfig(
        store_dir=store_dir,
        auth_timeout=auth_timeout,
        callout=keys.callout_block(),
        internal_users=keys.internal_users(),
        port=port,
        monitor_port=monitor_port,
        server_name=name,
        cluster=cluster,
        pid_file=pid_file,
    )


def callout_settings(keys: StackKeys, values: NatsValues) -> CalloutSettings:
    return CalloutSettings.for_mode(values.worker_auth, keys.nkey_mappings())


# -- worker tokens -----------------------------------------------------------------------------------
def mint_worker_token(keys: StackKeys, worker: str, fvid: str) -> str:
    """The worker token the NVCF API hands one worker of one function version."""
    mac = hmac.new(keys.token_secret, f"{worker}|{fvid}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"{worker}|{fvid}|{mac}"


def check_worker_token(keys: StackKeys, token: str) -> str | None:
    """The function version a worker token was minted for, or None (forged, mangled)."""
    parts = token.split("|")
    if len(parts) != 3:
        return None
    worker, fvid, _ = parts
    return fvid if hmac.compare_digest(mint_worker_token(keys, worker, fvid), token) else None


@dataclass(frozen=True)
class WorkerCredentials:
    """What a worker connects with: nats-py's keyword arguments and a name for logs."""

    connect_kwargs: Mapping[str, str]
    describe: str


def worker_credentials(
    keys: StackKeys, mode: str, worker: str, fvid: str, reads_account: bool = True
) -> WorkerCredentials:
    """nkey mode: NKEY_SEED (the shared key); token mode: the worker's own token, for its account."""
    if mode == "nkey":
        return WorkerCredentials({"nkeys_seed_str": keys.worker}, "shared worker NKey")
    account = APP_ACCOUNT if reads_account else OLD_WORKER_ACCOUNT
    token = worker_token(mint_worker_token(keys, worker, fvid), account, WEBHOOK_PLUGIN)
    return WorkerCredentials({"token": token}, f"worker token ({account})")
