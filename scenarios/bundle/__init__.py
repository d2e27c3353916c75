"""Support bundles: what the customer's clusters hold, collected read-only and read back into the model.

DESIGN.md section 5 fixes the layout; collect.sh (shipped beside this file, printed by `ncpsim
collect-script`) writes it, each file the output of one named command:

    meta.yaml                          collector version, time, contexts, every failed command
    environment.yaml                   the helmfile environment file (what `-f` takes)
    control-plane/services.yaml        kubectl get svc -n nvcf -o yaml
    control-plane/secrets.yaml         the kubernetes.io/tls Secrets the values name, private keys removed
    control-plane/logs/<name>.log      the proxy's and the NATS auth callout's logs
    compute/<context>/coredns.yaml     the coredns and coredns-custom ConfigMaps
    compute/<context>/pods.yaml        the function pods, NVCF_PROXY_CA_PEM as a SHA-256 only

A bundle is untrusted input: archive.py reads a folder or a .tar.gz within bounds, into memory, writing
nothing; corefile.py parses CoreDNS configuration and resolve.py answers names as CoreDNS would (pure);
world.py turns the files into facts, each with the bundle file and line it came from; records.py writes
each compute cluster's DNS as the DNS model's records, scenario.py the rest of the world a replay needs.
"""

from __future__ import annotations

from pathlib import Path

COLLECTOR = Path(__file__).with_name("collect.sh")
