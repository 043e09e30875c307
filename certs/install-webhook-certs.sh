#!/usr/bin/env bash
# One-shot certificate setup for the webhook without cert-manager: generates a CA and a serving
# certificate, applies the Secret the Deployment mounts, and writes the CA into caBundle of every
# webhook in both cloudnet-webhook configurations. Run it after `kubectl apply -k manifests/webhook`
# (and again to rotate). Needs kubectl pointing at the cluster (KUBECONFIG or its default).
#   CLOUDNET_CERTS_BIN  the cloudnet-webhook-certs binary (default: cargo run from this repository)
#   KUBECTL             kubectl to use (default: kubectl)
#   NAMESPACE           the webhook's namespace (default: cloudnet)
set -euo pipefail

kubectl=${KUBECTL:-kubectl}
namespace=${NAMESPACE:-cloudnet}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if [[ -n ${CLOUDNET_CERTS_BIN:-} ]]; then
  certs=("$CLOUDNET_CERTS_BIN")
else
  certs=(cargo run -q -p cloudnet-certs --bin cloudnet-webhook-certs --)
fi
ca_bundle=$("${certs[@]}" --service cloudnet-webhook --namespace "$namespace" --out-dir "$out")
"$kubectl" apply -f "$out/secret.yaml"

for kind in mutatingwebhookconfiguration validatingwebhookconfiguration; do
  count=$("$kubectl" get "$kind" cloudnet-webhook -o jsonpath='{range .webhooks[*]}x{end}')
  ops=""
  for ((i = 0; i < ${#count}; i++)); do
    ops+="${ops:+,}{\"op\":\"add\",\"path\":\"/webhooks/$i/clientConfig/caBundle\",\"value\":\"$ca_bundle\"}"
  done
  "$kubectl" patch "$kind" cloudnet-webhook --type=json -p "[$ops]"
done
