"""Rehearsals of the Worker NATS Authentication runbook on a real nats-server and auth callout, each
ending in a RunbookReport whose log lines are the callout's and the server's own.

``audit`` reads the end state the way the runbook's Verifying section does and names, for each problem,
the mistake and the runbook step that fixes it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sim.errors import ConfigError
from sim.model.values import WEBHOOK_URL, WORKER_AUTH, KeyPath
from sim.runbooks.given import NO_VALUES, Given
from sim.runbooks.nats_live import run_sync
from sim.runbooks.nats_switch import NatsStack, Refused
from sim.runbooks.report import RIGHT, Reads, RunbookReport, Steps

TOKEN = {"nats": {"workerAuth": "token"}}
STEP_REPLACE = (
    "step 2: replace every worker started before the switch (redeploy its function) "
    "before rotating the shared NKey"
)
STEP_ROTATE = "step 3: rotate the shared NATS NKey once no worker started before the switch is running"
STEP_ACCOUNT = (
    "use an NVCF API that sends NVCF_NATS_ACCOUNT and a worker-utils image that reads it, "
    "then redeploy the function"
)
STEP_URL = "set nats.authCallout.workerTokenAuth.webhookUrl to the URL the NVCF API serves, and sync"
STEP_LOGGING = (
    "set natsAuthCalloutService.serviceConfig.logging to level: debug and sampling.initial: 0 "
    "(this restarts the auth callout), then look again"
)
STEP_TOKEN = "step 1: set nats.workerAuth: token and sync"
LOGGING: KeyPath = ("natsAuthCalloutService", "serviceConfig", "logging")
NATS_KEYS: tuple[KeyPath, ...] = (WORKER_AUTH, ("nats", "authCallout"), LOGGING)
Finding = tuple[str, str]  # (mistake, fix step)


def _refusal_finding(name: str, reason: str, started_mode: str) -> Finding:
    if "plugin webhook not found for account Worker" in reason:
        return (
            (
                f"worker {name} asked for account Worker, not APP (plugin webhook not found for account "
                "Worker): its worker-utils doesn't read NVCF_NATS_ACCOUNT, or the NVCF API doesn't send APP"
            ),
            STEP_ACCOUNT,
        )
    if "webhook request failed" in reason:
        return (
            (
                f"worker {name}: webhook request failed, the auth callout can't reach the NVCF API at the "
                "webhook URL"
            ),
            STEP_URL,
        )
    if "status_code" in reason:
        return f"worker {name}: Authentication denied with {reason}", "check the NVCF API's logs"
    if started_mode == "nkey":
        return (
            (
                f"rotated the shared NKey while worker {name}, started before the switch, still held it: "
                "it was disconnected from NATS"
            ),
            STEP_REPLACE,
        )
    return f"worker {name} refused: {reason}", "check the worker's own logs for its NATS connection error"


def audit(stack: NatsStack) -> list[Finding]:
    findings = [
        _refusal_finding(w.name, w.connection.reason, w.started_mode)
        for w in stack.workers
        if isinstance(w.connection, Refused)
    ]
    if stack.config.mode == "token" and not findings:
        holders = sorted(w.name for w in stack.workers if "NKEY_SEED" in w.env)
        if holders:
            findings.append(
                (
                    (f"workers started before the switch still hold the shared NKey: {', '.join(holders)}"),
                    STEP_REPLACE,
                )
            )
        elif stack.shared.public in stack.handed_out:
            findings.append(
                (
                    (
                        "the shared NKey that left the cluster on worker launches was never rotated: "
                        "it still reaches all of APP with no expiry"
                    ),
                    STEP_ROTATE,
                )
            )
    return findings


def _mode_finding(stack: NatsStack, given: Given) -> list[Finding]:
    """The runbook's token-mode steps never ran when the values leave the stack in nkey mode."""
    if stack.config.mode == "token":
        return []
    where = given.where(WORKER_AUTH) or "the chart default"
    mistake = (
        f"nats.workerAuth is {stack.config.mode} ({where}): the stack never switched to token mode, so "
        "the auth callout never sees a worker token and every worker launch hands out the shared NKey"
    )
    return [(mistake, STEP_TOKEN)]


