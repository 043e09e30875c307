#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and etcd from their published Go modules into a versioned cache
# directory outside the checkout, once; later calls only print the directory.
#
# Usage: build.sh            prints the directory holding the three binaries
#        build.sh node       prints the directory holding kubelet, kube-scheduler and
#                            kube-controller-manager (the one-node cluster), built from the same
#                            k8s.io/kubernetes module and staging versions, into a directory of
#                            their own so that the control plane's cache stays valid
# Env:   CLOUDNET_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

command -v go >/dev/null || { echo "build.sh: go is not installed" >&2; exit 1; }
go_version=$(go env GOVERSION)
cache_root=${CLOUDNET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet}
mode=${1:-controlplane}
case "$mode" in
  controlplane)
    out="$cache_root/controlplane/k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-$go_version"
    wanted=(kube-apiserver kubectl etcd) ;;
  node)
    out="$cache_root/controlplane/k8s-$KUBERNETES_VERSION-node-$go_version"
    wanted=(kubelet kube-scheduler kube-controller-manager) ;;
  *) echo "usage: build.sh [node]" >&2; exit 2 ;;
esac
bin="$out/bin"

complete() {
  [[ -f "$out/.complete" ]] || return 1
  for b in "${wanted[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
}
if complete; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache_root/controlplane"
# Several test processes may ask at once; only one builds.
exec 9>"$cache_root/controlplane/.build.lock"
flock 9
if complete; then echo "$bin"; exit 0; fi

work=$(mktemp -d "$cache_root/controlplane/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
log() { echo "build.sh: $*" >&2; }

k8s_minor_patch=${KUBERNETES_VERSION#v1.}                 # 36.3
staging_version="v0.$k8s_minor_patch"                      # v0.36.3
k8s_minor=${k8s_minor_patch%%.*}

# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with local paths,
# which a dependent module ignores; replace each with its published release instead.
log "resolving k8s.io/kubernetes@$KUBERNETES_VERSION"
k8s_mod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[[ -f "$k8s_mod" ]] || { log "could not download k8s.io/kubernetes@$KUBERNETES_VERSION"; exit 1; }
go_directive=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$k8s_mod")
staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$k8s_mod")

mkdir -p "$work/k8s" "$work/etcd"
{
  echo "module cloudnet.local/controlplane"
  echo "go $go_directive"
  echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
  echo "replace ("
  for m in $staging; do echo "  $m => $m $staging_version"; done
  echo ")"
} >"$work/k8s/go.mod"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# Moves the built binaries into place, marks the build complete, prints the directory and exits.
install_bin() {
  rm -rf "$out"
  mkdir -p "$out"
  mv "$work/bin" "$bin"
  touch "$out/.complete"
  log "built into $bin"
  echo "$bin"
  exit 0
}

if [[ $mode == node ]]; then
  log "building kubelet, kube-scheduler and kube-controller-manager $KUBERNETES_VERSION (first run only; several minutes)"
  (cd "$work/k8s" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
    -o "$work/bin/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager)
  install_bin
fi

log "building kube-apiserver and kubectl $KUBERNETES_VERSION (first run only; several minutes)"
(cd "$work/k8s" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
  -o "$work/bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl)

# etcd gets its own module: its dependency versions must not be unified with Kubernetes'.
printf 'module cloudnet.local/etcd\ngo %s\nrequire go.etcd.io/etcd/server/v3 %s\n' "$go_directive" "$ETCD_VERSION" >"$work/etcd/go.mod"
log "building etcd $ETCD_VERSION"
(cd "$work/etcd" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
  -o "$work/bin/etcd" go.etcd.io/etcd/server/v3)

install_bin
