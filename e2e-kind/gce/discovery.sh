#!/usr/bin/env bash
# Installs google-api-python-client from PyPI (without its dependencies: only its bundled
# discovery documents are used) into a Python venv in the cache, keyed by its version, once;
# prints the path of the Compute v1 discovery document it ships.
#
# Usage: discovery.sh        prints .../googleapiclient/discovery_cache/documents/compute.v1.json
# Env:   CLOUDNET_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet)
#        PYTHON              interpreter to build the venv with (default python3)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "discovery.sh: $python is not installed" >&2; exit 1; }
py_version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
cache_root=${CLOUDNET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet}
out="$cache_root/venv/google-api-python-client-$GOOGLE_API_PYTHON_CLIENT_VERSION-py$py_version"
doc="$out/compute.v1.json"

if [[ -f "$doc" && -f "$out/.complete" ]]; then
  echo "$doc"
  exit 0
fi

mkdir -p "$cache_root/venv"
# Several test processes may ask at once; only one installs.
exec 9>"$cache_root/venv/.google-api-python-client.lock"
flock 9
if [[ -f "$out/.complete" ]]; then echo "$doc"; exit 0; fi

log() { echo "discovery.sh: $*" >&2; }

log "installing google-api-python-client==$GOOGLE_API_PYTHON_CLIENT_VERSION (first run only)"
rm -rf "$out"
"$python" -m venv "$out"
"$out/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-deps \
  "google-api-python-client==$GOOGLE_API_PYTHON_CLIENT_VERSION" >&2 || { rm -rf "$out"; exit 1; }
# Found through the package's own location, not a guessed site-packages path.
src=$("$out/bin/python" -c 'import importlib.util, os
spec = importlib.util.find_spec("googleapiclient")
print(os.path.join(os.path.dirname(spec.origin), "discovery_cache", "documents", "compute.v1.json"))')
[[ -f "$src" ]] || { log "compute.v1.json missing after install ($src)"; rm -rf "$out"; exit 1; }
cp "$src" "$doc"
touch "$out/.complete"
log "installed into $out"
echo "$doc"
