"""Negative controls on the proxy's upstream leg: the pod certificate check must be real."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
from stack_records import Records

from certs.profiles import INVOCATION_SECRET, Profile
from certs.store import CertStore, load_secret, write_secret
from clusters.local import LocalBackend, LocalStack
from scenarios.engine import run_scenario
from scenarios.load import load_scenario

WD = "grpc-worker.example.com"
ATTACH = "/v2/nvcf/worker/request-attach"


@pytest.fixture
def stack(tmp_path) -> Iterator[LocalStack]:
    stack = LocalStack("neg-upstream", root=tmp_path)
    try:
        result = run_scenario(load_scenario("http-callback"), LocalBackend(stack.root), stack.name, keep=True)
        assert result.ok, result.failures
        yield stack
    finally:
        stack.down()
        assert not stack.launcher.running()


def curl_code(stack: LocalStack, pod: str) -> str:
    port = stack.status()["proxy"]["http"]["port"]
    out = subprocess.run(
        [
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            "--proxy",
            f"https://invocation.{WD}:{port}",
            "--proxy-cacert",
            stack.status()["ca"]["stack"],
            "--resolve",
            f"invocation.{WD}:{port}:127.0.0.1",
            f"http://{pod}:8443{ATTACH}",
        ],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return out.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is the real client here")
@pytest.mark.parametrize(
    ("issuer", "names", "why"),
    [
        ("public", ("*.invocation.nvcf.svc.cluster.local",), "another CA"),
        ("stack", ("*.wrong.nvcf.svc.cluster.local",), "wrong name"),
    ],
)
def test_pod_certificate_from_another_ca_or_for_another_name_gives_503_uf(
    stack, issuer: str, names: tuple, why: str
) -> None:
    pod = "10-42-0-11.invocation.nvcf.svc.cluster.local"
    assert curl_code(stack, pod) == "401"  # control: the pod answers while its certificate is right
    store = CertStore(stack.state_dir / "certs")
    scratch = store.issue(Profile("scratch", names, issuer))
    crt, key, _ = load_secret(scratch)
    # The pod now serves that certificate while the Secret's ca.crt (what the proxy trusts) stays the stack CA.
    write_secret(store.secret_dir(INVOCATION_SECRET), crt, key, store.ca_path("stack").read_bytes())
    records = Records(stack.state_dir)
    assert curl_code(stack, pod) == "503", why
    line = records.access_line(method="GET", path=ATTACH, authority=f"{pod}:8443")
    assert (line["status"], line["flags"]) == ("503", "UF")
    failed = records.event("proxy.upstream.failed", requestId=line["request_id"])
    assert "CERTIFICATE_VERIFY_FAILED" in failed["detail"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is the real client here")
def test_pod_ip_with_no_pod_gives_503_df(stack) -> None:
    """A well-formed pod name that resolves nowhere: Envoy's dynamic forward proxy answers 503 DF."""
    records = Records(stack.state_dir)
    assert curl_code(stack, "10-42-0-99.invocation.nvcf.svc.cluster.local") == "503"
    line = records.access_line(method="GET", path=ATTACH)
    assert (line["status"], line["flags"]) == ("503", "DF")
