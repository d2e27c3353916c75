"""For the support engineer and the operator: diagnose a customer's values, check a laptop, fix a cluster's DNS."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from invoke import Exit

from tasks.cli import EXIT_FAILED, ncpsim_task, out_file, user_errors


@ncpsim_task(
    help={
        "context": "kubectl context of the compute cluster",
        "domain": "workerCallbackProxy.workerDomain",
        "proxy_service": "NAME (namespace nvcf), NAME.NS.svc.cluster.local, or a DNS name",
        "proxy_address": "proxy load-balancer IP, when the Service must be created",
        "dry_run": "print what would be applied",
        "yes": "switch the kubectl context without asking",
    }
)
@user_errors
def dns_rewrite(
    c, context, domain, proxy_service="worker-callback-proxy", proxy_address=None, dry_run=False, yes=False
):
    """Add the *.<workerDomain> CoreDNS rewrite (and the proxy's selectorless Service) to a compute cluster."""
    from clusters.k3d.tasks import dns_rewrite as run

    raise Exit(code=run(context, domain, proxy_service, dry_run, yes, proxy_address))


@ncpsim_task(help={"backend": "the backend whose readiness sets the exit code: local (default), k3d or all"})
@user_errors
def doctor(c, backend="local"):
    """What this laptop has and lacks for each backend (local, k3d) and the tests' clients, with each fix.

    Exit 1 when the chosen backend is not ready; a missing client or peer only skips what needs it.
    """
    from clusters.k3d.tasks import doctor as run
    from sim.errors import ConfigError

    if backend not in ("local", "k3d", "all"):
        raise ConfigError(f"--backend {backend!r}: choose local, k3d or all")
    raise Exit(code=run(backend))


@ncpsim_task
@user_errors
def collect_script(c):
    """Print the read-only kubectl/helm script a customer runs to collect a support bundle for diagnose --bundle."""
    from scenarios.bundle import COLLECTOR

    print(COLLECTOR.read_text(), end="")


@ncpsim_task(
    help={
        "file": "a customer's values file (repeat: later files win)",
        "set": "key.path=value (repeatable)",
        "symptom": "what a worker or client logged, e.g. 'x509: certificate signed by unknown authority'",
        "workers": "probe workers as VERSION:TRUST,..., e.g. 1.2.9:system,1.4.0:stack",
        "json": "print the findings as JSON",
        "write_ticket": "write a scenario that reproduces the findings and fixes them (values, Secrets beside it)",
        "rewrite": "what the compute cluster's DNS holds: DOMAIN=TARGET (proxy, none or an IPv4 address)",
        "secret": "NAME=DIR: the customer's Secret NAME (tls.crt, tls.key[, ca.crt]) as they have it",
        "bundle": "a support bundle (folder or .tar.gz from collect-script): the customer's world as collected",
        "ticket_id": "the ticket's id (e.g. SUP-1234), in the written scenario's name and ticket field",
    },
    iterable=["file", "set", "secret"],
)
@user_errors
def diagnose(
    c,
    file=None,
    set=None,
    symptom=None,
    workers=None,
    json_=False,
    write_ticket=None,
    rewrite=None,
    secret=None,
    bundle=None,
    ticket_id=None,
):
    """Bring the customer's values up on the local backend, probe them, and rank the documented causes.

    On a terminal a live line on stderr says which probe runs. Ctrl-C or SIGTERM stops every probe stack
    started so far (exit 130), as `ncpsim up` does.
    """
    from clusters.interrupts import InterruptGuard

    guard = InterruptGuard()  # the command's one: SIGTERM as Ctrl-C, the probe stacks and the scratch go
    with guard.installed():
        _diagnose(file, set, symptom, workers, json_, write_ticket, rewrite, secret, bundle, ticket_id, guard)


def _diagnose(file, set, symptom, workers, json_, write_ticket, rewrite, secret, bundle, ticket_id, guard):
    from scenarios.diagnose.assemble import write_ticket as write
    from scenarios.diagnose.diagnosis import diagnose as run
    from scenarios.diagnose.report import text
    from scenarios.diagnose.ticket import check_new
    from sim.errors import ConfigError

    if not file and not set and not bundle:
        raise ConfigError(
            "give the customer's values or bundle: ncpsim diagnose -f values.yaml | --bundle B [--symptom TEXT]"
        )
    if write_ticket:  # checked first: no diagnosis runs only to find its ticket cannot be written
        check_new(out_file("--write-ticket", write_ticket))
    found = run(
        [Path(f) for f in file or []],
        set or [],
        symptom,
        workers,
        rewrite=rewrite,
        secrets=secret or [],
        bundle=Path(bundle) if bundle else None,
        progress=sys.stderr,
        guard=guard,
    )
    print(json.dumps(found.to_json(), indent=2) if json_ else text(found))
    if write_ticket and found.findings:
        written = write(found, Path(write_ticket), ticket_id)
        print(
            f"ticket: {written[0]} (values: {written[1]}); replay it: ncpsim replay scenario={written[0]}",
            file=sys.stderr if json_ else sys.stdout,
        )
    if found.findings:
        raise Exit(code=EXIT_FAILED)
