"""Entry points the command line (tasks/) calls for the k3d backend's extra tasks:
`ncpsim render --backend k3d --out DIR`, `ncpsim dns-rewrite ...` and `ncpsim doctor`."""

from __future__ import annotations

from pathlib import Path

from certs.store import CertStore
from clusters.certificates import with_stack_secret
from clusters.k3d.dnsrewrite import dns_rewrite as _dns_rewrite
from clusters.k3d.doctor import doctor as _doctor
from clusters.k3d.state import cert_material, stack_state, write_files
from clusters.render.bundle import render_bundle
from clusters.render.nats import one_server
from sim.model.topology import Topology
from sim.wire import PROXY_SERVICE_FQDN


def render(out_dir: str | Path, topology: Topology, scenario: str) -> int:
    """Write every k3d config, manifest and the Envoy config under `out_dir`; run nothing.

    Certificates come from the stack's state folder (created there if missing), so a later `up`
    applies the same Secrets. Manifest files hold private keys and are written owner-only.
    """
    certs = stack_state(topology.stack) / "certs"
    material = cert_material(certs, topology)
    topology, notice = one_server(with_stack_secret(CertStore(certs), topology))
    written = write_files(Path(out_dir), render_bundle(topology, material))
    for path in written:
        print(path)
    print(
        f"rendered {len(written)} files for scenario {scenario}; "
        "compute clusters point at the Topology's virtual load-balancer addresses "
        "until `up` fills in the live ones"
    )
    if notice:
        print(notice)
    return 0


def dns_rewrite(
    context: str,
    domain: str,
    proxy_service: str = PROXY_SERVICE_FQDN,
    dry_run: bool = False,
    assume_yes: bool = False,
    proxy_address: str | None = None,
) -> int:
    return _dns_rewrite(context, domain, proxy_service, dry_run, assume_yes, proxy_address=proxy_address)


def doctor(backend: str = "local") -> int:
    return _doctor(backend=backend)
