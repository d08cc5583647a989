#!/usr/bin/env bash
# Build the CPU DSpark worker image with Podman and no registry.
#
#   backend_images/build-local.sh            -> prints the image name when done
#
# - The Debian base is made once per machine with debootstrap and imported into Podman
#   (nothing is pulled).
# - The image is tagged with a hash of everything that goes into it (Containerfile, lock,
#   package sources); when that tag exists the build is skipped, so CI builds once per machine.
# - pip inside the build reads this host's wheel folder and CA bundle through build volumes
#   when the host has them (see shared notes: torch 2.13.0+cpu is only in the local folder).
# Env: DSPARK_IMAGE (default gpustack-dspark-worker:0.1.0-cpu, the plugin's --dspark-cpu-image
# default), DSPARK_BASE_IMAGE, PODMAN (default podman), PODMAN_ARGS (extra global podman args,
# e.g. --root/--runroot for a private store).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${DSPARK_IMAGE:-gpustack-dspark-worker:0.1.0-cpu}"
BASE="${DSPARK_BASE_IMAGE:-localhost/debian-minbase:bookworm}"
PODMAN="${PODMAN:-podman}"
read -r -a PODMAN_ARGS <<< "${PODMAN_ARGS:-}"
pm() { "$PODMAN" "${PODMAN_ARGS[@]}" "$@"; }

hash_inputs() {
  (cd "$ROOT" && find backend_images/cpu/Containerfile backend_images/cpu/requirements.lock \
      pyproject.toml README.md gpustack_dspark -type f ! -name '*.pyc' ! -path '*/__pycache__/*' \
      -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}
HASH="$(hash_inputs)"
HASHED="localhost/gpustack-dspark-worker:cpu-${HASH}"

if pm image exists "$HASHED"; then
  pm tag "$HASHED" "$IMAGE"
  echo "$IMAGE"
  exit 0
fi

if ! pm image exists "$BASE"; then
  command -v debootstrap >/dev/null || { echo "debootstrap is needed to make the base image" >&2; exit 1; }
  rootfs="$(mktemp -d)"
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >&2
  tar -C "$rootfs" -c . | pm import - "$BASE" >&2
fi

build_args=(--network host -f "$ROOT/backend_images/cpu/Containerfile" --build-arg "BASE_IMAGE=$BASE")
pip_extra=""
for folder in $(pip config get global.find-links 2>/dev/null || true); do
  [ -d "$folder" ] && build_args+=(-v "$folder:$folder:ro") && pip_extra+=" --find-links $folder"
done
ca=/etc/ssl/certs/ca-certificates.crt
if [ -f "$ca" ]; then
  build_args+=(-v "$ca:/etc/ssl/certs/host-ca.crt:ro")
  pip_extra+=" --cert /etc/ssl/certs/host-ca.crt"
fi
pm build "${build_args[@]}" --build-arg "PIP_EXTRA=$pip_extra" -t "$HASHED" "$ROOT" >&2
pm tag "$HASHED" "$IMAGE"
echo "$IMAGE"
