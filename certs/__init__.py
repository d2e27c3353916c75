"""Stack CA, public-style CA, private (corporate) CA, issuance profiles and Secret-shaped folders."""

from certs.profiles import (
    FRONTEND_SECRET,
    FRONTEND_SECRETS,
    GRPC_SECRET,
    INVOCATION_SECRET,
    PRIVATE,
    PUBLIC,
    PUBLIC_FRONTEND_SECRET,
    STACK,
    Profile,
    frontend_profile,
    grpc_profile,
    invocation_profile,
    secret_profile,
    stack_profiles,
)

# certs.store and certs.volume pull in trustme and cryptography (about 40 ms), which component processes
# importing only the profile constants never need: load them on first use.
_LAZY = {
    "CaInfo": "certs.store",
    "CertStore": "certs.store",
    "describe_text": "certs.store",
    "load_secret": "certs.volume",
    "payload_dir": "certs.volume",
    "write_secret": "certs.volume",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'certs' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = [
    "FRONTEND_SECRET",
    "FRONTEND_SECRETS",
    "GRPC_SECRET",
    "INVOCATION_SECRET",
    "PRIVATE",
    "PUBLIC",
    "PUBLIC_FRONTEND_SECRET",
    "STACK",
    "CaInfo",
    "CertStore",
    "Profile",
    "describe_text",
    "frontend_profile",
    "grpc_profile",
    "invocation_profile",
    "load_secret",
    "payload_dir",
    "secret_profile",
    "stack_profiles",
    "write_secret",
]
