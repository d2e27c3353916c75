"""Worker NATS authentication runbook: NKeys (the real library), the values, and the rehearsals on a real
nats-server and auth callout."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from sim.errors import ConfigError
from sim.model.values import DEFAULT_WEBHOOK_URL
from sim.nats.zaplog import LogSettings
from sim.runbooks import nkeys
from sim.runbooks.nats_auth import (
    APP,
    CalloutConfig,
    Grant,
    Refused,
    callout_config,
    callout_restart_reasons,
    may_access,
    subject_matches,
)
from sim.runbooks.nats_runs import RUNS, STEP_ACCOUNT, STEP_REPLACE, STEP_ROTATE, STEP_URL, audit
from sim.runbooks.nats_switch import NatsStack

T = TypeVar("T")
REHEARSAL_TIMEOUT = 30.0  # seconds for one rehearsal on a real nats-server


def live(body: Callable[[NatsStack], Awaitable[T]], values: dict | None = None) -> T:
    """Run ``body`` on a rehearsal stack (a real nats-server and callout, stopped afterwards)."""

    async def go() -> T:
        async with NatsStack.running(values or {}, random.Random(3)) as stack:
            return await body(stack)

    return asyncio.run(asyncio.wait_for(go(), REHEARSAL_TIMEOUT))


# -- NKeys -------------------------------------------------------------------------------------------
def test_nkey_encoding_and_challenge() -> None:
    key = nkeys.NKey.generate(random.Random(1))
    assert key.public.startswith("U") and key.seed.startswith("SU")
    assert nkeys.public_of_seed(key.seed) == key.public
    assert nkeys.verify(key.public, b"nonce", key.sign(b"nonce"))
    assert not nkeys.verify(key.public, b"other", key.sign(b"nonce"))
    other = nkeys.NKey.generate(random.Random(2))
    assert not nkeys.verify(other.public, b"nonce", key.sign(b"nonce"))


def test_nkey_checksum_catches_a_typo() -> None:
    public = nkeys.NKey.generate(random.Random(1)).public
    typo = public[:10] + ("A" if public[10] != "A" else "B") + public[11:]
    with pytest.raises(ValueError, match="checksum"):
        nkeys.decode_public(typo)
    assert not nkeys.verify(typo, b"n", b"x" * 64)


def test_nkey_generation_is_seeded() -> None:
    assert nkeys.NKey.generate(random.Random(5)) == nkeys.NKey.generate(random.Random(5))


# -- values ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"nats": {"workerAuth": "tokens"}}, "nats.workerAuth must be nkey or token"),
        ({"nats": {"workerAuth": True}}, "nats.workerAuth must be nkey or token"),
        (
            {"nats": {"workerAuth": "token", "authCallout": {"workerTokenAuth": {"webhookUrl": ""}}}},
            "must be set when nats.workerAuth is token",
        ),
    ],
)
def test_values_errors(values: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        callout_config(values)


def test_config_defaults_and_logging() -> None:
    assert callout_config({}) == CalloutConfig("nkey", DEFAULT_WEBHOOK_URL, LogSettings("info", 100, 100))
    config = callout_config(
        {
            "nats": {"workerAuth": "token"},
            "natsAuthCalloutService": {
                "serviceConfig": {
                    "logging": {"level": "debug", "sampling": {"initial": 0}},
                    "other": {"ignored": True},
                }
            },
        }
    )
    assert config.plugins == {APP: DEFAULT_WEBHOOK_URL}
    assert config.logging == LogSettings("debug", 0, 100) and not config.logging.sampling


@pytest.mark.parametrize(
    ("new", "reasons"),
    [
        ({}, []),
        ({"nats": {"workerAuth": "token"}}, ["nats.workerAuth changed from nkey to token"]),
        (
            {"nats": {"authCallout": {"workerTokenAuth": {"webhookUrl": "http://x/y"}}}},
            ["the webhook URL changed"],
        ),
        (
            {"natsAuthCalloutService": {"serviceConfig": {"logging": {"level": "debug"}}}},
            ["natsAuthCalloutService.serviceConfig.logging changed"],
        ),
    ],
)
def test_callout_restarts_on_mode_url_and_logging(new: dict, reasons: list[str]) -> None:
    assert callout_restart_reasons(callout_config({}), callout_config(new)) == reasons


# -- subjects and grants ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pattern", "subject", "match"),
    [
        (">", "a.b", True),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.*.c", "a.x.c", True),
    ],
)
def test_subject_matching(pattern: str, subject: str, match: bool) -> None:
    assert subject_matches(pattern, subject) is match


def test_scope_nkey_everything_forever_token_own_subjects_until_expiry() -> None:
    nkey = Grant(APP, "U", (">",), None, "nkey")
    token = Grant(APP, "worker-fn-v1", ("nvcf.fn.fn.v1.>",), 100.0, "token")
    assert may_access(nkey, APP, "nvcf.fn.other.v9.req", 1e12)
    assert may_access(token, APP, "nvcf.fn.fn.v1.req", 50.0)
    assert not may_access(token, APP, "nvcf.fn.other.v9.req", 50.0)
    assert not may_access(token, APP, "nvcf.fn.fn.v1.req", 100.0)
    assert not may_access(token, "SYS", "nvcf.fn.fn.v1.req", 50.0)


# Sampling: tests/test_nats_callout_logging.py (the live callout's and the rehearsals' one sampler).


# -- the switch ----------------------------------------------------------------------------------------
def test_running_workers_keep_the_nkey_after_the_switch() -> None:
    async def body(stack: NatsStack) -> None:
        old = await stack.launch("fn-a")
        assert "NKEY_SEED" in old.env and old.connected
        await stack.sync({"nats": {"workerAuth": "token"}})
        new = await stack.launch("fn-b")
        assert old.connected and "NKEY_SEED" not in new.env and new.env["NVCF_NATS_ACCOUNT"] == APP
        assert audit(stack)[0][1] == STEP_REPLACE
        await stack.redeploy(old)
        assert audit(stack)[0][1] == STEP_ROTATE
        retired = stack.shared.public
        await stack.rotate_nkey()
        assert audit(stack) == [] and not stack.nkey_accepted(retired)
        assert all(w.connected for w in stack.workers)  # every worker signed in again after NATS rolled

    live(body)


@pytest.mark.parametrize(
    ("name", "fix", "log_text"),
    [
        ("nats-token-switch", STEP_REPLACE, None),
        ("nats-worker-utils", STEP_ACCOUNT, "plugin webhook not found for account Worker"),
        ("nats-webhook-url", STEP_URL, "webhook request failed"),
    ],
)
def test_done_wrong_runs_name_the_mistake_and_fix(name: str, fix: str, log_text: str | None) -> None:
    right, wrong = RUNS[name]("right", None), RUNS[name]("wrong", None)
    assert right.ok, f"{right.mistake}\n" + "\n".join([*right.steps, str(dict(right.end_state))])
    assert any("Authentication successful" in line and "worker-" in line for line in right.log_lines)
    assert not wrong.ok and wrong.fix_step == fix and wrong.mistake
    if log_text:
        assert any(log_text in line for line in wrong.log_lines)
        # nats-server's own line, from the real server's log
        assert any(
            line.startswith("nats-server: ") and f"Auth callout service returned an error: {log_text}" in line
            for line in wrong.log_lines
        )


def test_token_switch_right_end_state() -> None:
    report = RUNS["nats-token-switch"]("right", None)
    assert report.end_state["mode"] == "token" and report.end_state["shared_nkey_rotations"] == 1
    assert report.end_state["workers_holding_shared_nkey"] == []
    assert all("connected as worker-" in v for v in report.end_state["workers"].values())


def test_values_run() -> None:
    wrong = RUNS["nats-values"]("wrong", None)
    assert wrong.mistake == "nats.workerAuth must be nkey or token" and RUNS["nats-values"]("right", None).ok


def test_switching_back_restores_the_shared_key_for_new_workers() -> None:
    async def body(stack: NatsStack) -> None:
        token_worker = await stack.launch("fn-a")
        assert await stack.sync({}) == ["nats.workerAuth changed from token to nkey"]
        new = await stack.launch("fn-b")
        assert new.env["NKEY_SEED"] == stack.shared.seed and new.connected
        assert token_worker.connected  # running workers keep what they logged in with

    live(body, {"nats": {"workerAuth": "token"}})


@pytest.mark.parametrize(("tamper", "status"), [("unknown", 401), ("revoked", 403)])
def test_api_refusals_are_logged_as_denied(tamper: str, status: int) -> None:
    async def body(stack: NatsStack) -> None:
        worker = await stack.launch("fn-a")
        token = worker.env["NVCF_WORKER_TOKEN"]
        if tamper == "unknown":
            worker.env["NVCF_WORKER_TOKEN"] = "not-a-token"
        else:
            stack.api.revoked.add(token)
        assert await stack.connect(worker) == Refused(f"status_code {status}")
        denied = [json.loads(line) for line in stack.log if '"Authentication denied"' in line]
        assert denied[-1]["status_code"] == status
        assert "check the NVCF API's logs" in audit(stack)[0][1]

    live(body, {"nats": {"workerAuth": "token"}})
