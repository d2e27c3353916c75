"""Rehearsals of Disabling Admin Issuer Proxy against a real TLS gateway stand-in on 127.0.0.1.

Each run installs the proxy, performs the runbook's steps (or a mistaken subset), then checks the end
state the way the runbook does: the removal check (chart objects and the OpenBao grant) and the edge
check with real ``curl --resolve``.
"""

from __future__ import annotations

import contextlib
import random
import shlex
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sim.model.values import KeyPath, lookup
from sim.runbooks import admin_issuer as ai
from sim.runbooks.gateway import (
    EdgeCheck,
    EdgeTls,
    mint_edge_tls,
    post_admin_keys,
    run_edge_check,
    running_gateway,
)
from sim.runbooks.given import FRESH, NO_VALUES, Given
from sim.runbooks.report import RIGHT, Reads, RunbookReport, Steps

DOMAIN = "nvcf.example.com"
NOW = 1_800_000_000.0  # a fixed clock: the 12-hour expiry is checked against it
STEP_UNINSTALL = "step 1: helm uninstall admin-issuer-proxy -n api-keys"
STEP_REVOKE = (
    f"step 2: revoke the OpenBao grant: bao delete {ai.AUTH_ROLE}; bao delete {ai.POLICY}; "
    f"bao delete {ai.SECRET_ROLE}"
)
STEP_RERUN_K = "re-run the edge check with -k to get past the TLS check and read the routing result"
STEP_RESOLVE = (
    "run the edge check with --resolve api-keys.<domain>:443:<load-balancer-address>, "
    "not -H Host, so the TLS server name is the route's hostname"
)
STEP_DISABLE = (
    "set adminIssuerProxy.enabled: false in the environment file and sync, then do steps 1 and 2 "
    "(helm uninstall, revoke the OpenBao grant)"
)
STEP_GATEWAY = (
    "set adminIssuerProxy.gateway.enabled: false and sync: it removes only the "
    "api-keys.<domain>/v1/admin/keys route"
)
ADMIN: KeyPath = ("adminIssuerProxy",)
ENABLED: KeyPath = (*ADMIN, "enabled")
GATEWAY: KeyPath = (*ADMIN, "gateway", "enabled")
PDB: KeyPath = (*ADMIN, "podDisruptionBudget", "enabled")
STEP_TOKEN = (
    "skip nvcf-cli init: export NVCF_TOKEN with a token from your identity provider "
    "(or put token: in ~/.nvcf-cli.yaml)"
)


@dataclass
class Rehearsal:
    folder: Path
    tls: EdgeTls
    port: int = 0
    plane: ai.Plane = field(default_factory=ai.Plane)
    issuer: ai.Issuer = field(default_factory=lambda: ai.Issuer.generate(random.Random(8)))
    steps: Steps = field(default_factory=Steps)

    def handle(self, method: str, host: str, path: str) -> ai.Reply:
        return ai.gateway_reply(self.plane, self.issuer, DOMAIN, host, method, path, NOW)

    def edge(self, insecure: bool = False, host_header: bool = False) -> EdgeCheck:
        return run_edge_check(DOMAIN, self.port, self.tls.ca_path, insecure, host_header=host_header)

    def cli(self, command: str) -> ai.CliResult:
        status, body = post_admin_keys(self.port, ai.keys_host(DOMAIN), self.tls.ca_path)
        return ai.cli_generate(command, status, body, self.folder / "home")

    def state(self, *checks: EdgeCheck) -> dict:
        check = ai.removal_check(self.plane)
        return {
            "release_left": list(check.release_left),
            "grant_left": list(check.grant_left),
            "capability": check.capability,
            "edge": [_edge_summary(c) for c in checks],
        }


def _edge_summary(check: EdgeCheck) -> dict:
    return {
        "exit": check.exit_code,
        "status": check.status,
        "outcome": check.verdict.outcome,
        "insecure": "-k" in check.command,
    }


@contextlib.contextmanager
def rehearsal(
    state_dir: Path | None, names: tuple[str, ...] = (f"*.{DOMAIN}",), fresh: bool = False
) -> Iterator[Rehearsal]:
    """The gateway stand-in up, and the proxy installed as the runbook starts (an existing install), or
    nothing of it yet (`fresh`)."""
    with contextlib.ExitStack() as stack:
        if state_dir is None:
            state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ncpsim-runbook-")))
        folder = Path(state_dir) / "runbooks" / "admin-issuer"
        run = Rehearsal(folder, mint_edge_tls(folder / "tls", names))
        served = stack.enter_context(running_gateway(run.handle, run.tls.context))
        run.port = served.port
        if fresh:
            run.steps("a fresh install: nothing of the admin issuer proxy exists yet")
        else:
            run.plane = ai.sync(ai.Plane(), {})
            run.steps("installed with adminIssuerProxy.enabled: true (release and OpenBao grant)")
        yield run


