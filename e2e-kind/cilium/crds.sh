#!/usr/bin/env bash
# Installs Cilium's CiliumEgressGatewayPolicy CRD (cilium.io/v2) from the pinned Go module (through
# the Go module proxy only) into a versioned cache directory outside the checkout, once; later
# calls only print the directory. The CRD is taken as the module ships it: Cilium's agent and
# operator are not run (docs/testing.md), only their API is served.
#
# Usage: crds.sh              prints the directory holding ciliumegressgatewaypolicies.yaml
# Env:   CLOUDNET_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

command -v go >/dev/null || { echo "crds.sh: go is not installed" >&2; exit 1; }
cache_root=${CLOUDNET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet}
out="$cache_root/cilium/crds-$CILIUM_VERSION"
wanted=(ciliumegressgatewaypolicies.yaml)
# Where the module keeps the CRDs it generates (controller-gen), per API version.
source_dir=pkg/k8s/apis/cilium.io/client/crds/v2

complete() {
  [[ -f "$out/.complete" ]] || return 1
  for f in "${wanted[@]}"; do [[ -s "$out/$f" ]] || return 1; done
}
if complete; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache_root/cilium"
# Several test processes may ask at once; only one installs.
exec 9>"$cache_root/cilium/.crds.lock"
flock 9
if complete; then echo "$out"; exit 0; fi

work=$(mktemp -d "$cache_root/cilium/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
log() { echo "crds.sh: $*" >&2; }

module=github.com/cilium/cilium@$CILIUM_VERSION
log "downloading $module"
src=$(cd "$work" && go mod download -json "$module" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[[ -d "$src/$source_dir" ]] || { log "$module has no $source_dir"; exit 1; }
mkdir -p "$work/out"
for f in "${wanted[@]}"; do
  cp "$src/$source_dir/$f" "$work/out/"
done

rm -rf "$out"
mv "$work/out" "$out"
touch "$out/.complete"
complete || { log "install into $out is incomplete"; rm -rf "$out"; exit 1; }
log "installed into $out"
echo "$out"
