#!/usr/bin/env bash
# Certificate setup and rotation for the webhook without cert-manager: generates a CA and a serving
# certificate, makes every webhook in both cloudnet-webhook configurations trust the new CA, then
# applies the Secret the Deployment mounts. Run it after `kubectl apply -k manifests/webhook`, and
# again to rotate. Needs kubectl pointing at the cluster (KUBECONFIG or its default).
#
# Rotation without an admission outage: kubelet refreshes a mounted Secret up to a minute or two
# after it changes, and the pods serve the old certificate until then. So caBundle first gets the
# CA of the Secret being replaced *and* the new CA, and only then is the Secret replaced: during
# the whole rollover kube-apiserver trusts whichever certificate a pod serves. The previous CA
# stays in caBundle until the next run replaces it (its key was never kept, so trusting it a while
# longer grants nothing).
#   CLOUDNET_CERTS_BIN  the cloudnet-webhook-certs binary (default: cargo run from this repository)
#   KUBECTL             kubectl to use (default: kubectl)
#   NAMESPACE           the webhook's namespace (default: cloudnet)
set -euo pipefail

kubectl=${KUBECTL:-kubectl}
namespace=${NAMESPACE:-cloudnet}
secret=cloudnet-webhook-tls
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if [[ -n ${CLOUDNET_CERTS_BIN:-} ]]; then
  certs=("$CLOUDNET_CERTS_BIN")
else
  certs=(cargo run -q -p cloudnet-certs --bin cloudnet-webhook-certs --)
fi
"${certs[@]}" --service cloudnet-webhook --namespace "$namespace" --secret-name "$secret" \
  --out-dir "$out" >/dev/null

# The CA the pods serve from until kubelet refreshes their mount (none on a first install).
"$kubectl" -n "$namespace" get secret "$secret" --ignore-not-found \
  -o jsonpath='{.data.ca\.crt}' | base64 -d >"$out/previous-ca.crt"
{
  cat "$out/previous-ca.crt"
  cat "$out/ca.crt"
} | base64 | tr -d '\n' >"$out/bundle"
ca_bundle=$(<"$out/bundle")

for kind in mutatingwebhookconfiguration validatingwebhookconfiguration; do
  count=$("$kubectl" get "$kind" cloudnet-webhook -o jsonpath='{range .webhooks[*]}x{end}')
  ops=""
  for ((i = 0; i < ${#count}; i++)); do
    ops+="${ops:+,}{\"op\":\"add\",\"path\":\"/webhooks/$i/clientConfig/caBundle\",\"value\":\"$ca_bundle\"}"
  done
  "$kubectl" patch "$kind" cloudnet-webhook --type=json -p "[$ops]"
done
"$kubectl" apply -f "$out/secret.yaml"
