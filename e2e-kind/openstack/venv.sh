#!/usr/bin/env bash
# Installs Neutron's and Keystone's servers (and gunicorn to serve them) from PyPI into a Python
# venv in the cache, keyed by their versions and the Python version, once; later calls only print
# the venv directory (its bin/ holds gunicorn and keystone-manage).
#
# Usage: venv.sh            prints the venv directory
# Env:   CLOUDNET_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet)
#        PYTHON              interpreter to build the venv with (default python3)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "venv.sh: $python is not installed" >&2; exit 1; }
py_version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
cache_root=${CLOUDNET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet}
out="$cache_root/venv/openstack-neutron$NEUTRON_VERSION-keystone$KEYSTONE_VERSION-gunicorn$GUNICORN_VERSION-py$py_version"

if [[ -x "$out/bin/keystone-manage" && -f "$out/.complete" ]]; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache_root/venv"
# Several test processes may ask at once; only one installs.
exec 9>"$cache_root/venv/.openstack.lock"
flock 9
if [[ -f "$out/.complete" ]]; then echo "$out"; exit 0; fi

log() { echo "venv.sh: $*" >&2; }

log "installing neutron==$NEUTRON_VERSION keystone==$KEYSTONE_VERSION for Python $py_version (first run only, about 2 minutes)"
# A venv records its own path in its scripts, so it cannot be built elsewhere and moved; it is
# built in place and only `.complete` marks it usable, so an interrupted install is redone.
rm -rf "$out"
"$python" -m venv "$out"
"$out/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  "neutron==$NEUTRON_VERSION" "keystone==$KEYSTONE_VERSION" "gunicorn==$GUNICORN_VERSION" >&2 \
  || { rm -rf "$out"; exit 1; }
for tool in keystone-manage gunicorn; do
  [[ -x "$out/bin/$tool" ]] || { log "$tool missing after install"; rm -rf "$out"; exit 1; }
done
"$out/bin/python" -c "import neutron, keystone, gunicorn" >&2 || { rm -rf "$out"; exit 1; }
touch "$out/.complete"
log "installed into $out"
echo "$out"
