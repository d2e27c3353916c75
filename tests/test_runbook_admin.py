"""Admin issuer proxy runbook: install state, the OpenBao grant, the admin JWT, nvcf-cli, and the gateway
stand-in over real TLS on loopback with the real curl edge check."""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.errors import ConfigError
from sim.runbooks import admin_issuer as ai
from sim.runbooks.admin_runs import (
    RUNS,
    STEP_RERUN_K,
    STEP_RESOLVE,
    STEP_REVOKE,
    STEP_TOKEN,
    STEP_UNINSTALL,
)
from sim.runbooks.gateway import mint_edge_tls, post_admin_keys, run_edge_check, running_gateway

DOMAIN = "nvcf.example.com"
NOW = 1_000_000.0
INSTALLED = ai.sync(ai.Plane(), {})


# -- install state and the two-step removal ---------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "values", "route", "serving", "grant"),
    [
        (ai.Plane(), {}, True, True, True),
        (ai.Plane(), {"adminIssuerProxy": {"enabled": False}}, False, False, False),
        (ai.Plane(), {"adminIssuerProxy": {"gateway": {"enabled": False}}}, False, True, True),
        (INSTALLED, {"adminIssuerProxy": {"enabled": False}}, True, True, True),  # removes nothing
        (INSTALLED, {"adminIssuerProxy": {"gateway": {"enabled": False}}}, False, True, True),
        (ai.Plane(frozenset(), frozenset()), {"adminIssuerProxy": {"enabled": True}}, True, True, True),
    ],
)
def test_sync(start: ai.Plane, values: dict, route: bool, serving: bool, grant: bool) -> None:
    plane = ai.sync(start, values)
    assert (plane.route_attached, plane.serving, plane.can_sign()) == (route, serving, grant)


def test_sync_rejects_non_boolean() -> None:
    with pytest.raises(ConfigError, match="adminIssuerProxy.enabled: must be true or false"):
        ai.sync(ai.Plane(), {"adminIssuerProxy": {"enabled": "false"}})


def test_pdb_is_part_of_the_release_when_enabled() -> None:
    assert "PodDisruptionBudget" in ai.sync(ai.Plane(), {}, pdb=True).release


@pytest.mark.parametrize(
    ("deleted", "capability"),
    [
        ((), "granted"),
        ((ai.AUTH_ROLE,), "partly revoked"),
        ((ai.AUTH_ROLE, ai.POLICY), "partly revoked"),
        (ai.GRANT, "withdrawn"),
    ],
)
def test_removal_check_after_step_1(deleted: tuple[str, ...], capability: str) -> None:
    plane = ai.helm_uninstall(INSTALLED)
    for path in deleted:
        plane = ai.bao_delete(plane, path)
    check = ai.removal_check(plane)
    assert check.release_left == () and check.capability == capability
    assert check.removed == (capability == "withdrawn")
    assert plane.can_sign() == (capability == "granted")


def test_reenabling_recreates_the_grant() -> None:
    plane = ai.bao_delete(ai.helm_uninstall(INSTALLED), ai.POLICY)
    assert ai.sync(plane, {"adminIssuerProxy": {"enabled": True}}) == INSTALLED


# -- the admin JWT -----------------------------------------------------------------------------------
def test_admin_token_is_12_hours_with_the_scopes() -> None:
    issuer = ai.Issuer.generate(random.Random(1))
    claims = ai.verify_admin(issuer.mint_admin(INSTALLED, NOW), issuer.public_key, NOW)
    assert claims["exp"] - claims["iat"] == 12 * 3600 and claims["scopes"] == list(ai.ADMIN_SCOPES)
    with pytest.raises(ValueError, match="expired"):
        ai.verify_admin(issuer.mint_admin(INSTALLED, NOW), issuer.public_key, NOW + 12 * 3600)


def test_admin_token_signature_is_checked() -> None:
    issuer, other = ai.Issuer.generate(random.Random(1)), ai.Issuer.generate(random.Random(2))
    token = issuer.mint_admin(INSTALLED, NOW)
    with pytest.raises(ValueError, match="invalid"):
        ai.verify_admin(token, other.public_key, NOW)
    head, body, sig = token.split(".")
    with pytest.raises(ValueError, match="invalid"):
        ai.verify_admin(f"{head}.{body}x.{sig}", issuer.public_key, NOW)


