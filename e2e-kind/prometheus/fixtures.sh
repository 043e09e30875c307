#!/usr/bin/env bash
# Installs the monitoring fixtures from their pinned Go modules (through the Go module proxy only)
# into a versioned cache directory outside the checkout, once; later calls only print the directory.
#
# Usage: fixtures.sh          prints the directory holding promtool, built from
#                             github.com/prometheus/prometheus
#        fixtures.sh crds     prints the directory holding the prometheus-operator CRDs
#                             (ServiceMonitor, PodMonitor, PrometheusRule) as the module ships them
# Env:   CLOUDNET_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

command -v go >/dev/null || { echo "fixtures.sh: go is not installed" >&2; exit 1; }
cache_root=${CLOUDNET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet}
mode=${1:-promtool}
case "$mode" in
  promtool)
    out="$cache_root/prometheus/promtool-$PROMETHEUS_MODULE_VERSION-nosd-$(go env GOVERSION)"
    wanted=(bin/promtool) ;;
  crds)
    out="$cache_root/prometheus/operator-crds-$PROMETHEUS_OPERATOR_VERSION"
    kinds=(servicemonitors podmonitors prometheusrules)
    wanted=("${kinds[@]/#/crds/monitoring.coreos.com_}")
    wanted=("${wanted[@]/%/.yaml}") ;;
  *) echo "usage: fixtures.sh [crds]" >&2; exit 2 ;;
esac
dir="$out/${wanted[0]%/*}"

complete() {
  [[ -f "$out/.complete" ]] || return 1
  for f in "${wanted[@]}"; do [[ -s "$out/$f" ]] || return 1; done
}
if complete; then
  echo "$dir"
  exit 0
fi

mkdir -p "$cache_root/prometheus"
# Several test processes may ask at once; only one installs.
exec 9>"$cache_root/prometheus/.$mode.lock"
flock 9
if complete; then echo "$dir"; exit 0; fi

work=$(mktemp -d "$cache_root/prometheus/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
log() { echo "fixtures.sh: $*" >&2; }

if [[ $mode == crds ]]; then
  module=github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION
  log "downloading $module"
  src=$(cd "$work" && go mod download -json "$module" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [[ -d "$src/example/prometheus-operator-crd" ]] || { log "$module has no example/prometheus-operator-crd"; exit 1; }
  mkdir -p "$work/out/crds"
  for kind in "${kinds[@]}"; do
    cp "$src/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$work/out/crds/"
  done
else
  module=github.com/prometheus/prometheus
  # Prometheus 3.MM.P is published as the Go module version v0.3MM.P.
  minor_patch=${PROMETHEUS_MODULE_VERSION#v0.3}
  release="3.$((10#${minor_patch%%.*})).${minor_patch#*.}"
  log "building promtool $release from $module@$PROMETHEUS_MODULE_VERSION (first run only; a few minutes)"
  # A module of our own requires Prometheus' (go install pkg@version would refuse a replace
  # directive, should a release carry one), so -mod=mod resolves its dependencies as it pins them.
  go_directive=$(cd "$work" && go mod download -json "$module@$PROMETHEUS_MODULE_VERSION" |
    sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' | xargs sed -n 's/^go \([0-9.]*\)$/\1/p')
  printf 'module cloudnet.local/promtool\ngo %s\nrequire %s %s\n' \
    "$go_directive" "$module" "$PROMETHEUS_MODULE_VERSION" >"$work/go.mod"
  version=github.com/prometheus/common/version
  # remove_all_sd: without the service-discovery plugins (every cloud's Go SDK, client-go), which
  # rule checks and rule tests never use; they were most of a cold build's time.
  (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X $version.Version=$release -X $version.Branch=release -X $version.Revision=$PROMETHEUS_MODULE_VERSION" \
    -o "$work/out/bin/promtool" "$module/cmd/promtool")
fi

rm -rf "$out"
mv "$work/out" "$out"
touch "$out/.complete"
complete || { log "install into $out is incomplete"; rm -rf "$out"; exit 1; }
log "installed into $dir"
echo "$dir"
