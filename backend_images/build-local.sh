#!/usr/bin/env bash
# Build the CPU DSpark worker image with Podman and no registry.
#
#   backend_images/build-local.sh            -> prints the image name (stdout) when done
#
# - The Debian base is made once per machine with debootstrap and imported into Podman
#   (nothing is pulled); from it, a tiny pause image for GPUStack's Podman deployer.
# - The image is tagged with a hash of everything that goes into it (Containerfile, lock,
#   package sources); when that tag exists the build is skipped, so CI builds once per machine.
# - pip inside the build reads this host's wheel folders, local indexes and CA bundle through
#   build volumes when the host has them (torch 2.13.0+cpu is only in the local folder here);
#   the host's pip config does not apply inside a build, so it is passed as options.
# Podman settings (private store, sandbox fixes) come from CONTAINERS_CONF /
# CONTAINERS_STORAGE_CONF; `python -m gpustack_dspark.devstack image` sets them and calls this.
# Env: DSPARK_IMAGE (extra tag, e.g. the plugin's default gpustack-dspark-worker:0.1.0-cpu),
# DSPARK_BASE_IMAGE, DSPARK_PAUSE_IMAGE, DSPARK_PODMAN_ULIMITS (e.g. "nofile=N:N nproc=N:N"),
# PODMAN (default podman).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${DSPARK_BASE_IMAGE:-localhost/debian-minbase:bookworm}"
PAUSE="${DSPARK_PAUSE_IMAGE:-localhost/gpustack-dspark-pause:1}"
PODMAN="${PODMAN:-podman}"
pm() { "$PODMAN" "$@"; }
log() { echo "[build-local] $*" >&2; }

hash_inputs() {
  (cd "$ROOT" && find backend_images/cpu/Containerfile backend_images/cpu/requirements.lock \
      pyproject.toml README.md gpustack_dspark -type f ! -name '*.pyc' ! -path '*/__pycache__/*' \
      -print0 | sort -z | xargs -0 sha256sum; echo "$BASE") | sha256sum | cut -c1-16
}
HASHED="localhost/gpustack-dspark-worker:cpu-$(hash_inputs)"

tag_extra() { if [ -n "${DSPARK_IMAGE:-}" ]; then pm tag "$HASHED" "$DSPARK_IMAGE" >&2; fi; }

if ! pm image exists "$BASE"; then
  command -v debootstrap >/dev/null \
    || { log "debootstrap is needed to make the base image: apt-get install -y debootstrap"; exit 1; }
  log "making the Debian base $BASE with debootstrap (once per machine)"
  rootfs="$(mktemp -d)"
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase bookworm "$rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
  tar -C "$rootfs" -c . | pm import - "$BASE" >&2
  rm -rf "$rootfs"
fi

if ! pm image exists "$PAUSE"; then
  # Holds the pod's namespaces; exits at once on SIGTERM (a plain `sleep` as PID 1 would not).
  log "making the pause image $PAUSE"
  printf 'FROM %s\nCMD ["/bin/sh", "-c", "trap \\"exit 0\\" TERM INT; sleep infinity & wait"]\n' "$BASE" \
    | pm build --network none -t "$PAUSE" -f - "$ROOT/backend_images" >&2
fi

if pm image exists "$HASHED"; then
  tag_extra
  echo "$HASHED"
  exit 0
fi

build_args=(--network host -f "$ROOT/backend_images/cpu/Containerfile" --build-arg "BASE_IMAGE=$BASE")
# RUN steps get Podman's own rlimits, not containers.conf's: a host that may not raise them
# (no CAP_SYS_RESOURCE) passes its limits here (docs/containers.md).
for limit in ${DSPARK_PODMAN_ULIMITS:-}; do build_args+=(--ulimit "$limit"); done
pip_extra=""
PIP="${PIP:-python3 -m pip}"
mounted=" "
mount_dir() {  # a host folder pip reads, at the same path inside the build
  [ -d "$1" ] && [[ "$mounted" != *" $1 "* ]] && build_args+=(-v "$1:$1:ro") && mounted+="$1 "
}
for folder in ${PIP_FIND_LINKS:-} $($PIP config get global.find-links 2>/dev/null || true); do
  if mount_dir "$folder"; then pip_extra+=" --find-links $folder"; fi
done
for index in ${PIP_EXTRA_INDEX_URL:-} $($PIP config get global.extra-index-url 2>/dev/null || true); do
  # a local index's pages link to files beside it (e.g. /opt/pypi/simple -> /opt/pypi/files)
  if [[ "$index" == file://* ]] && mount_dir "$(dirname "${index#file://}")"; then
    pip_extra+=" --extra-index-url $index"
  fi
done
ca=/etc/ssl/certs/ca-certificates.crt
if [ -f "$ca" ]; then
  build_args+=(-v "$ca:/etc/ssl/certs/host-ca.crt:ro")
  pip_extra+=" --cert /etc/ssl/certs/host-ca.crt"
fi
log "building $HASHED"
pm build "${build_args[@]}" --build-arg "PIP_EXTRA=$pip_extra" -t "$HASHED" "$ROOT" >&2
tag_extra
echo "$HASHED"
