#!/usr/bin/env bash
# The end-to-end suite on a kind cluster, for machines with Docker or Podman and registry access
# (kind pulls its node image; this repository's CI cannot, and runs the one-node cluster of
# e2e-kind/tests/cluster/node.rs instead). Builds the images, creates the cluster (once), loads the
# images, applies the shipped manifests through e2e-kind/kind/overlay, deploys moto, and runs the
# suite against it.
#
# Usage: e2e-kind/kind/run.sh [up|test|down]   (default: up, then test)
# Needs: kind, kubectl, docker (or podman with KIND_EXPERIMENTAL_PROVIDER=podman), cargo.
# Env:   KIND_CLUSTER (default cloudnet-e2e)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cluster=${KIND_CLUSTER:-cloudnet-e2e}
kubeconfig="${TMPDIR:-/tmp}/kind-$cluster.kubeconfig"
log() { echo "kind/run.sh: $*" >&2; }

for tool in kind kubectl cargo; do
  command -v "$tool" >/dev/null || { log "$tool is not installed"; exit 1; }
done

up() {
  # shellcheck source=../moto/versions.env
  source "$repo/e2e-kind/moto/versions.env"
  images=$(make -C "$repo" --no-print-directory -s images | tail -n 1)
  if ! kind get clusters | grep -qx "$cluster"; then
    kind create cluster --name "$cluster" --config "$here/cluster.yaml" --wait 120s
  fi
  kind get kubeconfig --name "$cluster" >"$kubeconfig"
  export KUBECONFIG=$kubeconfig
  for image in cloudnet-webhook cloudnet-reconciler; do
    kind load image-archive "$images/$image.oci.tar" --name "$cluster"
  done

  sed "s/@MOTO_VERSION@/$MOTO_VERSION/" "$here/moto.yaml" | kubectl apply -f -
  kubectl apply -f "$repo/manifests/crd/"
  kubectl wait --for=condition=Established crd/cloudprivateipconfigs.cloud.network.openshift.io --timeout=60s

  kubectl apply -k "$here/overlay/webhook"
  "$repo/certs/install-webhook-certs.sh"
  kubectl apply -k "$here/overlay/reconciler"
  # moto accepts any keys; the Secret only has to exist with upstream's key names.
  kubectl -n cloudnet-system create secret generic cloud-credentials \
    --from-literal=aws_access_key_id=AKIDCLOUDNETE2E \
    --from-literal=aws_secret_access_key=cloudnet-e2e-secret \
    --dry-run=client -o yaml | kubectl apply -f -
  # A rollout restart picks up a rebuilt image under the same tag.
  kubectl -n cloudnet rollout restart deployment/cloudnet-webhook
  kubectl -n cloudnet-system rollout restart deployment/cloudnet-reconciler
  kubectl -n cloudnet-e2e rollout status deployment/moto --timeout=300s
  kubectl -n cloudnet rollout status deployment/cloudnet-webhook --timeout=300s
  kubectl -n cloudnet-system rollout status deployment/cloudnet-reconciler --timeout=300s
}

suite() {
  kind get kubeconfig --name "$cluster" >"$kubeconfig"
  (cd "$repo" && CLOUDNET_E2E_KUBECONFIG=$kubeconfig CLOUDNET_E2E_EC2_URL=http://127.0.0.1:30500 \
    cargo test --locked --workspace --test e2e)
}

case "${1:-all}" in
  up) up ;;
  test) suite ;;
  down) kind delete cluster --name "$cluster" ;;
  all) up; suite ;;
  *) echo "usage: run.sh [up|test|down]" >&2; exit 2 ;;
esac
