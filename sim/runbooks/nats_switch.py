"""The NATS worker-auth stack of a rehearsal: the NVCF API's part as a small model, NATS for real.

The model keeps what the API decides (which credentials a launched worker gets: NKEY_SEED, or a worker
token and NVCF_NATS_ACCOUNT) and the running workers; nats-server and the auth callout are real
(``nats_live``), so whether a worker gets in, and the log lines that say why, are theirs. Time and
randomness are passed in, so a rehearsal replays exactly.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.model.values import DEFAULT_WEBHOOK_URL
from sim.nats.callout import worker_token
from sim.runbooks import nkeys
from sim.runbooks.nats_auth import (
    APP,
    OLD_WORKER_ACCOUNT,
    CalloutConfig,
    Grant,
    Refused,
    callout_config,
    callout_restart_reasons,
)
from sim.runbooks.nats_live import ApiWebhook, CalloutPlugins, LiveNats

OWN_SUBJECTS = ("rq.*.<fvid>.>",)  # what the API's webhook grants a token worker (sim.nats.subjects)


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

    @property
    def fvid(self) -> str:
        return f"{self.function_id}-{self.version_id}"


class NatsStack:
    """The API's decisions, a real nats-server and callout, and the workers; ``async with running(...)``."""

    def __init__(
        self, live: LiveNats, config: CalloutConfig, rng: random.Random, api_sends_account: bool = True
    ) -> None:
        self.live, self.config, self.rng = live, config, rng
        self.now = 0.0
        self.shared = nkeys.NKey.generate(rng)
        self.retired_nkeys: list[str] = []
        self.api_sends_account = api_sends_account
        self.workers: list[Worker] = []
        self.launched = 0  # names stay unique after redeploys remove workers
        self.handed_out: set[str] = set()  # public keys of shared NKeys that left the cluster
        self.restarts: list[str] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls,
        values: Mapping[str, Any],
        rng: random.Random,
        folder: Path | None = None,
        api_url: str = DEFAULT_WEBHOOK_URL,
        api_sends_account: bool = True,
    ) -> AsyncIterator[NatsStack]:
        config = callout_config(values)  # a render failure happens before anything runs
        clock: list[NatsStack] = []
        async with LiveNats.running(
            folder, ApiWebhook(api_url), lambda: clock[0].now if clock else 0.0
        ) as live:
            stack = cls(live, config, rng, api_sends_account)
            clock.append(stack)
            await live.start_callout(stack.plugins())
            yield stack

    @property
    def api(self) -> ApiWebhook:
        return self.live.api

    @property
    def log(self) -> list[str]:
        """The auth callout's log lines, as sampled, across its restarts."""
        return self.live.log_lines()

    def plugins(self) -> CalloutPlugins:
        return CalloutPlugins(
            ((self.shared.public, APP),),
            self.config.mode == "token",
            self.config.webhook_url,
            self.config.logging,
        )

    # -- operator actions ------------------------------------------------------------------------
    async def sync(self, values: Mapping[str, Any]) -> list[str]:
        """Helmfile sync: running workers are untouched; the callout restarts if its settings changed."""
        new = callout_config(values)
        reasons = callout_restart_reasons(self.config, new)
        self.config = new
        if reasons:
            await self.live.start_callout(self.plugins())
            self.restarts.append("; ".join(reasons))
        return reasons

    async def launch(self, function_id: str, version_id: str = "v1", reads_account: bool = True) -> Worker:
        env: dict[str, str] = {}
        if self.config.mode == "nkey":
            env["NKEY_SEED"] = self.shared.seed  # the shared key leaves the cluster on every launch
            self.handed_out.add(self.shared.public)
        else:
            token = self.rng.randbytes(16).hex()
            self.api.tokens[token] = f"{function_id}-{version_id}"
            env["NVCF_WORKER_TOKEN"] = token
            if self.api_sends_account:
                env["NVCF_NATS_ACCOUNT"] = APP
        name = f"{function_id}-{version_id}-{self.launched}"
        self.launched += 1
        worker = Worker(name, function_id, version_id, env, reads_account, self.config.mode)
        self.workers.append(worker)
        await self.connect(worker)
        return worker

    async def redeploy(self, worker: Worker) -> Worker:
        """Redeploying the function replaces the worker: the new one gets the current mode's credentials."""
        self.workers.remove(worker)
        await self.live.logout(worker.name)
        return await self.launch(worker.function_id, worker.version_id, worker.reads_account)

    async def rotate_nkey(self) -> None:
        """New shared NKey: the callout's mapping changes and NATS rolls, so every worker signs in again,
        and those holding the old key are refused."""
        self.retired_nkeys.append(self.shared.public)
        self.shared = nkeys.NKey.generate(self.rng)
        self.live.plugins = self.plugins()
        await self.live.restart_server()
        for worker in self.workers:
            await self.connect(worker)

    # -- logins ----------------------------------------------------------------------------------
    def credentials(self, worker: Worker) -> dict[str, str]:
        """What worker-utils connects with, from its environment."""
        seed = worker.env.get("NKEY_SEED")
        if seed:
            return {"nkeys_seed_str": seed}
        account = worker.env.get("NVCF_NATS_ACCOUNT", "") if worker.reads_account else ""
        return {"token": worker_token(worker.env.get("NVCF_WORKER_TOKEN", ""), account or OLD_WORKER_ACCOUNT)}

    async def connect(self, worker: Worker) -> Grant | Refused:
        admitted, detail = await self.live.login(worker.name, self.credentials(worker))
        if not admitted:
            worker.connection = Refused(detail)
        elif "NKEY_SEED" in worker.env:
            worker.connection = Grant(
                APP, nkeys.public_of_seed(worker.env["NKEY_SEED"]), (">",), None, "nkey"
            )
        else:
            subjects = tuple(s.replace("<fvid>", worker.fvid) for s in OWN_SUBJECTS)
            worker.connection = Grant(APP, detail, subjects, None, "token")
        return worker.connection

    # -- what the operator checks ----------------------------------------------------------------
    def nkey_accepted(self, public: str) -> bool:
        return public == self.shared.public

    def end_state(self) -> dict[str, Any]:
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