def _values(story: Mapping[str, Any], given: Given, steps: Steps | None = None) -> dict[str, Any]:
    """The runbook's values with the customer's NATS keys over them; the step names where each came from."""
    values = given.over(story, NATS_KEYS)
    if steps is not None and given.under(NATS_KEYS):
        shown = [given.show(values, parts) for parts in given.under(NATS_KEYS)]
        steps(f"the customer's values: {', '.join(shown)}")
    return values


def _report(
    name: str,
    variant: str,
    stack: NatsStack,
    steps: Steps,
    extra: Mapping[str, Any] | None = None,
    given: Given = NO_VALUES,
) -> RunbookReport:
    findings = _mode_finding(stack, given) + audit(stack)
    mistake, fix = findings[0] if findings else (None, None)
    for line in _quoted(stack):
        steps(line)
    return RunbookReport(
        name,
        variant,
        steps.as_tuple(),
        stack.end_state(),
        not findings,
        mistake,
        fix,
        _log_lines(stack),
        dict(extra or {}),
    )


def _quoted(stack: NatsStack) -> list[str]:
    """The last sign-in verdict as the operator's grep shows it: the callout's line, then the server's."""
    verdicts = [line for line in stack.log if '"Authentication ' in line]
    server = stack.live.server_log()
    return ([f"callout log: {verdicts[-1]}"] if verdicts else []) + (
        [f"nats-server log: {server[-1]}"] if server else []
    )


def _log_lines(stack: NatsStack) -> tuple[str, ...]:
    """The callout's lines, then nats-server's own about the same sign-ins (as `kubectl logs` shows)."""
    return (*stack.log, *(f"nats-server: {line}" for line in stack.live.server_log()))


def _folder(state_dir: Path | None, name: str, variant: str) -> Path | None:
    if state_dir is None:
        return None
    folder = Path(state_dir) / "runbooks" / f"{name}-{variant}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def _nkey_stack_with_workers(stack: NatsStack, steps: Steps) -> None:
    for function_id in ("fn-a", "fn-b"):
        await stack.launch(function_id)
    steps("running in nkey mode with workers fn-a and fn-b holding the shared NKey")


def _credential(stack: NatsStack) -> str:
    return "its worker token" if stack.config.mode == "token" else "the shared NKey (NKEY_SEED), still"