def sync(run: Rehearsal, given: Given, story: dict) -> dict:
    """Helmfile sync with the runbook's values and the customer's over them; the step says which is whose."""
    values = given.over({"adminIssuerProxy": story}, (ADMIN,))
    installed = run.plane != ai.Plane()
    run.plane = ai.sync(run.plane, values, pdb=lookup(values, PDB, False) is True)
    shown = [given.show(values, key) for key in (ENABLED, GATEWAY, PDB) if lookup(values, key) is not None]
    disabled = lookup(values, ENABLED) is False
    effect = (" (removes nothing that exists)" if installed else " (installs nothing)") if disabled else ""
    run.steps(f"set {', '.join(shown)} and synced{effect}")
    return values


def _report(
    name: str, variant: str, run: Rehearsal, mistake: str | None, fix: str | None, *checks: EdgeCheck
) -> RunbookReport:
    lines = tuple(
        shlex.join(c.command) + f" -> exit {c.exit_code}, {c.status}: {c.verdict.advice}" for c in checks
    )
    return RunbookReport(
        name, variant, run.steps.as_tuple(), run.state(*checks), mistake is None, mistake, fix, lines
    )


def removal(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    with rehearsal(state_dir, fresh=given.install == FRESH) as run:
        values = sync(run, given, {"enabled": False})
        run.plane = ai.helm_uninstall(run.plane)
        run.steps(STEP_UNINSTALL)
        if variant == RIGHT:
            for path in ai.GRANT:
                run.plane = ai.bao_delete(run.plane, path)
            run.steps(STEP_REVOKE)
        before = run.plane
        run.plane = ai.sync(run.plane, values, pdb=lookup(values, PDB, False) is True)
        again = (
            "reinstalled the release and recreated the grant" if run.plane != before else "changed nothing"
        )
        run.steps(f"the next sync of the same values {again}")
        edge = run.edge()
        run.steps(f"edge check: curl exit {edge.exit_code}, status {edge.status} ({edge.verdict.outcome})")
        check = ai.removal_check(run.plane)
        mistake, fix = None, None
        if lookup(values, ENABLED) is True and not check.removed:
            where = given.where(ENABLED) or "the chart default"
            mistake = (
                f"adminIssuerProxy.enabled is true ({where}): the next sync reinstalls the release and its "
                "migration recreates the OpenBao grant, so the removal does not last"
            )
            fix = STEP_DISABLE
        elif check.capability != "withdrawn":
            mistake, fix = _grant_mistake(check), STEP_REVOKE
        return _report("admin-issuer-removal", variant, run, mistake, fix, edge)


def _grant_mistake(check: ai.RemovalCheck) -> str:
    left = ", ".join(check.grant_left)
    if check.capability == "granted":
        return (
            f"only step 1 was done: capability still granted, OpenBao still holds {left}, so any pod "
            "running as the admin-issuer-proxy service account in api-keys can still sign admin-scoped "
            "tokens for the NVCF API issuer"
        )
    return f"step 2 was left half done: OpenBao still holds {left}; the verification grep is not empty"


def edge_route(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    """right: gateway.enabled false drops only the route; wrong: enabled false on an existing install."""
    with rehearsal(state_dir, fresh=given.install == FRESH) as run:
        values = sync(run, given, {"gateway": {"enabled": False}} if variant == RIGHT else {"enabled": False})
        edge = run.edge()
        run.steps(f"edge check: curl exit {edge.exit_code}, status {edge.status} ({edge.verdict.outcome})")
        inside = ai.gateway_reply(
            run.plane, run.issuer, DOMAIN, "", "POST", ai.KEYS_PATH, NOW, in_cluster=True
        )
        run.steps(f"in-cluster POST {ai.KEYS_PATH}: {inside.status}")
        mistake, fix = (None, None) if edge.verdict.passed else _edge_mistake(edge, values, given)
        return _report("admin-issuer-edge", variant, run, mistake, fix, edge)


def _edge_mistake(edge: EdgeCheck, values: dict, given: Given) -> tuple[str, str]:
    served = f"the edge still serves {ai.keys_host(DOMAIN)}{ai.KEYS_PATH} (curl exit {edge.exit_code} with {edge.status})"
    if edge.verdict.outcome != "served":
        return f"the edge check was {edge.verdict.outcome}: {edge.verdict.advice}", STEP_RESOLVE
    if lookup(values, ENABLED) is False:
        where = f" ({given.where(ENABLED)})" if given.where(ENABLED) else ""
        return (
            f"{served}: setting adminIssuerProxy.enabled: false{where} on an existing install removes nothing",
            STEP_UNINSTALL,
        )
    where = given.where(GATEWAY) or "the chart default"
    return (
        f"{served}: adminIssuerProxy.gateway.enabled is true ({where}), so the route stays attached",
        STEP_GATEWAY,
    )


def edge_certificate(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    """The edge's certificate does not cover api-keys.<domain>: exit 60 is a TLS failure, not a pass."""
    with rehearsal(state_dir, names=(f"www.{DOMAIN}",)) as run:
        run.plane = ai.helm_uninstall(run.plane)
        for path in ai.GRANT:
            run.plane = ai.bao_delete(run.plane, path)
        run.steps(f"{STEP_UNINSTALL}; {STEP_REVOKE}")
        first = run.edge()
        run.steps(f"edge check: curl exit {first.exit_code}, status {first.status} ({first.verdict.outcome})")
        checks = [first]
        if variant == RIGHT and first.verdict.outcome == "certificate-mismatch":
            checks.append(run.edge(insecure=True))
            run.steps(
                f"re-ran with -k: exit {checks[-1].exit_code}, status {checks[-1].status} "
                f"({checks[-1].verdict.outcome})"
            )
        else:
            run.steps("read the result as a pass: nothing answered 200")
        mistake = None
        if not checks[-1].verdict.passed:
            mistake = (
                f"took curl exit {first.exit_code} with status {first.status} for a pass: the request "
                "never reached the Gateway, so the check is inconclusive"
            )
        return _report(
            "admin-issuer-edge-cert", variant, run, mistake, STEP_RERUN_K if mistake else None, *checks
        )


def edge_host_header(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    """The proxy is removed; the wrong run checks the edge with -H Host against the load-balancer address."""
    with rehearsal(state_dir) as run:
        run.plane = ai.helm_uninstall(run.plane)
        for path in ai.GRANT:
            run.plane = ai.bao_delete(run.plane, path)
        run.steps(f"{STEP_UNINSTALL}; {STEP_REVOKE}")
        edge = run.edge(host_header=variant != RIGHT)
        form = "-H Host" if variant != RIGHT else "--resolve"
        run.steps(
            f"edge check with {form}: curl exit {edge.exit_code}, status {edge.status} "
            f"({edge.verdict.outcome})"
        )
        mistake = None
        if not edge.verdict.passed:
            mistake = (
                "checked the edge with -H Host: the TLS server name was the load-balancer address, "
                f"so the certificate was checked against it (curl exit {edge.exit_code}, status "
                f"{edge.status}) and the request never reached the Gateway"
            )
        return _report(
            "admin-issuer-edge-host-header", variant, run, mistake, STEP_RESOLVE if mistake else None, edge
        )


def cli_without_proxy(variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    with rehearsal(state_dir) as run:
        first = run.cli("init")
        run.steps(f"nvcf-cli init while the proxy is installed: exit {first.exit_code}")
        run.plane = ai.bao_delete(ai.helm_uninstall(run.plane), ai.AUTH_ROLE)
        run.plane = ai.bao_delete(ai.bao_delete(run.plane, ai.POLICY), ai.SECRET_ROLE)
        (run.folder / "home" / ai.STATE_FILE).unlink(missing_ok=True)
        run.steps("removed the proxy (both steps); a new operator machine has no state file")
        env: dict[str, str] = {}
        lines: list[str] = []
        if variant == RIGHT:
            env["NVCF_TOKEN"] = "token-from-identity-provider"
            run.steps("exported NVCF_TOKEN from the identity provider and skipped nvcf-cli init")
        else:
            result = run.cli("init")
            lines = result.stderr.splitlines()
            run.steps(f"ran nvcf-cli init: exit {result.exit_code}")
        resolved = ai.resolve_token(env, run.folder / "home")
        mistake = (
            None
            if resolved
            else (
                "ran nvcf-cli init on a stack without the admin issuer proxy: POST /v1/admin/keys is unrouted, "
                "so it fails with a bare 'API error 404:' and usage text, and no token is configured"
            )
        )
        report = _report("nvcf-cli-no-proxy", variant, run, mistake, STEP_TOKEN if mistake else None)
        end = {**report.end_state, "token_source": resolved[1] if resolved else None}
        return RunbookReport(
            report.name, variant, report.steps, end, report.ok, report.mistake, report.fix_step, tuple(lines)
        )


BY_HAND = Reads(
    why="this rehearsal removes the proxy by hand (helm uninstall, bao delete); no sync reads values"
)
SYNCED = Reads((ADMIN,), install=True, why="it reads only adminIssuerProxy.*")
READS = {
    "admin-issuer-removal": SYNCED,
    "admin-issuer-edge": SYNCED,
    "admin-issuer-edge-cert": BY_HAND,
    "admin-issuer-edge-host-header": BY_HAND,
    "nvcf-cli-no-proxy": BY_HAND,
}
RUNS: dict[str, Callable[[str, Path | None, Given], RunbookReport]] = {
    "admin-issuer-removal": removal,
    "admin-issuer-edge": edge_route,
    "admin-issuer-edge-cert": edge_certificate,
    "admin-issuer-edge-host-header": edge_host_header,
    "nvcf-cli-no-proxy": cli_without_proxy,
}
