"""The local backend: the Topology as processes on 127.0.0.1, each in its own process group."""

from clusters.local.stack import LocalBackend, LocalStack

__all__ = ["LocalBackend", "LocalStack"]
