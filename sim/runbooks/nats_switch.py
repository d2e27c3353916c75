"""The NATS worker-auth stack as a small state model, and the rehearsals of switching it to token mode.

The model holds the NVCF API (which hands workers NKEY_SEED or a worker token), NATS with the shared
NKey it trusts, the simulated auth callout (see ``nats_auth``) and the running workers. Time and
randomness are passed in, so a rehearsal replays exactly.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from sim.model.values import DEFAULT_WEBHOOK_URL
from sim.runbooks import nkeys
from sim.runbooks.nats_auth import (
    APP,
    OLD_WORKER_ACCOUNT,
    CalloutConfig,
    Grant,
    Login,
    LogSampler,
    Refused,
    WebhookReply,
    WebhookUnreachable,
    callout_config,
    callout_restart_reasons,
    nkey_login,
    token_login,
)

TOKEN_LIFETIME = 3600.0  # simulated worker-token lifetime; the seed says only that NKey logins never expire


def function_subjects(function_id: str, version_id: str) -> tuple[str, ...]:
    # The seed says "its own function version's subjects"; the exact names are the simulation's.
    return (f"nvcf.fn.{function_id}.{version_id}.>",)


@dataclass
class ApiWebhook:
    """The NVCF API's ``/v2/nvcf/webhook/nats-auth``: checks a worker token and the account it asks for."""

    url: str = DEFAULT_WEBHOOK_URL
    tokens: dict[str, tuple[str, str]] = field(default_factory=dict)  # token -> (function, version)
    revoked: set[str] = field(default_factory=set)
    now: float = 0.0

    def __call__(self, url: str, token: str, account: str) -> WebhookReply:
        if url != self.url:
            raise WebhookUnreachable(f"Post {url!r}: no NVCF API answers at this URL")
        if token not in self.tokens:
            return WebhookReply(401)
        if token in self.revoked or account != APP:
            return WebhookReply(403)
        function_id, version_id = self.tokens[token]
        return WebhookReply(200, f"worker-{function_id}-{version_id}",
                            function_subjects(function_id, version_id), self.now + TOKEN_LIFETIME)


@dataclass
class Worker:
    name: str
    function_id: str
    version_id: str
    env: dict[str, str]
    reads_account: bool  # worker-utils new enough to read NVCF_NATS_ACCOUNT
    started_mode: str
    connection: Grant | Refused | None = None

    @property
    def connected(self) -> bool:
        return isinstance(self.connection, Grant)


class NatsStack:
    """The API, NATS and the callout of one stack, plus its workers."""

    def __init__(self, values: Mapping, rng: random.Random, api_url: str = DEFAULT_WEBHOOK_URL,
                 api_sends_account: bool = True) -> None:
        self.rng = rng
        self.now = 0.0
        self.config: CalloutConfig = callout_config(values)
        self.shared = nkeys.NKey.generate(rng)
        self.retired_nkeys: list[str] = []
        self.api = ApiWebhook(url=api_url)
        self.api_sends_account = api_sends_account
        self.sampler = LogSampler(self.config.logging)
        self.workers: list[Worker] = []
        self.launched = 0  # names stay unique after redeploys remove workers
        self.handed_out: set[str] = set()  # public keys of shared NKeys that left the cluster
        self.log: list[str] = []
        self.restarts: list[str] = []

    # -- operator actions ------------------------------------------------------------------------
    def sync(self, values: Mapping) -> list[str]:
        """Helmfile sync: running workers are untouched; the callout restarts if its settings changed."""
        new = callout_config(values)
        reasons = callout_restart_reasons(self.config, new)
        self.config = new
        if reasons:
            self.sampler = LogSampler(new.logging)
            self.restarts.append("; ".join(reasons))
        return reasons

    def launch(self, function_id: str, version_id: str = "v1", reads_account: bool = True) -> Worker:
        env: dict[str, str] = {}
        if self.config.mode == "nkey":
            env["NKEY_SEED"] = self.shared.seed  # the shared key leaves the cluster on every launch
            self.handed_out.add(self.shared.public)
        else:
            token = self.rng.randbytes(16).hex()
            self.api.tokens[token] = (function_id, version_id)
            env["NVCF_WORKER_TOKEN"] = token
            if self.api_sends_account:
                env["NVCF_NATS_ACCOUNT"] = APP
        name = f"{function_id}-{version_id}-{self.launched}"
        self.launched += 1
        worker = Worker(name, function_id, version_id, env, reads_account, self.config.mode)
        self.workers.append(worker)
        self.connect(worker)
        return worker

    def redeploy(self, worker: Worker) -> Worker:
        """Redeploying the function replaces the worker: the new one gets the current mode's credentials."""
        self.workers.remove(worker)
        return self.launch(worker.function_id, worker.version_id, worker.reads_account)

    def rotate_nkey(self) -> None:
        """New shared NKey; NATS drops clients whose key it no longer trusts and they must log in again."""
        self.retired_nkeys.append(self.shared.public)
        self.shared = nkeys.NKey.generate(self.rng)
        for worker in self.workers:
            if "NKEY_SEED" in worker.env:
                self.connect(worker)

    # -- logins ----------------------------------------------------------------------------------
    def login_for(self, worker: Worker, nonce: bytes) -> Login:
        seed = worker.env.get("NKEY_SEED")
        if seed:
            return Login(worker.name, APP, nkey=nkeys.public_of_seed(seed),
                         signature=nkeys.sign_with_seed(seed, nonce))
        account = worker.env.get("NVCF_NATS_ACCOUNT", "") if worker.reads_account else ""
        return Login(worker.name, account or OLD_WORKER_ACCOUNT, token=worker.env.get("NVCF_WORKER_TOKEN"))

    def connect(self, worker: Worker) -> Grant | Refused:
        nonce = self.rng.randbytes(16)
        login = self.login_for(worker, nonce)
        if login.nkey:
            result = nkey_login(login, nonce, frozenset({self.shared.public}))
        else:
            self.api.now = self.now
            result, records = token_login(login, self.config, self.api)
            for record in records:
                if self.sampler.allow(record, self.now):
                    self.log.append(record.line(self.now))
        worker.connection = result
        return result

    # -- what the operator checks ----------------------------------------------------------------
    def nkey_accepted(self, public: str) -> bool:
        return public == self.shared.public

    def end_state(self) -> dict:
        return {
            "mode": self.config.mode,
            "workers": {w.name: _describe(w.connection) for w in self.workers},
            "shared_nkey_rotations": len(self.retired_nkeys),
            "workers_holding_shared_nkey": sorted(w.name for w in self.workers if "NKEY_SEED" in w.env),
            "callout_restarts": list(self.restarts),
        }


def _describe(result: Grant | Refused | None) -> str:
    if isinstance(result, Grant):
        scope = "all of APP" if result.subjects == (">",) else ", ".join(result.subjects)
        return f"connected as {result.user if result.via == 'token' else 'shared NKey'} ({scope})"
    return f"refused: {result.reason}" if result else "not connected"
