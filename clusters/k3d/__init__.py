"""The k3d backend: real k3d clusters, a real Envoy worker callback proxy and a real CoreDNS rewrite,
rendered from the same Topology, values and proxy policy as the local backend (clusters.render) and
applied with `k3d`, `kubectl` and `docker` through one recording command runner."""
