"""What a name must be before it reaches a certificate or a folder: a Secret's name, a certificate's SAN.

Pure. Both come from users (a scenario's `topology.secrets`, `--secret NAME=DIR`, `existingSecret`, a
`pod-cert` fault's names), and both used to fail late, deep inside: a Secret name is a folder under
`certs/secrets/` (`..` climbed out of it, 300 characters were `File name too long`), and trustme encodes a
SAN with idna, which raised `IDNAError: Label too long` halfway through a replay. Checked here first, the
user gets one line naming the value and the rule.
"""

from __future__ import annotations

import ipaddress
import re

import idna

# Kubernetes' rule for a Secret's name (a DNS subdomain, RFC 1123): its own regex, and 253 at most.
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
SECRET_NAME_MAX = 253
MAX_DNS_NAME = 253  # RFC 1035: the name, without its trailing dot, in presentation form


def secret_name_problem(name: str) -> str | None:
    """Why `name` cannot name a Secret (in Kubernetes' words), or None."""
    if len(name) > SECRET_NAME_MAX:
        return f"must be no more than {SECRET_NAME_MAX} characters (Kubernetes' limit for a Secret name)"
    if not SECRET_NAME.fullmatch(name):
        return (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'example.com')"
        )
    return None


def certificate_name_problem(name: str) -> str | None:
    """Why `name` cannot be a certificate's name as trustme issues it (an IP address, or a DNS name with at
    most a leading `*.`, IDNA-encodable), or None."""
    try:
        ipaddress.ip_address(name)
        return None
    except ValueError:
        pass
    rest = name.removeprefix("*.")
    try:
        encoded = idna.encode(rest, uts46=True)
    except idna.IDNAError as exc:  # "Label too long", "Codepoint U+0020 at position 2 of 'a b' not allowed"
        return f"is not a DNS name a certificate can carry: {exc}"
    if len(encoded) + len(name) - len(rest) > MAX_DNS_NAME:
        return f"is longer than {MAX_DNS_NAME} characters"
    return None
