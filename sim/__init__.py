"""What runs inside the simulated clusters, by what it is.

Packages (they point one way, top to bottom; dns/ and certs/ sit below all of them; pyproject's
import-linter contract "sim-layers" holds this order):
    proxy/      the worker callback proxy: pure route decisions, the HTTP/1.1 and HTTP/3 fronts, its log
    pods/       stand-in pods: invocation-service, grpc-proxy, nats-server and its auth callout, the DNS resolver
    worker/     worker-utils as function workers run it (HTTP and gRPC callbacks, its NATS sign-in and pulls)
    client/     the function client (pexec over HTTP, gRPC over h2c)
    runbooks/   control-plane runbooks, each model beside its rehearsals (no stack needed)
    runtime/    what every component process gets: its Context, the entry point, injected faults
    nats/       the NATS library: server config and process, the callout's decision, JWTs, subjects,
                work queues, the pods' publisher, the webhook, the client, the cluster's catch-up
    protocols/  HTTP/1.1 (h11), HTTP/3 (aioquic), TLS, gRPC tunnel and request-attach framing
    model/      the Topology, the values, the network map and events (the state folder's formats)
    wire.py     the names, ports, paths and words every party agrees on (imports nothing)
    errors.py   the user-facing error tree

Vocabulary (as the seeds use it):
    pod target      the URL a worker is handed for its pod: http://<dashed-pod-ip>.invocation.nvcf.svc.cluster.local:8443
    dashed pod IP   10.42.0.17 written 10-42-0-17, the first label of every per-pod name
    workerDomain    workerCallbackProxy.workerDomain: *.<workerDomain> resolves to the proxy from compute clusters
    frontend        the proxy's side that workers reach (TLS on TCP 10084, QUIC on UDP 443), *.<workerDomain>
    upstream        the proxy's side towards the pods (TLS to 8443 or plaintext 8080; QUIC to UDP 10084)
    component       one process of a stack (a pod, the proxy, the resolver, nats-server, one cluster's workers)
"""
