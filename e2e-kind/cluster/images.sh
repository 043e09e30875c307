#!/usr/bin/env bash
# Builds the three FROM-scratch images (and the one-node cluster's sandbox image) with podman from
# binaries already built, and saves each as an OCI archive in the cache. An archive is rebuilt only
# when its inputs (binary, Containerfile, CA bundle, shell, tag, labels) change: its name carries
# their digest. The reconciler's image also holds a shell for the network operator's hosted-control-
# plane command (`/bin/bash -c` a loop of `sleep 1`, `date -Iseconds`, `[[ ]]`, `(( ))`, then `exec`
# of the controller): Debian's bash-static as /bin/bash and busybox-static with only its `sleep` and
# `date` applets linked (packages.sh shell), all static, so a release image stays free of libraries.
#
# Usage: images.sh WEBHOOK_BIN RECONCILER_BIN NODE_BIN
#                                               prints the directory holding
#                                               cloudnet-webhook.oci.tar, cloudnet-reconciler.oci.tar,
#                                               cloudnet-node.oci.tar and cloudnet-pause.oci.tar
#                                               (symlinks to the current ones)
# Env:   CLOUDNET_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet)
#        CLOUDNET_IMAGES_DIR where the archives go (default $CLOUDNET_CACHE_DIR/images), so that a
#                            branch's images need not replace the ones other checkouts test with
#        CLOUDNET_IMAGE_TAG  tag of the three images (default dev): localhost/cloudnet-<name>:<tag>;
#                            `make release-images` passes the workspace version. Only a dev image
#                            may hold a dynamically linked binary (the dev build's, with its loader
#                            and libraries); any other tag needs a static one.
# Every image carries the OCI labels org.opencontainers.image.version (the workspace version in
# Cargo.toml, the one place it is set), .revision (the checkout's commit) and .source (the
# workspace's repository).
set -euo pipefail

