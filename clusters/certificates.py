"""The certificates a stack holds before its pods start, whatever backend runs it.

The CAs (stack, public-style, private), the stack's own Secrets, and the frontend Secret the values name:
an `existingSecret` is what the user brought (`ncpsim up --secret NAME=DIR`, used as it is), what the
scenario declares (`topology.secrets.NAME`), or, undeclared, a stand-in certificate from the public-style
CA (the seed's reason to bring one), which sim.model.assumptions names as an assumption wherever the
stack is shown. The values are then applied: a workerCallbackCaPem marker becomes PEM text.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from certs import inspect
from certs.profiles import PUBLIC, Profile, secret_profile, stack_profiles
from certs.store import CertStore
from certs.volume import CA, CRT, KEY, load_secret, write_secret
from sim.errors import ConfigError
from sim.model.assumptions import frontend_stand_in
from sim.model.parts import SecretSpec
from sim.model.topology import Topology
from sim.model.untrusted import read_bytes

PEM_LIMIT = 1 << 20  # a chain of certificates is a few KiB


def prepare_certificates(store: CertStore, topology: Topology) -> Topology:
    """Issue what is missing, place every declared or brought Secret; the topology with its values applied
    and the stack's own secret (OS randomness, once per stack: every NATS key derives from it)."""
    topology = with_stack_secret(store, topology)
    store.ensure_cas()
    own = stack_profiles(topology.worker_domain)
    for profile in own:
        if not _still_valid(store, profile):
            store.issue(profile)
    for spec in topology.secrets:
        place_secret(store, spec, topology.worker_domain)
    stand_in = frontend_stand_in(topology)
    if stand_in is not None and stand_in not in {profile.secret for profile in own}:
        undeclared = secret_profile(stand_in, topology.worker_domain, PUBLIC)
        if not _still_valid(store, undeclared):
            store.issue(undeclared)
    return topology.with_ca_pem(lambda issuer: store.ca_path(issuer).read_text())


def with_stack_secret(store: CertStore, topology: Topology) -> Topology:
    """The topology carrying the stack's own secret (every NATS key derives from it: sim.nats.stack)."""
    return replace(topology, secret=store.stack_secret())


def _still_valid(store: CertStore, profile: Profile) -> bool:
    """The Secret already holds what `profile` describes, from its CA and unexpired: kept across runs (the
    state folder outlives a stack). What a fault, a declaration or a brought folder of an earlier run left
    there is replaced, so it cannot leak into this one."""
    try:
        crt = load_secret(store.secret_dir(profile.secret))[0]
    except OSError:
        return False
    return (
        inspect.issued_by(crt, store.ca_path(profile.issuer).read_bytes())
        and tuple(inspect.sans(crt)) == profile.identities
        and inspect.not_after(crt) > datetime.now(UTC)
    )


def place_secret(store: CertStore, spec: SecretSpec, worker_domain: str) -> Path:
    """A brought folder copied as it is, or a declared certificate issued (again: declarations may change)."""
    if spec.source is not None:
        crt, key, ca = read_brought(Path(spec.source), spec.name)
        return write_secret(store.secret_dir(spec.name), crt, key, ca)
    window: dict[str, datetime] = {}
    if spec.expired:
        now = datetime.now(UTC)
        window = {"not_before": now - timedelta(days=30), "not_after": now - timedelta(days=1)}
    return store.issue(secret_profile(spec.name, worker_domain, spec.issuer, spec.names), **window)


def read_brought(folder: Path, name: str) -> tuple[bytes, bytes, bytes]:
    """tls.crt, tls.key and (optional) ca.crt from a user's folder, as `kubectl create secret tls` takes."""
    missing = [f for f in (CRT, KEY) if not (folder / f).is_file()]
    if missing:
        raise ConfigError(
            f"--secret {name}={folder}: no {' or '.join(missing)} in that folder "
            f"(a kubernetes.io/tls Secret needs {CRT} and {KEY}; {CA} is optional)"
        )
    # The customer's files: bounded reads (a planted 10 GB file or a FIFO named tls.crt is one line).
    what = f"--secret {name} file"
    ca = read_bytes(folder / CA, what, PEM_LIMIT) if (folder / CA).is_file() else b""
    return read_bytes(folder / CRT, what, PEM_LIMIT), read_bytes(folder / KEY, what, PEM_LIMIT), ca
