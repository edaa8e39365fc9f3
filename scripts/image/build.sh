#!/usr/bin/env bash
# Build the images of deploy/Dockerfile with podman, on a local base image (scripts/image/base.sh)
# and without a registry: rl-sandbox-api and rl-sandbox-worker from deploy/Dockerfile unchanged
# but for its PYTHON_IMAGE build argument, and a local Redis (redis.Containerfile) for compose.
# Layers are cached by podman; a second run with no change rebuilds nothing. Docker's image
# format, not OCI's: OCI has no HEALTHCHECK. RUN steps use the host's network (and resolver).
#
# The build trusts the host's CA bundle (HOST_CA_BUNDLE, default Debian's; empty: don't), mounted
# with pip and uv settings that use it, for RUN steps only: nothing of it is in the images. That
# is what a build behind a TLS-intercepting proxy needs, and harmless elsewhere.
#
# Usage: scripts/image/build.sh     (IMAGE_TAG, default imagetest; writes reports/image/build.json)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root_dir=$(cd "$here/../.." && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
tag=${IMAGE_TAG:-imagetest}
ca=${HOST_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
out=$root_dir/reports/image
mkdir -p "$out"

say() { echo "image/build: $*" >&2; }

t0=$(date +%s)
base=$("$here/base.sh")
t_base=$(( $(date +%s) - t0 ))

tls=()
if [ -n "$ca" ] && [ -f "$ca" ]; then
  tls=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro"
       --volume "$here/build-tls/pip.conf:/etc/pip.conf:ro"
       --volume "$here/build-tls/uv.toml:/etc/uv/uv.toml:ro")
fi

build() {  # name, then podman build arguments
  local name=$1 start; shift
  start=$(date +%s)
  say "building $name:$tag"
  podman build --quiet --format docker --network host "${tls[@]}" --build-arg "PYTHON_IMAGE=$base" -t "$name:$tag" "$@" >/dev/null
  say "$name:$tag in $(( $(date +%s) - start )) s"
}

cd "$root_dir"
build rl-sandbox-api -f deploy/Dockerfile --target api .
build rl-sandbox-worker -f deploy/Dockerfile --target worker .
build rl-sandbox-redis -f "$here/redis.Containerfile" --build-arg "BASE_IMAGE=$base" "$here"
t_all=$(( $(date +%s) - t0 ))

size() { podman image inspect --format '{{.Size}}' "$1"; }
cat >"$out/build.json" <<JSON
{
  "base_image": "$base",
  "base_s": $t_base,
  "total_s": $t_all,
  "size_bytes": {
    "base": $(size "$base"),
    "api": $(size "rl-sandbox-api:$tag"),
    "worker": $(size "rl-sandbox-worker:$tag"),
    "redis": $(size "rl-sandbox-redis:$tag")
  }
}
JSON
say "done in $t_all s: $(tr -d '\n ' <"$out/build.json")"