[[ $# -eq 3 ]] || { echo "usage: images.sh WEBHOOK_BIN RECONCILER_BIN NODE_BIN" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache_root=${CLOUDNET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cloudnet}
out=${CLOUDNET_IMAGES_DIR:-$cache_root/images}
tag=${CLOUDNET_IMAGE_TAG:-dev}
ca_bundle=/etc/ssl/certs/ca-certificates.crt
log() { echo "images.sh: $*" >&2; }
workspace_field() { sed -n '/^\[workspace\.package\]/,/^\[/s/^'"$1"' = "\(.*\)"$/\1/p' "$repo/Cargo.toml"; }
version=$(workspace_field version)
source_url=$(workspace_field repository)
[[ -n $version && -n $source_url ]] || { log "no version or repository in [workspace.package] of $repo/Cargo.toml"; exit 1; }
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
labels=(
  --label "org.opencontainers.image.version=$version"
  --label "org.opencontainers.image.revision=$revision"
  --label "org.opencontainers.image.source=$source_url"
)

"$here/packages.sh" images
mapfile -t shell_trees < <("$here/packages.sh" shell "$cache_root/debian")
[[ ${#shell_trees[@]} -eq 2 ]] || { log "packages.sh shell did not print bash-static's and busybox-static's trees"; exit 1; }
shell_bash="${shell_trees[0]}/bin/bash-static"
shell_busybox="${shell_trees[1]}/bin/busybox"
# The only commands the hosted-control-plane script runs that bash does not build in.
shell_applets=(sleep date)
for f in "$shell_bash" "$shell_busybox"; do
  [[ -x $f ]] || { log "$f is not an executable"; exit 1; }
  file -L "$f" | grep -q 'statically linked' || { log "$f is not statically linked"; exit 1; }
done
[[ -f $ca_bundle ]] || { log "no CA bundle at $ca_bundle (Debian package ca-certificates)"; exit 1; }
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

# A private podman store in the cache: nothing shared with the machine's podman, and one place to
# clean. vfs needs no overlay mount; the images are two layers of a few MiB each.
podman=(podman --root "$out/store" --runroot "$out/run" --storage-driver vfs)

# [with_shell=1] image NAME BINARY CONTAINERFILE [ALIAS...]: builds localhost/NAME:TAG into
# NAME.oci.tar. Each ALIAS (an absolute path) becomes a symbolic link to the binary, in the
# context's links/ tree (which also carries a dev binary's loader and libraries, and with
# with_shell=1 /bin/bash, /bin/busybox and its applets' links), which the Containerfile copies
# whole (a scratch image has no shell to RUN ln in; copying a directory keeps its links as links).
image() {
  local name=$1 binary=$2 containerfile=$3
  local aliases=("${@:4}")
  local shell=()
  [[ ${with_shell:-0} != 1 ]] || shell=("$shell_bash" "$shell_busybox")
  [[ -x $binary ]] || { log "$binary is not an executable"; exit 1; }
  # A dynamically linked binary (the dev build, which the test images reuse rather than compile
  # the workspace a second time) brings its loader and libraries; a release image holds a static
  # binary and nothing else.
  local libs=()
  if file -L "$binary" 2>/dev/null | grep -q 'dynamically linked'; then
    [[ $tag == dev ]] || { log "$binary is dynamically linked; a release image needs a static one (make release-images)"; exit 1; }
    mapfile -t libs < <(ldd "$binary" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) .*/\1/p')
    [[ ${#libs[@]} -gt 0 ]] || { log "ldd found no libraries of the dynamically linked $binary"; exit 1; }
  fi
  local digest
  digest=$({
    cat "$binary" "$containerfile" "$ca_bundle"
    [[ ${#libs[@]} -eq 0 ]] || cat "${libs[@]}"
    [[ ${#shell[@]} -eq 0 ]] || { cat "${shell[@]}"; printf '%s\n' "${shell_applets[@]}"; }
    printf '%s\n' "$tag" "${labels[@]}"
    [[ ${#aliases[@]} -eq 0 ]] || printf '%s\n' "${aliases[@]}"
  } | sha256sum | cut -c1-16)
  local archive="$out/$name-$digest.oci.tar"
  if [[ ! -f $archive ]]; then
    local ctx
    ctx=$(mktemp -d "$out/.ctx.XXXXXX")
    cp "$ca_bundle" "$ctx/ca-certificates.crt"
    cp "$containerfile" "$ctx/Containerfile"
    mkdir -p "$ctx/links"
    if [[ ${#libs[@]} -eq 0 ]]; then
      cp "$binary" "$ctx/$(basename "$binary")"
    else
      # The dev build's debug line tables are of no use in an image and triple its size.
      strip --strip-debug -o "$ctx/$(basename "$binary")" "$binary"
      local lib
      for lib in "${libs[@]}"; do
        mkdir -p "$ctx/links$(dirname "$lib")"
        cp -L "$lib" "$ctx/links$lib"
      done
    fi
    local alias
    for alias in "${aliases[@]}"; do
      mkdir -p "$ctx/links$(dirname "$alias")"
      ln -s "/usr/local/bin/$(basename "$binary")" "$ctx/links$alias"
    done
    if [[ ${#shell[@]} -gt 0 ]]; then
      mkdir -p "$ctx/links/bin"
      cp "$shell_bash" "$ctx/links/bin/bash"
      cp "$shell_busybox" "$ctx/links/bin/busybox"
      local applet
      for applet in "${shell_applets[@]}"; do
        ln -s busybox "$ctx/links/bin/$applet"
      done
    fi
    # --timestamp 0: the same inputs give the same image digest.
    "${podman[@]}" build --quiet --timestamp 0 --format oci -t "localhost/$name:$tag" "${labels[@]}" \
      -f "$ctx/Containerfile" "$ctx" >/dev/null
    local labelled
    labelled=$("${podman[@]}" image inspect --format '{{index .Labels "org.opencontainers.image.version"}}' "localhost/$name:$tag")
    [[ $labelled == "$version" ]] || { log "localhost/$name:$tag is labelled version '$labelled', not $version"; exit 1; }
    rm -f "$archive.tmp"
    "${podman[@]}" save --quiet --format oci-archive -o "$archive.tmp" "localhost/$name:$tag"
    mv "$archive.tmp" "$archive"
    rm -rf "$ctx"
    # Older archives of this image: the cache keeps only the current one.
    find "$out" -maxdepth 1 -name "$name-*.oci.tar" ! -name "$(basename "$archive")" -delete
    log "built localhost/$name:$tag ($(du -k "$archive" | cut -f1) KiB archive)"
  fi
  ln -sfn "$(basename "$archive")" "$out/$name.oci.tar"
}

image cloudnet-webhook "$1" "$repo/webhook/Containerfile"
# Also where OpenShift's network operator runs the controller it replaces.
with_shell=1 image cloudnet-reconciler "$2" "$repo/reconciler/Containerfile" /usr/bin/cloud-network-config-controller
image cloudnet-node "$3" "$repo/node-agent/Containerfile"
pause_bin="$out/pause-bin/pause"
if [[ ! -x $pause_bin || "$here/pause/pause.c" -nt $pause_bin ]]; then
  mkdir -p "$out/pause-bin"
  gcc -static -Os -o "$pause_bin.tmp" "$here/pause/pause.c"
  mv "$pause_bin.tmp" "$pause_bin"
fi
image cloudnet-pause "$pause_bin" "$here/pause/Containerfile"
echo "$out"
