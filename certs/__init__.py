"""Stack CA, public-style CA, issuance profiles and Secret-shaped folders."""

from certs.profiles import (
    FRONTEND_SECRET,
    FRONTEND_SECRETS,
    GRPC_SECRET,
    INVOCATION_SECRET,
    PUBLIC,
    PUBLIC_FRONTEND_SECRET,
    STACK,
    Profile,
    frontend_profile,
    grpc_profile,
    invocation_profile,
    stack_profiles,
)
from certs.store import CaInfo, CertStore, describe_text
from certs.volume import load_secret, payload_dir, write_secret

__all__ = [
    "FRONTEND_SECRET",
    "FRONTEND_SECRETS",
    "GRPC_SECRET",
    "INVOCATION_SECRET",
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
    "stack_profiles",
    "write_secret",
]
