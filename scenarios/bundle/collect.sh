#!/bin/sh
# ncpsim support bundle collector. Read-only: it runs only `kubectl get`, `kubectl logs`, `kubectl version`
# and `helm list`/`helm version`, against the contexts you name, and writes a folder and its .tar.gz.
#
#   sh collect.sh --control-plane CONTEXT [--compute CONTEXT]... [--env-file environments/ENV.yaml]
#                 [--secret NAME]... [--selector LABEL] [--namespace nvcf] [--out DIR]
#
# Each file is the output of one command, named in meta.yaml, so you can also produce any file by hand:
#   environment.yaml                 cat ENV_FILE (the helmfile environment file)
#   control-plane/services.yaml      kubectl get svc -n nvcf -o yaml
#   control-plane/secrets.yaml       kubectl get secret -n nvcf NAMES -o yaml, private keys removed (below)
#   control-plane/logs/worker-callback-proxy.log      kubectl logs deploy/worker-callback-proxy -n nvcf --tail=2000
#   control-plane/logs/nats-auth-callout-service.log kubectl logs -n nats-system
#                                      -l app.kubernetes.io/instance=nats-auth-callout-service --tail=2000 --prefix
#   compute/CONTEXT/coredns.yaml     kubectl get configmap -n kube-system coredns coredns-custom -o yaml
#   compute/CONTEXT/pods.yaml        kubectl get pods -A -l SELECTOR -o yaml, NVCF_PROXY_CA_PEM as a SHA-256
#   meta.yaml                        this collector's version, the time, the contexts, every failed command
#
# What never leaves the cluster: Secret data other than tls.crt and ca.crt (so tls.key), the
# kubectl.kubernetes.io/last-applied-configuration annotation (it can hold a whole Secret), the value of
# NVCF_PROXY_CA_PEM (only its SHA-256), and any line that still looks like a private key or a PEM block in
# a pod. The filters run on kubectl's output before anything is written. A command that fails is recorded
# in meta.yaml and the collection goes on: a missing file is a note in the diagnosis, not an error.
set -u
umask 077
VERSION=1
NAMESPACE=nvcf
SELECTOR=nvcf.nvidia.com/function-version-id # the label NVCA puts on function pods (an assumption: -l)
CONTROL=""
COMPUTE=""
ENV_FILE=""
SECRETS="worker-callback-proxy-frontend-tls invocation-service-worker-tls grpc-proxy-worker-tls"
OUT="ncpsim-bundle-$(date -u +%Y%m%dT%H%M%SZ)"

usage() {
    echo "usage: sh collect.sh --control-plane CONTEXT [--compute CONTEXT]... [--env-file FILE]" \
        "[--secret NAME]... [--selector LABEL] [--namespace NS] [--out DIR]" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
    --control-plane) [ $# -ge 2 ] || usage; CONTROL=$2; shift 2 ;;
    --compute) [ $# -ge 2 ] || usage; COMPUTE="$COMPUTE
$2"; shift 2 ;;
    --env-file) [ $# -ge 2 ] || usage; ENV_FILE=$2; shift 2 ;;
    --secret) [ $# -ge 2 ] || usage; SECRETS="$SECRETS $2"; shift 2 ;;
    --selector | -l) [ $# -ge 2 ] || usage; SELECTOR=$2; shift 2 ;;
    --namespace | -n) [ $# -ge 2 ] || usage; NAMESPACE=$2; shift 2 ;;
    --out | -o) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "collect.sh: unknown argument $1" >&2; usage ;;
    esac
done
[ -n "$CONTROL" ] || usage
if [ -z "$COMPUTE" ]; then # a single cluster: its workers run beside the control plane
    COMPUTE="
$CONTROL"
fi
if [ -e "$OUT" ] || [ -e "$OUT.tar.gz" ]; then
    echo "collect.sh: $OUT or $OUT.tar.gz exists; name another folder with --out" >&2
    exit 2
fi
mkdir -p "$OUT/control-plane/logs" "$OUT/compute" || exit 2
WORK=$(mktemp -d) || exit 2
trap 'rm -rf "$WORK"' EXIT
: >"$WORK/failed"

# A value for meta.yaml: one line, single-quoted YAML.
quoted() {
    printf "'%s'" "$(printf '%s' "$1" | tr -d '[:cntrl:]' | sed "s/'/''/g")"
}

# record FILE RC COMMAND: note a failed command (its exit code and first error line) for meta.yaml.
record() {
    [ "$2" = 0 ] && return 0
    {
        echo "  - file: $(quoted "$1")"
        echo "    command: $(quoted "$3")"
        echo "    exit: $2"
        echo "    error: $(quoted "$(head -n 1 "$WORK/stderr" 2>/dev/null)")"
    } >>"$WORK/failed"
}

# collect FILE FILTER COMMAND...: COMMAND's output through FILTER (cat, or a redaction) into FILE.
# The exit code is kept through the pipe without pipefail: the first stage writes it to a file.
collect() {
    file=$1
    filter=$2
    shift 2
    { "$@" 2>"$WORK/stderr"; echo $? >"$WORK/rc"; } | $filter >"$OUT/$file"
    record "$file" "$(cat "$WORK/rc")" "$*"
}

