#!/usr/bin/env bash
# Installs the Debian packages that the image build and the one-node cluster need, once: podman
# and buildah build the FROM-scratch images; containerd, runc and the CNI plugins run the node.
# Later calls check `dpkg` and return at once. Needs root (or sudo) only when something is missing.
#
# Usage: packages.sh images|node    installs the set for the image build, or for the node as well
#        packages.sh shell DIR      unpacks the reconciler image's shell under DIR (once per
#                                   version) and prints the two unpacked trees, bash-static's then
#                                   busybox-static's: downloaded with `apt-get download`, never
#                                   installed (busybox-static conflicts with the machine's busybox)
set -euo pipefail

sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)

# unpacked PACKAGE DIR: the package's candidate version unpacked at DIR/PACKAGE_VERSION, printed.
unpacked() {
  local package=$1 dir=$2 version
  candidate() { apt-cache policy "$package" 2>/dev/null | sed -n 's/^  Candidate: //p'; }
  version=$(candidate)
  if [[ -z $version || $version == "(none)" ]]; then
    # An old or empty package list finds nothing; refresh it once.
    "${sudo[@]}" apt-get update -qq >&2
    version=$(candidate)
  fi
  [[ -n $version && $version != "(none)" ]] || { echo "packages.sh: Debian has no $package" >&2; exit 1; }
  local tree="$dir/${package}_${version//:/%3a}"
  if [[ ! -d $tree ]]; then
    mkdir -p "$dir"
    local download
    download=$(mktemp -d "$dir/.download.XXXXXX")
    # apt drops to its own user to download, who cannot reach a directory under root's home:
    # as root, download as root.
    local as=()
    [[ $(id -u) -ne 0 ]] || as=(-o APT::Sandbox::User=root)
    (cd "$download" && apt-get download -qq "${as[@]}" "$package=$version" >&2)
    dpkg-deb -x "$download"/*.deb "$download/tree"
    mv "$download/tree" "$tree"
    rm -rf "$download"
  fi
  echo "$tree"
}

case "${1:-}" in
  images) want=(podman buildah) ;;
  node) want=(podman buildah containerd runc containernetworking-plugins iproute2 iptables) ;;
  shell)
    [[ $# -eq 2 ]] || { echo "usage: packages.sh shell DIR" >&2; exit 2; }
    mkdir -p "$(dirname "$2")"
    exec 9>"$2.lock"
    flock 9
    unpacked bash-static "$2"
    unpacked busybox-static "$2"
    exit 0 ;;
  *) echo "usage: packages.sh images|node|shell DIR" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "packages.sh: installing ${missing[*]} (first run only)" >&2
# Several test processes may ask at once; only one installs (dpkg's own lock would fail the others).
exec 9>/tmp/cloudnet-packages.lock
flock 9
export DEBIAN_FRONTEND=noninteractive
# An old or empty package list finds nothing; refresh it once per install.
"${sudo[@]}" apt-get update -qq >&2
# --no-install-recommends: podman's recommends pull in a slirp, fuse and a whole desktop of helpers.
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
# The Debian containerd package starts a system containerd; the node runs its own, privately.
if [[ " ${missing[*]} " == *" containerd "* ]] && command -v systemctl >/dev/null; then
  "${sudo[@]}" systemctl disable --now containerd >/dev/null 2>&1 || true
fi
