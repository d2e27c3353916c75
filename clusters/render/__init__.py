"""Pure renderers for the k3d backend: Topology, values and the proxy policy in, plain dicts out.

Nothing here runs a command or touches the network; `clusters.k3d` writes what these return and
applies it. Keeping them pure is what lets the tests validate every object without Docker.
"""
