#!/usr/bin/env bash
# Installs the Debian packages that the image build and the one-node cluster need, once: podman
# and buildah build the FROM-scratch images; containerd, runc and the CNI plugins run the node.
# Later calls check `dpkg` and return at once. Needs root (or sudo) only when something is missing.
#
# Usage: packages.sh images|node    installs the set for the image build, or for the node as well
set -euo pipefail

case "${1:-}" in
  images) want=(podman buildah) ;;
  node) want=(podman buildah containerd runc containernetworking-plugins iproute2 iptables) ;;
  *) echo "usage: packages.sh images|node" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)
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
