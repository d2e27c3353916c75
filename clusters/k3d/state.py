"""The k3d backend's files on the laptop: certificates issued into the stack's state folder (the same
CertStore the local backend uses) and the rendered configs and manifests written beside them."""

from __future__ import annotations

import os
from pathlib import Path

from certs.profiles import stack_profiles
from certs.store import CertStore
from certs.volume import load_secret
from clusters.certificates import prepare_certificates
from clusters.render.bundle import RenderedFile
from clusters.render.control_plane import CertMaterial
from clusters.state import state_dir
from sim.model.topology import Topology
from sim.model.values import proxy_settings

RENDER_DIR = "rendered"  # <state>/rendered/: what `up` applied, for reading and re-applying by hand


def stack_state(stack: str) -> Path:
    return state_dir(stack)


def cert_material(certs_dir: Path, topology: Topology) -> CertMaterial:
    """Issue what is missing (keeping what exists, so workers' trust survives a second `up`), place the
    Secrets the scenario declares or the user brought (clusters.certificates), and read them all."""
    store = CertStore(certs_dir)
    prepare_certificates(store, topology)
    names = [p.secret for p in stack_profiles(topology.worker_domain)]
    names += [proxy_settings(topology.values).frontend_secret, *(s.name for s in topology.secrets)]
    secrets = {name: load_secret(store.secret_dir(name)) for name in dict.fromkeys(names)}
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
