"""The k3d backend's files on the laptop: certificates issued into the stack's state folder (the same
CertStore the local backend uses) and the rendered configs and manifests written beside them."""

from __future__ import annotations

import os
from pathlib import Path

from certs.profiles import frontend_profile, stack_profiles
from certs.store import CertStore
from certs.volume import load_secret
from clusters.render.bundle import RenderedFile
from clusters.render.control_plane import CertMaterial
from clusters.stack import state_dir
from sim.model.topology import Topology
from sim.model.values import proxy_settings

RENDER_DIR = "rendered"  # <state>/rendered/: what `up` applied, for reading and re-applying by hand


def stack_state(stack: str) -> Path:
    return state_dir(stack)


def cert_material(certs_dir: Path, topology: Topology) -> CertMaterial:
    """Issue what is missing (keeping what exists, so workers' trust survives a second `up`) and read it."""
    store = CertStore(certs_dir)
    store.ensure_cas()
    settings = proxy_settings(topology.values)
    profiles = stack_profiles(topology.worker_domain)
    if settings.frontend_secret not in {p.secret for p in profiles}:
        # A customer's existingSecret name: the simulation issues the public-style frontend into it.
        profiles.append(
            frontend_profile(
                topology.worker_domain, settings.frontend_issuer, secret=settings.frontend_secret
            )
        )
    for profile in profiles:
        if not (store.secret_dir(profile.secret) / "tls.crt").exists():
            store.issue(profile)
    secrets = {p.secret: load_secret(store.secret_dir(p.secret)) for p in profiles}
    return CertMaterial(
        secrets=secrets,
        stack_ca=store.ca_path("stack").read_bytes(),
        public_ca=store.ca_path("public").read_bytes(),
    )


def write_files(out_dir: Path, files: dict[str, RenderedFile]) -> list[Path]:
    """Write each file (private ones owner-only, created that way rather than chmod-ed after)."""
    written = []
    for relative, rendered in sorted(files.items()):
        path = Path(out_dir) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o600 if rendered.private else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(rendered.text)
        written.append(path)
    return written
