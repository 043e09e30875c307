#!/usr/bin/env bash
# Builds the helm CLI from its published Go module (helm.sh/helm/v3, pinned in versions.env) into a
# versioned cache directory outside the checkout, once; later calls only print the directory. The
# chart tests lint, render and install charts/cloudnet with it.
#
# Usage: build.sh            prints the directory holding `helm`
# Env:   CLOUDNET_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

command -v go >/dev/null || { echo "build.sh: go is not installed" >&2; exit 1; }
go_version=$(go env GOVERSION)
cache_root=${CLOUDNET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet}
out="$cache_root/helm/helm-$HELM_VERSION-$go_version"
bin="$out/bin"

if [[ -f "$out/.complete" && -x "$bin/helm" ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache_root/helm"
# Several test processes may ask at once; only one builds.
exec 9>"$cache_root/helm/.build.lock"
flock 9
if [[ -f "$out/.complete" && -x "$bin/helm" ]]; then echo "$bin"; exit 0; fi

work=$(mktemp -d "$cache_root/helm/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
log() { echo "helm/build.sh: $*" >&2; }

log "resolving helm.sh/helm/v3@$HELM_VERSION"
helm_mod=$(cd "$work" && go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[[ -f "$helm_mod" ]] || { log "could not download helm.sh/helm/v3@$HELM_VERSION"; exit 1; }
go_directive=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$helm_mod")
printf 'module cloudnet.local/helm\ngo %s\nrequire helm.sh/helm/v3 %s\n' "$go_directive" "$HELM_VERSION" >"$work/go.mod"

# What Helm's own Makefile stamps in: its version, and the Kubernetes version of its client-go
# (major + 1, minor) as the default .Capabilities.KubeVersion of `helm template` and `helm lint`.
client_go=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$helm_mod")
[[ -n $client_go ]] || { log "no k8s.io/client-go requirement in helm's go.mod"; exit 1; }
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_go"
done

log "building helm $HELM_VERSION (first run only; a few minutes)"
(cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
  -o "$work/bin/helm" helm.sh/helm/v3/cmd/helm)

rm -rf "$out"
mkdir -p "$out"
mv "$work/bin" "$bin"
touch "$out/.complete"
log "built into $bin"
echo "$bin"
