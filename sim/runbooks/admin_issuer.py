"""Admin Issuer Proxy: the pure core of its install state, its OpenBao grant, the admin JWT it returns,
the gateway's routing decision, nvcf-cli's token handling and the edge check's reading.

The proxy does not authenticate callers; ``POST /v1/admin/keys`` returns a 12-hour admin JWT signed by
OpenBao as the NVCF API's in-cluster issuer. OpenBao state is not owned by the Helm release, which is why
removal is two steps and ``removal_check`` looks at both.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from sim.errors import ConfigError
from sim.model.values_check import validate

NAMESPACE = "api-keys"
RELEASE = "admin-issuer-proxy"
KEYS_PATH = "/v1/admin/keys"
AUTH_ROLE = "auth/jwt/role/admin-issuer-proxy"
POLICY = "sys/policies/acl/services-admin-issuer-proxy-jwt-sign-admin-issuer-proxy-rw"
SECRET_ROLE = "services/nvcf-api/jwt/roles/admin-issuer-proxy"
GRANT = (AUTH_ROLE, POLICY, SECRET_ROLE)
CHART_KINDS = ("Deployment", "Service", "ServiceAccount", "HTTPRoute", "ReferenceGrant")
TOKEN_LIFETIME = 12 * 3600
# The seed names the scope families; the exact scope strings are the simulation's.
ADMIN_SCOPES = ("function", "secret", "registry-credential", "cluster-group:list", "cluster:manage")
ISSUER = "nvcf-api-in-cluster-issuer (OpenBao services/nvcf-api/jwt)"


def keys_host(domain: str) -> str:
    return f"api-keys.{domain}"


# -- install state -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plane:
    """What exists: the chart's objects (by kind) and the OpenBao objects of the grant."""

    release: frozenset[str] = frozenset()
    bao: frozenset[str] = frozenset()

    @property
    def route_attached(self) -> bool:
        return "HTTPRoute" in self.release

    @property
    def serving(self) -> bool:
        return "Deployment" in self.release and "Service" in self.release

    def can_sign(self) -> bool:
        """A pod running as the proxy's service account can authenticate and sign admin tokens."""
        return set(GRANT) <= self.bao


def _flags(values: Mapping[str, Any]) -> tuple[bool, bool]:
    issues = [i for i in validate(values) if i.path.startswith("adminIssuerProxy")]
    if issues:
        raise ConfigError(str(issues[0]))
    section = values.get("adminIssuerProxy", {}) or {}
    return section.get("enabled", True), (section.get("gateway", {}) or {}).get("enabled", True)


def sync(plane: Plane, values: Mapping[str, Any], pdb: bool = False) -> Plane:
    """Helmfile sync. ``enabled: false`` stops managing the release and skips the OpenBao migration, but
    removes nothing that already exists. ``gateway.enabled: false`` drops only the HTTPRoute."""
    enabled, gateway = _flags(values)
    if not enabled:
        return plane
    kinds = set(CHART_KINDS) | ({"PodDisruptionBudget"} if pdb else set())
    if not gateway:
        kinds.discard("HTTPRoute")
    # Re-enabling needs nothing by hand: the migration (10_setup_admin-issuer.sh) recreates the grant.
    return Plane(frozenset(kinds), plane.bao | set(GRANT))


def helm_uninstall(plane: Plane) -> Plane:
    return replace(plane, release=frozenset())


def bao_delete(plane: Plane, path: str) -> Plane:
    return replace(plane, bao=plane.bao - {path})


@dataclass(frozen=True)
class RemovalCheck:
    release_left: tuple[str, ...]
    grant_left: tuple[str, ...]

    @property
    def capability(self) -> str:
        if not self.grant_left:
            return "withdrawn"
        return "granted" if len(self.grant_left) == len(GRANT) else "partly revoked"

    @property
    def removed(self) -> bool:
        return not self.release_left and not self.grant_left


def removal_check(plane: Plane) -> RemovalCheck:
    """The runbook's two verifications: nothing of the chart left, and the three OpenBao objects gone."""
    return RemovalCheck(tuple(sorted(plane.release)), tuple(p for p in GRANT if p in plane.bao))


# -- the admin JWT -----------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SigningDenied(PermissionError):
    """OpenBao refuses: the grant the proxy signs with is gone."""


