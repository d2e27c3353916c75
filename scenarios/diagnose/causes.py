"""The documented causes of failed callbacks, each with its seed section and its fix (pure data).

Sections are named by their titles in seeds/worker-callback-proxy.md ("WCP") and
seeds/control-plane-operations.md ("CPO"), so a finding points at the text a support engineer reads.
"""

from __future__ import annotations

from dataclasses import dataclass

WCP = "worker-callback-proxy.md"
CPO = "control-plane-operations.md"


@dataclass(frozen=True)
class Cause:
    id: str
    title: str
    severity: str  # "error": callbacks fail; "warning": a trap that fails later or for some workers
    section: str  # seed file and section title
    fix: str  # the values key and the runbook step


# Most blocking first, in the order a callback meets them: nothing deploys, no worker signs in to NATS,
# no proxy, the name does not resolve, the address is not reachable, TLS to the proxy fails, the proxy's
# routing, the pod behind it. Two findings are ranked by this; a finding blocks the ones after it.
BLOCKING = (
    "values-refused",
    "split-plane-url",
    "invocation-proxy-url",
    "nats-auth-mode",
    "callout-webhook-empty",
    "pod-annotations",
    "nats-auth-rejected",
    "nats-account-not-read",
    "proxy-disabled",
    "rewrite-wrong-domain",
    "rewrite-missing",
    "rewrite-target-unresolved",
    "proxy-lb-pending",
    "proxy-unreachable",
    "rewrite-wrong-address",
    "frontend-certificate-names",
    "frontend-expired",
    "frontend-private-ca",
    "worker-ca-missing",
    "worker-ca-stale",
    "pem-not-redeployed",
    "legacy-worker-connect-off",
    "upstream-tls-mismatch",
    "pod-cert-untrusted",
    "pod-unreachable",
    "callback-wrong-pod",
    "wrong-path",
)

