#!/usr/bin/env bash
# Build the CPU DSpark worker image with Podman, no registry and no download.
#
#   backend_images/build-local.sh            -> prints the image name (stdout) when done
#   backend_images/build-local.sh --name     -> prints the name the image will have; builds nothing
#   backend_images/build-local.sh --base     -> makes only the Debian base, the pause image and
#                                               the runtime base (no venv needed); prints the
#                                               runtime base's name
#
# - The Debian base is made once per machine with debootstrap and imported into Podman
#   (nothing is pulled); from it, a tiny pause image for GPUStack's Podman deployer and the
#   runtime base (cpu/Containerfile.base: python3.11 from Debian), each once per machine.
# - The locked Python packages are not fetched or installed again: `make setup` installed
#   the same lock (cpu/requirements.lock) into the worker venv (DSPARK_WORKER_VENV, default
#   .venv-worker); cpu/venv_for_image.py checks that it is exactly the lock and runs on
#   bookworm, and the build copies its site-packages through a read-only build volume.
#   Reinstalling ~150 wheels inside the build took minutes of CPU (docs/containers.md).
# - This package goes in as a wheel built here with the project venv's setuptools
#   (no build isolation: nothing fetched).
# - The image is tagged with a hash of everything that goes into it (Containerfiles, lock,
#   package sources); when that tag exists the build is skipped, so CI builds once per machine.
# Progress: "[build-local] ..." lines and Podman's "STEP n/m" lines on stderr (the devstack
# stamps them with the elapsed time and keeps the whole output in its build log).
# Podman settings (private store, sandbox fixes) come from CONTAINERS_CONF /
# CONTAINERS_STORAGE_CONF; `python -m gpustack_dspark.devstack image` sets them and calls this.
# Env: DSPARK_IMAGE (extra tag, e.g. the plugin's default gpustack-dspark-worker:0.1.0-cpu),
# DSPARK_BASE_IMAGE, DSPARK_PAUSE_IMAGE, DSPARK_PODMAN_ULIMITS (e.g. "nofile=N:N nproc=N:N"),
# DSPARK_WORKER_VENV, PYTHON (builds the package wheel; default .venv/bin/python), PODMAN.
set -euo pipefail

mode="${1:-}"
case "$mode" in
  ""|--name|--base) ;;
  *) echo "usage: $0 [--name|--base] (got '$mode')" >&2; exit 2 ;;
esac
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${DSPARK_BASE_IMAGE:-localhost/debian-minbase:bookworm}"
PAUSE="${DSPARK_PAUSE_IMAGE:-localhost/gpustack-dspark-pause:1}"
PODMAN="${PODMAN:-podman}"
WORKER_VENV="${DSPARK_WORKER_VENV:-$ROOT/.venv-worker}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
pm() { "$PODMAN" "$@"; }
log() { echo "[build-local] $*" >&2; }

hash_files() { (cd "$ROOT" && find "$@" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 \
                 | sort -z | xargs -0 sha256sum) }
RUNTIME="localhost/gpustack-dspark-cpu-base:bookworm-$( (hash_files backend_images/cpu/Containerfile.base; echo "$BASE") \
  | sha256sum | cut -c1-12)"
HASHED="localhost/gpustack-dspark-worker:cpu-$( (hash_files backend_images/cpu pyproject.toml README.md gpustack_dspark \
  ui-patches; echo "$RUNTIME") | sha256sum | cut -c1-16)"

if [ "$mode" = --name ]; then
  echo "$HASHED"
  exit 0
fi

tag_extra() { if [ -n "${DSPARK_IMAGE:-}" ]; then pm tag "$HASHED" "$DSPARK_IMAGE" >&2; fi; }
limits=()
# RUN steps get Podman's own rlimits, not containers.conf's: a host that may not raise them
# (no CAP_SYS_RESOURCE) passes its limits here (docs/containers.md).
for limit in ${DSPARK_PODMAN_ULIMITS:-}; do limits+=(--ulimit "$limit"); done

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
  log "making the pause image $PAUSE (once per machine)"
  printf 'FROM %s\nCMD ["/bin/sh", "-c", "trap \\"exit 0\\" TERM INT; sleep infinity & wait"]\n' "$BASE" \
    | pm build --network none -t "$PAUSE" -f - "$ROOT/backend_images" >&2
fi

make_runtime_base() {
  if ! pm image exists "$RUNTIME"; then
    log "making the runtime base $RUNTIME: python3.11 from Debian (once per machine)"
    pm build --network host "${limits[@]}" -f "$ROOT/backend_images/cpu/Containerfile.base" \
      --build-arg "BASE_IMAGE=$BASE" -t "$RUNTIME" "$ROOT/backend_images" >&2
  fi
}
if [ "$mode" = --base ]; then
  make_runtime_base
  echo "$RUNTIME"
  exit 0
fi

if pm image exists "$HASHED"; then
  tag_extra
  echo "$HASHED"
  exit 0
fi

# Checked before the slow parts: a worker venv that is not the lock fails here, in one line.
stage="$(mktemp -d)"
trap 'rm -rf "$stage" "${rootfs:-}"' EXIT
log "checking the worker venv $WORKER_VENV against the lock"
site="$(python3 "$ROOT/backend_images/cpu/venv_for_image.py" "$WORKER_VENV" \
  "$ROOT/backend_images/cpu/requirements.lock" "$stage/exclude")"

make_runtime_base

log "building this package's wheel"
wheel_dir="$ROOT/build/cpu-image-wheel"
rm -rf "$wheel_dir" && mkdir -p "$wheel_dir" "$stage/src"
# From a copy: an in-tree setuptools build would leave build/lib and egg-info in the checkout.
(cd "$ROOT" && cp -r pyproject.toml README.md gpustack_dspark ui-patches "$stage/src/")
# setuptools' own build hook, in-process: what `pip wheel --no-build-isolation` runs, minus pip.
(cd "$stage/src" && "$PYTHON" -c 'import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])' \
  "$wheel_dir") >&2

log "building $HASHED from $site"
pm build --network none "${limits[@]}" -f "$ROOT/backend_images/cpu/Containerfile" \
  --build-arg "RUNTIME_BASE=$RUNTIME" \
  -v "$site:/build/site-packages:ro" -v "$WORKER_VENV/bin:/build/bin:ro" -v "$stage/exclude:/build/exclude:ro" \
  -t "$HASHED" "$ROOT" >&2
rm -rf "$wheel_dir"
tag_extra
echo "$HASHED"