def test_signing_needs_the_grant() -> None:
    with pytest.raises(ai.SigningDenied):
        ai.Issuer.generate(random.Random(1)).mint_admin(ai.bao_delete(INSTALLED, ai.SECRET_ROLE), NOW)


# -- the gateway's decision --------------------------------------------------------------------------
ISSUER = ai.Issuer.generate(random.Random(1))
HOST = ai.keys_host(DOMAIN)


@pytest.mark.parametrize(
    ("plane", "host", "method", "path", "status"),
    [
        (INSTALLED, HOST, "POST", ai.KEYS_PATH, 200),
        (INSTALLED, HOST, "GET", ai.KEYS_PATH, 405),
        (INSTALLED, HOST, "POST", "/v1/other", 404),
        (INSTALLED, f"other.{DOMAIN}", "POST", ai.KEYS_PATH, 404),
        (ai.helm_uninstall(INSTALLED), HOST, "POST", ai.KEYS_PATH, 404),
        (
            ai.sync(INSTALLED, {"adminIssuerProxy": {"gateway": {"enabled": False}}}),
            HOST,
            "POST",
            ai.KEYS_PATH,
            404,
        ),
        (ai.bao_delete(INSTALLED, ai.POLICY), HOST, "POST", ai.KEYS_PATH, 500),
    ],
)
def test_gateway_reply(plane: ai.Plane, host: str, method: str, path: str, status: int) -> None:
    reply = ai.gateway_reply(plane, ISSUER, DOMAIN, host, method, path, NOW)
    assert reply.status == status
    if status == 404:
        assert reply.body == b""  # what makes nvcf-cli's error bare


def test_in_cluster_service_survives_gateway_disabled() -> None:
    plane = ai.sync(INSTALLED, {"adminIssuerProxy": {"gateway": {"enabled": False}}})
    reply = ai.gateway_reply(plane, ISSUER, DOMAIN, "", "POST", ai.KEYS_PATH, NOW, in_cluster=True)
    assert reply.status == 200


# -- nvcf-cli ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["init", "refresh"])
def test_cli_bare_404_with_usage(command: str, tmp_path: Path) -> None:
    result = ai.cli_generate(command, 404, b"", tmp_path)
    lines = result.stderr.splitlines()
    assert result.exit_code == 1
    assert lines[0] == "Error: failed to generate admin token: API error 404:"
    assert lines[1] == "Usage:" and lines[2].strip() == f"nvcf-cli {command} [flags]"


def test_token_resolution_order(tmp_path: Path) -> None:
    assert ai.resolve_token({}, tmp_path) is None
    assert ai.cli_generate("init", 200, json.dumps({"token": "from-state"}).encode(), tmp_path).exit_code == 0
    assert ai.resolve_token({}, tmp_path) == ("from-state", str(tmp_path / ai.STATE_FILE))
    (tmp_path / ai.CONFIG_FILE).write_text('token: "from-config"\n')
    assert ai.resolve_token({}, tmp_path) == ("from-config", str(tmp_path / ai.CONFIG_FILE))
    assert ai.resolve_token({"NVCF_TOKEN": "from-env"}, tmp_path) == ("from-env", "NVCF_TOKEN")


# -- reading the edge check ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "status", "outcome", "passed"),
    [
        (0, "404", "no-route", True),
        (0, "405", "served", False),
        (0, "200", "served", False),
        (60, "000", "certificate-mismatch", False),
        (7, "000", "inconclusive", False),
        (28, "000", "inconclusive", False),
        (35, "000", "inconclusive", False),
    ],
)
def test_interpret_edge(code: int, status: str, outcome: str, passed: bool) -> None:
    verdict = ai.interpret_edge(code, status)
    assert (verdict.outcome, verdict.passed) == (outcome, passed)
    if code == 60:
        assert "-k" in verdict.advice


# -- the gateway over real TLS, and real curl ------------------------------------------------------------
class Holder:
    plane = INSTALLED


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Holder, int, Path]]:
    holder = Holder()
    tls = mint_edge_tls(tmp_path, (f"*.{DOMAIN}",))

    def handle(method: str, host: str, path: str) -> ai.Reply:
        return ai.gateway_reply(holder.plane, ISSUER, DOMAIN, host, method, path, NOW)

    with running_gateway(handle, tls.context) as served:
        yield holder, served.port, tls.ca_path
    assert not [t for t in threading.enumerate() if t.name == "gateway-loop"], "gateway thread left running"


