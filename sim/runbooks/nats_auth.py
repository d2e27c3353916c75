"""Worker NATS authentication (``nats.workerAuth``): what the values render, and how the callout logs.

nkey mode: the NVCF API hands every worker the control plane's shared NKey (NKEY_SEED); the auth callout
maps it to APP, so the login reaches all of the APP account and never expires.
token mode: each worker presents its own worker token. NATS hands it to the auth callout, whose APP
account has a webhook plugin that POSTs it to the NVCF API's webhook URL; the API's answer decides, and
the grant covers only that worker's function-version subjects in APP.

The decisions themselves are made by a real nats-server and auth callout (sim.nats, driven by
sim.runbooks.nats_live); this module keeps the pure parts around them: the callout's configuration from
the values (and the render errors) and when a change restarts it; its log sampling is the live callout's
(sim.nats.zaplog: zap's, per message the first ``initial`` lines a second, then 1 in ``thereafter``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.errors import ConfigError
from sim.model.values import DEFAULT_WEBHOOK_URL, deep_merge, lookup
from sim.model.values_check import validate
from sim.nats.zaplog import LogSettings

APP = "APP"
OLD_WORKER_ACCOUNT = "Worker"  # what a worker-utils that ignores NVCF_NATS_ACCOUNT asks for
ALL_SUBJECTS = (">",)
LOGGING_KEY = ("natsAuthCalloutService", "serviceConfig", "logging")


# -- settings from values ----------------------------------------------------------------------------
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
    return CalloutConfig(
        mode=lookup(merged, ("nats", "workerAuth"), "nkey"),
        webhook_url=lookup(merged, ("nats", "authCallout", "workerTokenAuth", "webhookUrl")),
        logging=LogSettings.from_values(merged),  # only serviceConfig.logging reaches the callout
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
