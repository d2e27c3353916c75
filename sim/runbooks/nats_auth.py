"""Worker NATS authentication (``nats.workerAuth``): what the values render, and how the callout logs.

nkey mode: the NVCF API hands every worker the control plane's shared NKey (NKEY_SEED); the auth callout
maps it to APP, so the login reaches all of the APP account and never expires.
token mode: each worker presents its own worker token. NATS hands it to the auth callout, whose APP
account has a webhook plugin that POSTs it to the NVCF API's webhook URL; the API's answer decides, and
the grant covers only that worker's function-version subjects in APP.

The decisions themselves are made by a real nats-server and auth callout (sim.pods.nats, driven by
sim.runbooks.nats_live); this module keeps the pure parts around them: the callout's configuration from
the values (and the render errors), when a change restarts it, and its log sampling (zap's: per
message, the first ``initial`` lines a second, then 1 in ``thereafter``), with time passed in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.errors import ConfigError
from sim.model.values import DEFAULT_WEBHOOK_URL, deep_merge, lookup, validate

APP = "APP"
OLD_WORKER_ACCOUNT = "Worker"  # what a worker-utils that ignores NVCF_NATS_ACCOUNT asks for
ALL_SUBJECTS = (">",)
LOGGING_KEY = ("natsAuthCalloutService", "serviceConfig", "logging")


# -- settings from values ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LogSettings:
    """The callout's zap-style logging: level, and per message the first ``initial`` lines per second,
    then 1 in ``thereafter``. The seed turns sampling off with ``initial: 0``."""

    level: str = "info"
    initial: int = 100
    thereafter: int = 100

    @property
    def sampling(self) -> bool:
        return self.initial > 0


@dataclass(frozen=True)
class CalloutConfig:
    mode: str
    webhook_url: str
    logging: LogSettings

    @property
    def plugins(self) -> Mapping[str, str]:
        """Account -> webhook URL. Only token mode gives APP a webhook plugin."""
        return {APP: self.webhook_url} if self.mode == "token" else {}


def callout_config(values: Mapping[str, Any]) -> CalloutConfig:
    """What the nats and nats-auth-callout-service releases render; raises ConfigError like the render."""
    issues = [i for i in validate(values) if i.path.startswith("nats.")]
    if issues:
        error = ConfigError(str(issues[0]))
        error.issues = tuple(issues)
        raise error
    merged = deep_merge(
        {"nats": {"authCallout": {"workerTokenAuth": {"webhookUrl": DEFAULT_WEBHOOK_URL}}}}, values
    )
    # Only serviceConfig.logging reaches the callout; the stack ignores other serviceConfig keys.
    logging = lookup(merged, LOGGING_KEY, {}) or {}
    sampling = logging.get("sampling") or {}
    return CalloutConfig(
        mode=lookup(merged, ("nats", "workerAuth"), "nkey"),
        webhook_url=lookup(merged, ("nats", "authCallout", "workerTokenAuth", "webhookUrl")),
        logging=LogSettings(
            level=str(logging.get("level", "info")),
            initial=int(sampling.get("initial", 100)),
            thereafter=int(sampling.get("thereafter", 100)),
        ),
    )


def callout_restart_reasons(old: CalloutConfig, new: CalloutConfig) -> list[str]:
    """The callout reads its plugin configuration only at start-up, so these changes restart it."""
    reasons = []
    if old.mode != new.mode:
        reasons.append(f"nats.workerAuth changed from {old.mode} to {new.mode}")
    if old.webhook_url != new.webhook_url:
        reasons.append("the webhook URL changed")
    if old.logging != new.logging:
        reasons.append("natsAuthCalloutService.serviceConfig.logging changed")
    return reasons


# -- grants ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    account: str
    user: str
    subjects: tuple[str, ...]
    expires: float | None  # None: the grant never expires (the shared NKey)
    via: str  # "nkey" or "token"


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class LogRecord:
    level: str
    msg: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def line(self, ts: float) -> str:
        # JSON lines like the callout's structured logger, so the seed's greps work on them verbatim.
        record = {"level": self.level, "ts": round(ts, 3), "msg": self.msg, **self.fields}
        return json.dumps(record, separators=(",", ":"))


# -- subjects ----------------------------------------------------------------------------------------
def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcards: ``*`` is one token, a trailing ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or (token != "*" and token != have[index]):
            return False
    return len(want) == len(have)


def may_access(grant: Grant, account: str, subject: str, now: float) -> bool:
    if grant.account != account or (grant.expires is not None and now >= grant.expires):
        return False
    return any(subject_matches(pattern, subject) for pattern in grant.subjects)


# -- log sampling ------------------------------------------------------------------------------------
class LogSampler:
    """Per message text: the first ``initial`` lines in each one-second tick, then every ``thereafter``-th.

    Time is passed in, so a burst of logins replays identically."""

    def __init__(self, settings: LogSettings) -> None:
        self.settings = settings
        self._counts: dict[tuple[str, int], int] = {}

    def allow(self, record: LogRecord, now: float) -> bool:
        if record.level == "debug" and self.settings.level != "debug":
            return False
        if not self.settings.sampling:
            return True
        key = (record.msg, int(now))
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        if count <= self.settings.initial:
            return True
        return (count - self.settings.initial) % max(self.settings.thereafter, 1) == 0