CAUSES: dict[str, Cause] = {
    c.id: c
    for c in (
        Cause(
            "split-plane-url",
            "split-plane worker URLs are set with the proxy enabled",
            "error",
            f'{WCP}, "Prerequisites"',
            "leave global.workerEndpoints.invocationServiceURL, global.workerEndpoints.grpcProxyWorkerConnectURL, "
            "grpcproxy.workerConnectBaseURL and invocation.env.WORKER_STREAM_PROPERTIES__SELF_ADDRESS empty, "
            "then apply the stack (helmfile sync)",
        ),
        Cause(
            "invocation-proxy-url",
            "invocationProxyURL is not https or not covered by *.<workerDomain>",
            "error",
            f'{WCP}, "Enable the proxy" step 1',
            "unset global.workerEndpoints.invocationProxyURL, or make it an https name under the workerDomain",
        ),
        Cause(
            "nats-auth-mode",
            "nats.workerAuth is neither nkey nor token",
            "error",
            f'{CPO}, "Worker NATS Authentication"',
            "set nats.workerAuth to nkey or token",
        ),
        Cause(
            "callout-webhook-empty",
            "token mode without a callout webhook URL",
            "error",
            f'{CPO}, "Worker NATS Authentication"',
            "set nats.authCallout.workerTokenAuth.webhookUrl (or keep nats.workerAuth: nkey)",
        ),
        Cause(
            "pod-annotations",
            "pod annotations are not strings or use a reserved key",
            "error",
            f'{CPO}, "Service Operations"',
            "quote every annotation value; drop keys starting with nvcf.nvidia.com/nats-worker-auth",
        ),
        Cause(
            "values-refused",
            "the values are refused at render time",
            "error",
            f'{WCP}, "Enable the proxy"',
            "fix the key named in the evidence, then apply the stack",
        ),
        Cause(
            "proxy-disabled",
            "compute-cluster workers but the proxy is off",
            "error",
            f'{WCP}, "Enable the proxy"',
            "set workerCallbackProxy.enabled: true and workerCallbackProxy.service.type: LoadBalancer",
        ),
        Cause(
            "rewrite-missing",
            "*.<workerDomain> does not resolve from the compute cluster",
            "error",
            f'{WCP}, "Enable the proxy" step 2',
            "add the wildcard DNS record (or the CoreDNS rewrite: ncpsim dns-rewrite --domain <workerDomain>) "
            "for *.<workerDomain> to the proxy's load-balancer address",
        ),
        Cause(
            "rewrite-wrong-domain",
            "the compute cluster's DNS rewrite is for another domain than the workerDomain",
            "error",
            f'{WCP}, "Enable the proxy" step 2',
            "rewrite *.<workerDomain> (workerCallbackProxy.workerDomain, exactly) to the proxy's load-balancer "
            "address: ncpsim dns-rewrite --domain <workerDomain>",
        ),
        Cause(
            "rewrite-target-unresolved",
            "the compute cluster's rewrite points at a name it does not resolve (the make target's default, "
            "worker-callback-proxy.nvcf.svc.cluster.local, which the compute cluster does not have)",
            "error",
            f'{WCP}, "Enable the proxy" step 2',
            "make the rewrite's target resolve in the compute cluster (a selectorless Service "
            "worker-callback-proxy in namespace nvcf whose endpoint is the proxy's load-balancer address: "
            "ncpsim dns-rewrite --proxy-address IP; or WORKER_CALLBACK_PROXY_SERVICE set to a name you exposed), "
            "or write the *.<workerDomain> record for the load-balancer address",
        ),
        Cause(
            "rewrite-wrong-address",
            "*.<workerDomain> resolves, but not to a reachable proxy",
            "error",
            f'{WCP}, "Enable the proxy" step 2',
            "point the *.<workerDomain> record at the proxy Service's load-balancer address",
        ),
        Cause(
            "proxy-lb-pending",
            "the proxy's LoadBalancer Service has no address",
            "error",
            f'{WCP}, "Enable the proxy" step 1',
            "find why the load balancer is not provisioned (kubectl -n nvcf describe svc worker-callback-proxy: "
            "its events, the cloud's quota, service.annotations such as "
            "service.beta.kubernetes.io/aws-load-balancer-internal), then point *.<workerDomain> at its address",
        ),
        Cause(
            "proxy-unreachable",
            "the proxy Service is not reachable from the compute cluster",
            "error",
            f'{WCP}, "Enable the proxy" step 1',
            "set workerCallbackProxy.service.type: LoadBalancer (ClusterIP is reachable only in-cluster) "
            "and allow the compute cluster's egress through the load balancer",
        ),
        Cause(
            "worker-ca-missing",
            "workers do not trust the stack-CA frontend (no workerCallbackCaPem)",
            "error",
            f'{WCP}, "Give workers the CA"',
            "set global.nvcaOperator.agent.workerCallbackCaPem to the frontend's ca.crt, apply the compute-plane "
            "stack, then redeploy the functions",
        ),
        Cause(
            "worker-ca-stale",
            "workerCallbackCaPem does not sign the frontend certificate",
            "error",
            f'{WCP}, "Give workers the CA"',
            "read ca.crt from worker-callback-proxy-frontend-tls again (after a rotation or a brought "
            "certificate), update global.nvcaOperator.agent.workerCallbackCaPem, then redeploy the functions",
        ),
        Cause(
            "pem-not-redeployed",
            "workerCallbackCaPem set, but running function pods predate it",
            "warning",
            f'{WCP}, "Give workers the CA" step 3',
            "redeploy existing functions so new pods get NVCF_PROXY_CA_PEM",
        ),
        Cause(
            "frontend-private-ca",
            "the brought frontend certificate is not from a public CA",
            "error",
            f'{WCP}, "Use a public certificate on the proxy"',
            "issue tls.frontend.existingSecret from a public CA, or give workers its CA through "
            "global.nvcaOperator.agent.workerCallbackCaPem and redeploy the functions",
        ),
        Cause(
            "frontend-certificate-names",
            "the proxy's frontend certificate does not cover the names workers call back to",
            "error",
            f'{WCP}, "Certificates and CAs"',
            "issue the frontend certificate for *.<workerDomain> exactly (workerCallbackProxy.workerDomain: a "
            "wildcard covers one label, so *.example.com does not cover invocation.callbacks.example.com), the "
            "name every callback uses (invocation.<workerDomain> and each <dashed-pod-ip>.<workerDomain>); "
            "the proxy reloads it without restart",
        ),
        Cause(
            "frontend-expired",
            "the proxy's frontend certificate has expired",
            "error",
            f'{WCP}, "Certificates and CAs"',
            "renew the frontend certificate; the proxy reloads it without restart",
        ),
        Cause(
            "legacy-worker-connect-off",
            "worker-utils older than 1.3.2 with CONNECT off",
            "error",
            f'{WCP}, "Callback path and CONNECT"',
            "upgrade worker-utils to 1.3.2 or later, or set workerCallbackProxy.invocation.connect.enabled: true",
        ),
        Cause(
            "pod-cert-untrusted",
            "the proxy cannot verify the pod certificate",
            "error",
            f'{WCP}, "Pod certificate Secrets"',
            "reissue the pod certificate from the stack CA for *.invocation.nvcf.svc.cluster.local "
            "(or *.grpc-headless...); check ca.crt of the pod's Secret",
        ),
        Cause(
            "pod-unreachable",
            "the proxy cannot reach the pod",
            "error",
            f'{WCP}, "How callbacks reach a pod"',
            "check the pod is running and ready; with upstream TLS off the pod must listen on 8080 "
            "(workerCallbackProxy.invocation.upstreamTls.enabled)",
        ),
        Cause(
            "upstream-tls-mismatch",
            "the proxy sends upstream TLS to the pod's 8443, but the pod's worker TLS listener is off",
            "error",
            f'{WCP}, "Prerequisites"',
            "leave invocation.workerTls unset, so the stack turns the listener on with upstream TLS, on an "
            "invocation-service image with worker TLS support (or set "
            "workerCallbackProxy.invocation.upstreamTls.enabled: false where the network to the pod is "
            "trusted), then apply the stack",
        ),
        Cause(
            "callback-wrong-pod",
            "the callback landed on another pod than the one holding the request",
            "error",
            f'{WCP}, "How callbacks reach a pod"',
            "leave the split-plane worker URLs empty so workers get per-pod targets through the proxy",
        ),
        Cause(
            "wrong-path",
            "the worker called a path the proxy does not route",
            "error",
            f'{WCP}, "Callback path and CONNECT"',
            "only /v2/nvcf/worker/request-attach is forwarded",
        ),
        Cause(
            "nats-account-not-read",
            "token mode, but the workers' worker-utils does not read NVCF_NATS_ACCOUNT (asks for account Worker)",
            "error",
            f'{CPO}, "Worker NATS Authentication"',
            "run the functions on a worker-utils image that reads NVCF_NATS_ACCOUNT (with an NVCF API that "
            "sends APP), or set nats.workerAuth: nkey and redeploy those functions until they are upgraded",
        ),
        Cause(
            "nats-auth-rejected",
            "the worker's NATS sign-in is refused",
            "error",
            f'{CPO}, "Worker NATS Authentication"',
            "match nats.workerAuth to the workers' worker-utils (token needs a version that sends NVCF_NATS "
            "tokens), and check the callout's webhook URL is reachable",
        ),
    )
}
