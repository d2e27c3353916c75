"""Rehearsals of the Worker NATS Authentication runbook, each ending in a RunbookReport.

``audit`` reads the end state the way the runbook's Verifying section does and names, for each problem,
the mistake and the runbook step that fixes it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path

from sim.errors import ConfigError
from sim.runbooks.nats_switch import NatsStack
from sim.runbooks.report import RIGHT, RunbookReport, Steps

TOKEN = {"nats": {"workerAuth": "token"}}
STEP_REPLACE = ("step 2: replace every worker started before the switch (redeploy its function) "
                "before rotating the shared NKey")
STEP_ROTATE = "step 3: rotate the shared NATS NKey once no worker started before the switch is running"
STEP_ACCOUNT = ("use an NVCF API that sends NVCF_NATS_ACCOUNT and a worker-utils image that reads it, "
                "then redeploy the function")
STEP_URL = "set nats.authCallout.workerTokenAuth.webhookUrl to the URL the NVCF API serves, and sync"
STEP_LOGGING = ("set natsAuthCalloutService.serviceConfig.logging to level: debug and sampling.initial: 0 "
                "(this restarts the auth callout), then look again")
Finding = tuple[str, str]  # (mistake, fix step)


def _refusal_finding(name: str, reason: str, started_mode: str) -> Finding:
    if "plugin webhook not found for account Worker" in reason:
        return ((f"worker {name} asked for account Worker, not APP (plugin webhook not found for account "
                "Worker): its worker-utils doesn't read NVCF_NATS_ACCOUNT, or the NVCF API doesn't send APP"),
                STEP_ACCOUNT)
    if "webhook request failed" in reason:
        return ((f"worker {name}: webhook request failed, the auth callout can't reach the NVCF API at the "
                "webhook URL"), STEP_URL)
    if "status_code" in reason:
        return f"worker {name}: Authentication denied with {reason}", "check the NVCF API's logs"
    if started_mode == "nkey":
        return ((f"rotated the shared NKey while worker {name}, started before the switch, still held it: "
                "it was disconnected from NATS"), STEP_REPLACE)
    return f"worker {name} refused: {reason}", "check the worker's own logs for its NATS connection error"


def audit(stack: NatsStack) -> list[Finding]:
    findings = [_refusal_finding(w.name, w.connection.reason, w.started_mode)
                for w in stack.workers if w.connection is not None and not w.connected]
    if stack.config.mode == "token" and not findings:
        holders = sorted(w.name for w in stack.workers if "NKEY_SEED" in w.env)
        if holders:
            findings.append(((f"workers started before the switch still hold the shared NKey: "
                             f"{', '.join(holders)}"), STEP_REPLACE))
        elif stack.shared.public in stack.handed_out:
            findings.append((("the shared NKey that left the cluster on worker launches was never rotated: "
                             "it still reaches all of APP with no expiry"), STEP_ROTATE))
    return findings


def _report(name: str, variant: str, stack: NatsStack, steps: Steps, extra: Mapping | None = None
            ) -> RunbookReport:
    findings = audit(stack)
    mistake, fix = findings[0] if findings else (None, None)
    return RunbookReport(name, variant, steps.as_tuple(), stack.end_state(), not findings, mistake, fix,
                         tuple(stack.log), dict(extra or {}))


def _nkey_stack_with_workers(steps: Steps) -> NatsStack:
    stack = NatsStack({}, random.Random(8))
    for function_id in ("fn-a", "fn-b"):
        stack.launch(function_id)
    steps("running in nkey mode with workers fn-a and fn-b holding the shared NKey")
    return stack


def token_switch(variant: str, _state_dir: Path | None = None) -> RunbookReport:
    steps = Steps()
    stack = _nkey_stack_with_workers(steps)
    stack.sync(TOKEN)
    steps("step 1: set nats.workerAuth: token and sync (the auth callout restarts)")
    stack.launch("fn-c")
    steps("step 2: new worker fn-c authenticates with its worker token")
    old = [w for w in stack.workers if w.started_mode == "nkey"]
    if variant == RIGHT:
        for worker in old:
            stack.redeploy(worker)
        steps("step 2: redeployed fn-a and fn-b; their new workers use worker tokens")
    stack.rotate_nkey()
    steps("step 3: rotated the shared NATS NKey")
    return _report("nats-token-switch", variant, stack, steps)


def worker_utils(variant: str, _state_dir: Path | None = None) -> RunbookReport:
    steps = Steps()
    stack = NatsStack(TOKEN, random.Random(8))
    stack.launch("fn-a", reads_account=variant == RIGHT)
    steps("token mode: launched fn-a with " + ("a worker-utils that reads NVCF_NATS_ACCOUNT"
                                               if variant == RIGHT else "an older worker-utils"))
    return _report("nats-worker-utils", variant, stack, steps)


def webhook_url(variant: str, _state_dir: Path | None = None) -> RunbookReport:
    steps = Steps()
    served = "http://api.nvcf-api.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth"
    stack = NatsStack({}, random.Random(8), api_url=served)
    steps("the NVCF API runs in namespace nvcf-api, not nvcf")
    values: dict = {"nats": {"workerAuth": "token"}}
    if variant == RIGHT:
        values["nats"]["authCallout"] = {"workerTokenAuth": {"webhookUrl": served}}
    stack.sync(values)
    steps("set nats.workerAuth: token" + (" and the webhook URL" if variant == RIGHT else "") + ", synced")
    stack.launch("fn-a")
    steps("launched fn-a")
    return _report("nats-webhook-url", variant, stack, steps)


BURST = 300


def log_sampling(variant: str, _state_dir: Path | None = None) -> RunbookReport:
    steps = Steps()
    values: dict = {"nats": {"workerAuth": "token"}}
    if variant == RIGHT:
        values["natsAuthCalloutService"] = {"serviceConfig": {"logging": {
            "level": "debug", "sampling": {"initial": 0}}}}
        steps("set natsAuthCalloutService.serviceConfig.logging: level debug, sampling.initial 0")
    stack = NatsStack(values, random.Random(8))
    for index in range(BURST):  # one second's burst: the clock does not move
        stack.launch(f"fn-{index}")
    logged = sum('"Authentication successful"' in line for line in stack.log)
    steps(f"{BURST} workers logged in within one second; {logged} 'Authentication successful' lines logged")
    report = _report("nats-log-sampling", variant, stack, steps, {"logged": logged, "logins": BURST})
    if logged < BURST:
        mistake = (f"debugging with the default log sampling: {BURST - logged} of {BURST} "
                   "'Authentication successful' lines were dropped, so those workers look as if their login "
                   "never reached the auth callout")
        return RunbookReport(report.name, variant, report.steps, report.end_state, False, mistake,
                             STEP_LOGGING, report.log_lines, report.extra)
    return report


def values_check(variant: str, _state_dir: Path | None = None) -> RunbookReport:
    steps = Steps()
    values = TOKEN if variant == RIGHT else {"nats": {"workerAuth": "tokens"}}
    steps(f"set nats.workerAuth: {values['nats']['workerAuth']} and render")
    try:
        stack = NatsStack(values, random.Random(8))
    except ConfigError as exc:
        return RunbookReport("nats-values", variant, steps.as_tuple(), {"rendered": False}, False, str(exc),
                             "set nats.workerAuth to nkey or token")
    return RunbookReport("nats-values", variant, steps.as_tuple(), {"rendered": True, **stack.end_state()},
                         True)


RUNS: dict[str, Callable[[str, Path | None], RunbookReport]] = {
    "nats-token-switch": token_switch,
    "nats-worker-utils": worker_utils,
    "nats-webhook-url": webhook_url,
    "nats-log-sampling": log_sampling,
    "nats-values": values_check,
}