@dataclass(frozen=True)
class Issuer:
    """The simulated OpenBao JWT secrets engine signing for the NVCF API issuer (EdDSA)."""

    key: Ed25519PrivateKey

    @classmethod
    def generate(cls, rng: random.Random) -> Issuer:
        return cls(Ed25519PrivateKey.from_private_bytes(rng.randbytes(32)))

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.key.public_key()

    def mint_admin(self, plane: Plane, now: float) -> str:
        if not plane.can_sign():
            raise SigningDenied("permission denied")
        header = {"alg": "EdDSA", "typ": "JWT", "kid": "nvcf-api"}
        claims = {
            "iss": ISSUER,
            "sub": f"system:serviceaccount:{NAMESPACE}:{RELEASE}",
            "aud": "nvcf-api",
            "iat": int(now),
            "exp": int(now) + TOKEN_LIFETIME,
            "scopes": list(ADMIN_SCOPES),
        }
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        return f"{signing_input}.{_b64(self.key.sign(signing_input.encode()))}"


def verify_admin(token: str, public_key: Ed25519PublicKey, now: float) -> dict[str, Any]:
    """The claims of a valid, unexpired admin token; ValueError says why not."""
    try:
        head, body, signature = token.split(".")
        public_key.verify(_unb64(signature), f"{head}.{body}".encode())
        claims: dict[str, Any] = json.loads(_unb64(body))
    except (ValueError, InvalidSignature) as exc:
        raise ValueError(f"invalid token: {type(exc).__name__}") from None
    if now >= claims["exp"]:
        raise ValueError("token expired")
    return claims


# -- the gateway's decision ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = ""


def gateway_reply(
    plane: Plane,
    issuer: Issuer,
    domain: str,
    host: str,
    method: str,
    path: str,
    now: float,
    in_cluster: bool = False,
) -> Reply:
    """The shared Gateway (edge) or the in-cluster Service. An unrouted host gets 404 with an empty body."""
    reachable = plane.serving and (in_cluster or (plane.route_attached and host == keys_host(domain)))
    if not reachable or path.split("?")[0] != KEYS_PATH:
        return Reply(404)
    if method != "POST":
        return Reply(405, b"method not allowed\n", "text/plain")
    try:
        token = issuer.mint_admin(plane, now)
    except SigningDenied:
        return Reply(500, b'{"error":"failed to sign admin token: permission denied"}', "application/json")
    body = json.dumps({"token": token, "expiresIn": TOKEN_LIFETIME}).encode()
    return Reply(200, body, "application/json")


# -- nvcf-cli ------------------------------------------------------------------------------------------
CONFIG_FILE = ".nvcf-cli.yaml"
STATE_FILE = ".nvcf-cli/state.json"  # where the simulated ``init`` writes; the real path is the CLI's


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str = ""
    stderr: str = ""


def usage(command: str) -> str:
    return f"Usage:\n  nvcf-cli {command} [flags]\n\nFlags:\n  -h, --help   help for {command}\n"


def cli_generate(command: str, status: int, body: bytes, home: Path) -> CliResult:
    """``init`` and ``refresh``: both call POST /v1/admin/keys (generateAdminTokenViaAPI)."""
    if status != 200:
        # The gateway's empty body makes the message bare, and Cobra then prints usage as if mistyped.
        message = f"failed to generate admin token: API error {status}: {body.decode(errors='replace')}"
        return CliResult(1, "", f"Error: {message.rstrip()}\n{usage(command)}")
    token = json.loads(body)["token"]
    state = home / STATE_FILE
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"token": token}))
    return CliResult(0, f"admin token written to {state}\n")


def resolve_token(env: Mapping[str, str], home: Path) -> tuple[str, str] | None:
    """(token, source): NVCF_TOKEN, then ~/.nvcf-cli.yaml, then the state file init writes."""
    if env.get("NVCF_TOKEN"):
        return env["NVCF_TOKEN"], "NVCF_TOKEN"
    config = home / CONFIG_FILE
    if config.is_file():
        token = (yaml.safe_load(config.read_text()) or {}).get("token")
        if token:
            return str(token), str(config)
    state = home / STATE_FILE
    if state.is_file():
        token = json.loads(state.read_text()).get("token")
        if token:
            return str(token), str(state)
    return None


# -- reading the edge check ----------------------------------------------------------------------------
@dataclass(frozen=True)
class EdgeVerdict:
    outcome: str  # no-route | served | certificate-mismatch | inconclusive
    passed: bool
    advice: str


def interpret_edge(exit_code: int, status: str) -> EdgeVerdict:
    """Read curl's exit code and printed status together, as the runbook says."""
    if exit_code == 0 and status == "404":
        return EdgeVerdict("no-route", True, "no route is attached: the outcome you want")
    if exit_code == 0:
        return EdgeVerdict("served", False, f"status {status}: the route is still being served")
    if exit_code == 60:
        return EdgeVerdict(
            "certificate-mismatch",
            False,
            "the edge presents a certificate that does not cover this hostname; re-run with "
            "-k to read the routing result (-k says nothing about whether the edge's TLS is "
            "sound)",
        )
    return EdgeVerdict(
        "inconclusive",
        False,
        f"curl exit {exit_code}, status {status}: the request never reached the Gateway",
    )