# Secrets: keep only tls.crt and ca.crt under data; drop the last-applied annotation (a whole Secret as
# JSON); any other line that still holds a private key, in PEM or base64 at any alignment, is removed.
redact_secrets() {
    awk '
    function indent(s) { match(s, /^ */); return RLENGTH }
    function keyof(s,   t) { t = s; sub(/^ *(- )?/, "", t); sub(/:.*/, "", t); gsub(/["\047]/, "", t); return t }
    function private(s) {
        return s ~ /PRIVATE KEY|IFBSSVZBVEUgS0VZLS0t|BQUklWQVRFIEtFWS0tLS0t|gUFJJVkFURSBLRVktLS0t/
    }
    BEGIN { data = -1; skip = -1 }
    {
        n = indent($0); k = n + ($0 ~ /^ *- / ? 2 : 0)
        if (skip >= 0) { if ($0 ~ /^ *$/ || n > skip) next; skip = -1 }
        if (data >= 0) {
            if ($0 ~ /^ *$/ || n > data) {
                key = keyof($0)
                if ((key == "tls.crt" || key == "ca.crt") && !private($0)) print
                else if ($0 ~ /: *[|>]/) skip = n
                next
            }
            data = -1
        }
        if ($0 ~ /^ *(- )?(data|stringData): *$/) { data = k; print; next }
        if ($0 ~ /^ *(- )?(data|stringData): *\{ *[^} ]/) { sub(/:.*/, ": {}"); print; next }
        if (keyof($0) == "kubectl.kubernetes.io/last-applied-configuration") { skip = k; next }
        if (private($0)) { print "# ncpsim-collect: removed a line that held a private key"; next }
        print
    }'
}

# Pods: each NVCF_PROXY_CA_PEM value goes to $WORK/pem.N (hashed below, never written to the bundle);
# the value becomes a placeholder. Lines that still look like PEM or a private key are removed.
extract_pems() {
    awk -v dir="$WORK" '
    function indent(s) { match(s, /^ */); return RLENGTH }
    function keyof(s,   t) { t = s; sub(/^ *(- )?/, "", t); sub(/:.*/, "", t); gsub(/["\047]/, "", t); return t }
    function pem(s) {
        return s ~ /-----BEGIN|PRIVATE KEY|LS0tLS1CRUdJ|0tLS0tQkVH|tLS0tLUJFR0lO/
    }
    function save(text) { count++; printf "%s", text > (dir "/pem." count); close(dir "/pem." count) }
    function placeholder() { return "@@NCPSIM_PEM_" count "@@" }
    function unindent(s, most,   i) { for (i = 0; i < most && substr(s, 1, 1) == " "; i++) s = substr(s, 2); return s }
    function finish(   text, i) {
        text = ""
        for (i = 1; i <= lines; i++) text = text (i > 1 ? "\n" : "") body[i]
        if (chomp != "+") sub(/\n+$/, "", text)
        if (chomp == "") text = text "\n"
        if (chomp == "+") text = text "\n"
        save(text); print pad "value: " placeholder(); block = 0
    }
    function unquote(s) {
        s = substr(s, 2, length(s) - 2)
        gsub(/\\n/, "\n", s); gsub(/\\t/, "\t", s); gsub(/\\"/, "\"", s); gsub(/\\\\/, "\\", s)
        return s
    }
    BEGIN { want = -1; block = 0; quoted = 0 }
    {
        n = indent($0)
        if (quoted) { if ($0 ~ /[^\\]"$/) quoted = 0; next }
        if (block) {
            if ($0 ~ /^ *$/ || n > want) { body[++lines] = unindent($0, want + 2); next }
            finish(); want = -1
        }
        if (want >= 0 && n == want && keyof($0) == "value") {
            pad = sprintf("%" n "s", ""); rest = $0; sub(/^ *value: */, "", rest)
            if (rest ~ /^[|][-+]?[0-9]?$/) { block = 1; lines = 0; chomp = substr(rest, 2, 1); sub(/[0-9]/, "", chomp); next }
            if (rest ~ /^"/ && rest ~ /[^\\]"$/) { save(unquote(rest)); print pad "value: " placeholder(); want = -1; next }
            if (rest ~ /^["\047]/) { quoted = (rest ~ /^"/); print pad "value: sha256:unreadable"; want = -1; next }
            save(rest); print pad "value: " placeholder(); want = -1; next
        }
        if (want >= 0 && n < want) want = -1
        if ($0 ~ /^ *- name: *["\047]?NVCF_PROXY_CA_PEM["\047]? *$/) { want = n + 2; print; next }
        if (keyof($0) == "kubectl.kubernetes.io/last-applied-configuration") { next }
        if (pem($0)) { print "# ncpsim-collect: removed a line that held a certificate or key"; next }
        print
    }
    END { if (block) finish() }'
}

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum <"$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then shasum -a 256 <"$1" | cut -d' ' -f1
    elif command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r <"$1" | cut -d' ' -f1
    else echo unavailable
    fi
}

# The placeholders of extract_pems replaced by each value's SHA-256; the values themselves are deleted.
hash_pems() {
    file=$1
    : >"$WORK/hashes.sed"
    for value in "$WORK"/pem.*; do
        [ -f "$value" ] || continue
        n=${value##*.}
        echo "s/@@NCPSIM_PEM_${n}@@/sha256:$(sha256 "$value")/" >>"$WORK/hashes.sed"
        rm -f "$value"
    done
    sed -f "$WORK/hashes.sed" "$OUT/$file" >"$WORK/hashed" && cat "$WORK/hashed" >"$OUT/$file"
    rm -f "$WORK/hashed"
}

folder_for() { # a context name as one safe folder name (contexts may hold / and :)
    name=$(printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_')
    case "$name" in .*) name="_$name" ;; esac
    while [ -e "$OUT/compute/$name" ]; do name="${name}_"; done
    printf '%s' "$name"
}

# -- the customer's environment file, and the Secrets it names -----------------------------------------
if [ -n "$ENV_FILE" ]; then
    collect environment.yaml cat cat "$ENV_FILE"
    for name in $(sed -n "s/^[[:space:]]*existingSecret:[[:space:]]*[\"']\{0,1\}\([a-z0-9][a-z0-9.-]*\).*/\1/p" "$ENV_FILE" 2>/dev/null); do
        SECRETS="$SECRETS $name"
    done
else
    echo "  - file: 'environment.yaml'
    command: 'cat ENV_FILE'
    exit: 2
    error: 'no --env-file given: diagnose needs the helmfile environment file (-f)'" >>"$WORK/failed"
fi
SECRETS=$(printf '%s\n' $SECRETS | awk '!seen[$0]++' | tr '\n' ' ')

# -- the control plane ---------------------------------------------------------------------------------
collect control-plane/services.yaml cat kubectl --context "$CONTROL" get svc -n "$NAMESPACE" -o yaml
# shellcheck disable=SC2086 # one word per Secret name
collect control-plane/secrets.yaml redact_secrets kubectl --context "$CONTROL" get secret $SECRETS -n "$NAMESPACE" -o yaml
collect control-plane/logs/worker-callback-proxy.log cat \
    kubectl --context "$CONTROL" logs deploy/worker-callback-proxy -n "$NAMESPACE" --tail=2000
collect control-plane/logs/nats-auth-callout-service.log cat \
    kubectl --context "$CONTROL" logs -n nats-system -l app.kubernetes.io/instance=nats-auth-callout-service \
    --tail=2000 --prefix

# -- each compute cluster ------------------------------------------------------------------------------
: >"$WORK/contexts"
printf '%s\n' "$COMPUTE" | while IFS= read -r context; do
    [ -n "$context" ] || continue
    folder=$(folder_for "$context")
    mkdir -p "$OUT/compute/$folder"
    echo "  - {context: $(quoted "$context"), folder: $(quoted "$folder")}" >>"$WORK/contexts"
    collect "compute/$folder/coredns.yaml" cat \
        kubectl --context "$context" get configmap -n kube-system coredns coredns-custom -o yaml
    collect "compute/$folder/pods.yaml" extract_pems \
        kubectl --context "$context" get pods -A -l "$SELECTOR" -o yaml
    hash_pems "compute/$folder/pods.yaml"
done

# -- meta.yaml: what ran, when, against what, and what failed -------------------------------------------
kubectl_version=$(kubectl version --client 2>/dev/null | head -n 1)
helm_version=$(helm version --short 2>/dev/null | head -n 1)
helm --kube-context "$CONTROL" list -n "$NAMESPACE" -o yaml >"$WORK/releases" 2>"$WORK/stderr"
record meta.yaml $? "helm --kube-context $CONTROL list -n $NAMESPACE -o yaml"
{
    echo "collector: ncpsim-collect"
    echo "version: $VERSION"
    echo "time: '$(date -u +%Y-%m-%dT%H:%M:%SZ)'"
    echo "namespace: $(quoted "$NAMESPACE")"
    echo "selector: $(quoted "$SELECTOR")"
    echo "secrets: $(quoted "$SECRETS")"
    echo "controlPlane: {context: $(quoted "$CONTROL")}"
    echo "compute:"
    cat "$WORK/contexts"
    echo "tools: {kubectl: $(quoted "$kubectl_version"), helm: $(quoted "$helm_version")}"
    echo "releases: |"
    sed 's/^/  /' "$WORK/releases"
    if [ -s "$WORK/failed" ]; then echo "failed:"; cat "$WORK/failed"; else echo "failed: []"; fi
} >"$OUT/meta.yaml"

parent=$(dirname "$OUT")
base=$(basename "$OUT")
tar -czf "$OUT.tar.gz" -C "$parent" "$base" || exit 1
echo "bundle: $OUT.tar.gz (the folder $OUT holds the same files; read them before you send it)"
