"""The support-bundle collector (scenarios/bundle/collect.sh) against stand-in `kubectl` and `helm`
(tests/fakebin/cluster.py): the layout of DESIGN.md section 5, read-only commands, and nothing private in
the archive: no private key (planted in the Secret's data and in its last-applied annotation), no
NVCF_PROXY_CA_PEM value (planted as a literal block and as a quoted string), only its SHA-256."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import trustme
import yaml
from bundle_support import COMPUTE, CP, DOMAIN, FAKEBIN, Install, collect
from cli_support import ncpsim

from scenarios.bundle import COLLECTOR

VALUES = {
    "workerCallbackProxy": {"enabled": True, "workerDomain": DOMAIN, "service": {"type": "LoadBalancer"}}
}
LAYOUT = {
    "meta.yaml",
    "environment.yaml",
    "control-plane/services.yaml",
    "control-plane/secrets.yaml",
    "control-plane/logs/worker-callback-proxy.log",
    "control-plane/logs/nats-auth-callout-service.log",
    "compute/arn_aws_eks_us-east-1_1234_cluster_gpu-1/coredns.yaml",
    "compute/arn_aws_eks_us-east-1_1234_cluster_gpu-1/pods.yaml",
}
READS = {
    ("kubectl", "get"),
    ("kubectl", "logs"),
    ("kubectl", "version"),
    ("helm", "version"),
    ("helm", "list"),
}


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def pem_body_lines(pem: bytes) -> list[bytes]:
    """The lines of a PEM block that are its secret, not its armour."""
    return [line for line in pem.splitlines() if line and not line.startswith(b"-----")]


def printed(install: Install) -> list[bytes]:
    """The private key and the pods' PEM value as kubectl prints them (base64 in a Secret's data and its
    last-applied annotation; the PEM's own lines in the pod's env)."""
    return [base64.b64encode(install.planted_key), *pem_body_lines((install.pod_pem or "").encode())]


def planted(install: Install) -> list[bytes]:
    """Every form a leak could take: as printed, and decoded or encoded once more."""
    pem = (install.pod_pem or "").encode()
    return [
        *printed(install),
        *pem_body_lines(install.planted_key),
        *([base64.b64encode(pem)] if pem else []),
    ]


def test_the_bundle_has_the_layout_and_only_read_commands_ran(tmp_path: Path) -> None:
    install = Install(VALUES, custom_dns=None)  # no coredns-custom: a failed command, recorded
    archive, log = collect(tmp_path, install)
    files = members(archive)
    assert set(files) == LAYOUT
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    verbs = {
        (c[0], next(w for w in c[1:] if not w.startswith("-") and w not in (CP, COMPUTE))) for c in calls
    }
    assert verbs <= READS, verbs
    meta = yaml.safe_load(files["meta.yaml"])
    assert meta["controlPlane"]["context"] == CP and meta["compute"][0]["context"] == COMPUTE
    failed = {f["file"]: f for f in meta["failed"]}
    assert "coredns-custom" in failed[LAYOUT_COREDNS]["error"] and failed[LAYOUT_COREDNS]["exit"] == 1
    assert "kubectl --context" in failed[LAYOUT_COREDNS]["command"]
    assert yaml.safe_load(files["environment.yaml"]) == VALUES
    assert yaml.safe_load(files["control-plane/services.yaml"])["items"][0]["spec"]["type"] == "LoadBalancer"


LAYOUT_COREDNS = "compute/arn_aws_eks_us-east-1_1234_cluster_gpu-1/coredns.yaml"
PODS = "compute/arn_aws_eks_us-east-1_1234_cluster_gpu-1/pods.yaml"


def test_no_private_key_and_no_pem_value_reaches_the_archive(tmp_path: Path) -> None:
    pem = trustme.CA(organization_name="stale CA").cert_pem.bytes().decode()
    install = Install(VALUES, pod_pem=pem)
    archive, _ = collect(tmp_path, install)
    blob = archive.read_bytes()
    files = members(archive)
    everything = b"\n".join(files.values())
    for form in planted(install):
        assert form not in everything, form[:40]
    assert b"PRIVATE KEY" not in everything and b"last-applied-configuration" not in everything
    # what may leave does: the public certificate, and the PEM's SHA-256 in place of its value
    secret = yaml.safe_load(files["control-plane/secrets.yaml"])["items"][0]
    assert set(secret["data"]) == {"tls.crt", "ca.crt"}
    digest = hashlib.sha256(pem.encode()).hexdigest()
    assert f"value: sha256:{digest}".encode() in files[PODS]
    assert blob.startswith(b"\x1f\x8b")  # gzip


def test_the_planted_secrets_are_in_what_kubectl_prints(tmp_path: Path) -> None:
    """Negative control: the stand-in kubectl prints the key and the PEM, so the filters are what keep
    them out of the bundle."""
    pem = trustme.CA().cert_pem.bytes().decode()
    install = Install(VALUES, pod_pem=pem)
    world = tmp_path / "cluster.json"
    world.write_text(json.dumps(install.cluster()))
    sys.path.insert(0, str(FAKEBIN))
    try:
        import fake
    finally:
        sys.path.remove(str(FAKEBIN))
    bin_dir = fake.install(tmp_path / "bin", ("kubectl",))
    env = {
        "NCPSIM_FAKE_CLUSTER": str(world),
        "NCPSIM_FAKE_LOG": str(tmp_path / "log"),
        "PATH": "/usr/bin:/bin",
    }
    raw = b""
    for args in (
        ["--context", CP, "get", "secret", "worker-callback-proxy-frontend-tls", "-n", "nvcf", "-o", "yaml"],
        [
            "--context",
            COMPUTE,
            "get",
            "pods",
            "-A",
            "-l",
            "nvcf.nvidia.com/function-version-id",
            "-o",
            "yaml",
        ],
    ):
        raw += subprocess.run(
            [str(bin_dir / "kubectl"), *args], env=env, capture_output=True, check=True
        ).stdout
    assert all(form in raw for form in printed(install))


def test_a_pem_written_as_a_quoted_string_is_removed_too(tmp_path: Path) -> None:
    """kubectl may print the value double-quoted (a line break as \\n): still hashed, never copied."""
    pem = trustme.CA().cert_pem.bytes().decode()
    install = Install(VALUES, pod_pem=pem + " ")  # a trailing space: go-yaml cannot use a literal block
    archive, _ = collect(tmp_path, install)
    everything = b"\n".join(members(archive).values())
    assert not any(line in everything for line in pem_body_lines(pem.encode()))
    digest = hashlib.sha256((pem + " ").encode()).hexdigest()
    assert f"sha256:{digest}".encode() in everything


def test_collect_script_prints_the_shipped_collector(tmp_path: Path) -> None:
    done = ncpsim("collect-script", home=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == COLLECTOR.read_text()
    script = tmp_path / "collect.sh"
    script.write_text(done.stdout)
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
