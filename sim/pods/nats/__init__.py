"""The stack's two NATS pods: nats-server under its supervisor (component), and the auth callout service
with the NVCF API's stand-in beside it (callout_component, api). The NATS library they run is sim.nats."""