def token_switch(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    async def rehearse() -> RunbookReport:
        steps = Steps()
        async with NatsStack.running(
            {}, random.Random(8), _folder(state_dir, "nats-token-switch", variant)
        ) as stack:
            await _nkey_stack_with_workers(stack, steps)
            values = _values(TOKEN, given, steps)
            restarted = await stack.sync(values)
            steps(
                f"step 1: set nats.workerAuth: {stack.config.mode} and sync"
                + (" (the auth callout restarts)" if restarted else " (nothing changed)")
            )
            await stack.launch("fn-c")
            steps(f"step 2: new worker fn-c signs in with {_credential(stack)}")
            old = [w for w in stack.workers if w.started_mode == "nkey"]
            if variant == RIGHT:
                for worker in old:
                    await stack.redeploy(worker)
                steps(
                    f"step 2: redeployed fn-a and fn-b; their new workers sign in with {_credential(stack)}"
                )
            await stack.rotate_nkey()
            steps("step 3: rotated the shared NATS NKey (NATS rolls: every worker signs in again)")
            return _report("nats-token-switch", variant, stack, steps, given=given)

    return run_sync(rehearse())


def worker_utils(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    async def rehearse() -> RunbookReport:
        steps = Steps()
        values = _values(TOKEN, given, steps)
        async with NatsStack.running(
            values, random.Random(8), _folder(state_dir, "nats-worker-utils", variant)
        ) as stack:
            await stack.launch("fn-a", reads_account=variant == RIGHT)
            steps(
                f"{stack.config.mode} mode: launched fn-a with "
                + (
                    "a worker-utils that reads NVCF_NATS_ACCOUNT"
                    if variant == RIGHT
                    else "an older worker-utils"
                )
            )
            return _report("nats-worker-utils", variant, stack, steps, given=given)

    return run_sync(rehearse())


def webhook_url(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    served = "http://api.nvcf-api.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth"

    async def rehearse() -> RunbookReport:
        steps = Steps()
        async with NatsStack.running(
            {}, random.Random(8), _folder(state_dir, "nats-webhook-url", variant), api_url=served
        ) as stack:
            steps("the NVCF API runs in namespace nvcf-api, not nvcf")
            values: dict[str, Any] = {"nats": {"workerAuth": "token"}}
            if variant == RIGHT:
                values["nats"]["authCallout"] = {"workerTokenAuth": {"webhookUrl": served}}
            values = _values(values, given, steps)
            await stack.sync(values)
            steps(
                f"set nats.workerAuth: {stack.config.mode}"
                + (" and the webhook URL" if variant == RIGHT or given.where(WEBHOOK_URL) else "")
                + ", synced"
            )
            await stack.launch("fn-a")
            steps("launched fn-a")
            return _report("nats-webhook-url", variant, stack, steps, given=given)

    return run_sync(rehearse())


BURST = 300


def log_sampling(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    async def rehearse() -> RunbookReport:
        steps = Steps()
        values: dict[str, Any] = {"nats": {"workerAuth": "token"}}
        if variant == RIGHT:
            values["natsAuthCalloutService"] = {
                "serviceConfig": {"logging": {"level": "debug", "sampling": {"initial": 0}}}
            }
            steps("set natsAuthCalloutService.serviceConfig.logging: level debug, sampling.initial 0")
        values = _values(values, given, steps)
        async with NatsStack.running(
            values, random.Random(8), _folder(state_dir, "nats-log-sampling", variant)
        ) as stack:
            for index in range(BURST):  # one second's burst: the rehearsal's clock does not move
                await stack.launch(f"fn-{index}")
            logged = sum('"Authentication successful"' in line for line in stack.log)
            steps(
                f"{BURST} workers logged in within one second; {logged} 'Authentication successful' "
                "lines logged"
            )
            report = _report(
                "nats-log-sampling", variant, stack, steps, {"logged": logged, "logins": BURST}, given
            )
        if logged < BURST and report.ok:
            mistake = (
                f"debugging with the default log sampling: {BURST - logged} of {BURST} "
                "'Authentication successful' lines were dropped, so those workers look as if their "
                "login never reached the auth callout"
            )
            return RunbookReport(
                report.name,
                variant,
                report.steps,
                report.end_state,
                False,
                mistake,
                STEP_LOGGING,
                report.log_lines,
                report.extra,
            )
        return report

    return run_sync(rehearse())


def values_check(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    steps = Steps()
    values = _values(TOKEN if variant == RIGHT else {"nats": {"workerAuth": "tokens"}}, given)
    steps(f"set {given.show(values, WORKER_AUTH)} and render")

    async def rehearse() -> RunbookReport:
        async with NatsStack.running(
            values, random.Random(8), _folder(state_dir, "nats-values", variant)
        ) as stack:
            return RunbookReport(
                "nats-values", variant, steps.as_tuple(), {"rendered": True, **stack.end_state()}, True
            )

    try:
        return run_sync(rehearse())
    except ConfigError as exc:
        return RunbookReport(
            "nats-values",
            variant,
            steps.as_tuple(),
            {"rendered": False},
            False,
            str(exc),
            "set nats.workerAuth to nkey or token",
        )


_READS = Reads(NATS_KEYS, why="it reads only nats.workerAuth, nats.authCallout and the callout's logging")
READS = dict.fromkeys(
    ("nats-token-switch", "nats-worker-utils", "nats-webhook-url", "nats-log-sampling", "nats-values"), _READS
)
RUNS: dict[str, Callable[[str, Path | None, Given], RunbookReport]] = {
    "nats-token-switch": token_switch,
    "nats-worker-utils": worker_utils,
    "nats-webhook-url": webhook_url,
    "nats-log-sampling": log_sampling,
    "nats-values": values_check,
}