def test_post_returns_a_verifiable_admin_jwt(gateway: tuple[Holder, int, Path]) -> None:
    _, port, ca = gateway
    status, body = post_admin_keys(port, HOST, ca)
    claims = ai.verify_admin(json.loads(body)["token"], ISSUER.public_key, NOW)
    assert status == 200 and claims["exp"] - claims["iat"] == 43200


def test_unrouted_host_gets_404_empty_body(gateway: tuple[Holder, int, Path]) -> None:
    _, port, ca = gateway
    assert post_admin_keys(port, f"nothing.{DOMAIN}", ca) == (404, b"")


def test_curl_edge_check_served_then_no_route(gateway: tuple[Holder, int, Path]) -> None:
    holder, port, ca = gateway
    served = run_edge_check(DOMAIN, port, ca)
    assert (served.exit_code, served.status, served.verdict.outcome) == (0, "405", "served")
    assert "--resolve" in served.command and f"{HOST}:{port}:127.0.0.1" in served.command
    holder.plane = ai.helm_uninstall(holder.plane)
    gone = run_edge_check(DOMAIN, port, ca)
    assert (gone.exit_code, gone.status, gone.verdict.outcome) == (0, "404", "no-route")


def test_curl_exit_60_on_a_certificate_that_misses_the_host(tmp_path: Path) -> None:
    tls = mint_edge_tls(tmp_path, (f"www.{DOMAIN}",))
    with running_gateway(lambda m, h, p: ai.Reply(404), tls.context) as served:
        strict = run_edge_check(DOMAIN, served.port, tls.ca_path)
        loose = run_edge_check(DOMAIN, served.port, tls.ca_path, insecure=True)
    assert (strict.exit_code, strict.status, strict.verdict.outcome) == (60, "000", "certificate-mismatch")
    assert (loose.exit_code, loose.status, loose.verdict.outcome) == (0, "404", "no-route")


def test_curl_nothing_listening_is_inconclusive(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    check = run_edge_check(DOMAIN, port, None)
    assert check.exit_code not in (0, 60) and check.status == "000"
    assert check.verdict.outcome == "inconclusive"


# -- rehearsals --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("admin-issuer-removal", STEP_REVOKE),
        ("admin-issuer-edge", STEP_UNINSTALL),
        ("admin-issuer-edge-cert", STEP_RERUN_K),
        ("nvcf-cli-no-proxy", STEP_TOKEN),
        ("admin-issuer-edge-host-header", STEP_RESOLVE),
    ],
)
def test_runs(name: str, fix: str, tmp_path: Path) -> None:
    right, wrong = RUNS[name]("right", tmp_path / "r"), RUNS[name]("wrong", tmp_path / "w")
    assert right.ok, right.summary()
    assert not wrong.ok and wrong.fix_step == fix and wrong.mistake
    assert (tmp_path / "r" / "runbooks" / "admin-issuer" / "tls" / "edge-ca.pem").is_file()


def test_removal_wrong_passes_the_edge_but_keeps_the_capability(tmp_path: Path) -> None:
    report = RUNS["admin-issuer-removal"]("wrong", tmp_path)
    assert report.end_state["edge"][0]["outcome"] == "no-route"  # the trap: the edge looks clean
    assert report.end_state["capability"] == "granted" and "still granted" in (report.mistake or "")


def test_cli_wrong_run_shows_the_bare_error(tmp_path: Path) -> None:
    report = RUNS["nvcf-cli-no-proxy"]("wrong", tmp_path)
    assert report.log_lines[0] == "Error: failed to generate admin token: API error 404:"
    assert RUNS["nvcf-cli-no-proxy"]("right", tmp_path).end_state["token_source"] == "NVCF_TOKEN"


def test_host_header_checks_the_certificate_against_the_address(gateway: tuple[Holder, int, Path]) -> None:
    _, port, ca = gateway
    wrong = run_edge_check(DOMAIN, port, ca, host_header=True)
    assert ("-H", f"Host: {HOST}") == wrong.command[wrong.command.index("-H") :][:2]
    assert (wrong.exit_code, wrong.status, wrong.verdict.outcome) == (60, "000", "certificate-mismatch")
