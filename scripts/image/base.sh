#!/usr/bin/env bash
# Build the base image that deploy/Dockerfile's PYTHON_IMAGE points at, without a registry:
# a Debian bookworm root made by debootstrap from Debian's packages, with CPython 3.12 in
# /usr/local (where python:3.12-slim-bookworm has it), imported with `podman import`.
#
# Debian bookworm ships Python 3.11 and no registry this project reaches ships a CPython 3.12
# build (uv's python-build-standalone downloads come from GitHub), so the interpreter is the
# CPython 3.12 that `make setup` uses (scripts/find-python.sh: PATH, then pyenv), copied without
# its test suite, IDLE, Tk, static library, headers and site-packages; pip comes from its own
# ensurepip. The libraries it links against are installed from Debian into the root. Needs
# debootstrap, patchelf and podman on the host (`make image-test` installs them).
#
# Cached: the image's tag carries a hash of this script and of the interpreter, and an existing
# image of that tag is reused. Prints the image's name on stdout.
# Usage: scripts/image/base.sh [--rebuild]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root_dir=$(cd "$here/../.." && pwd)
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What CPython's extension modules link against, plus what python:3.12-slim-bookworm carries.
packages=ca-certificates,netbase,tzdata,libssl3,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,zlib1g,libreadline8,libncursesw6,libuuid1,libgdbm6,libgdbm-compat4,libexpat1,libtirpc3,libnsl2,libdb5.3

say() { echo "image/base: $*" >&2; }

python=$("$root_dir/scripts/find-python.sh" 3.12)
prefix=$("$python" -c 'import sys; print(sys.base_prefix)')
version=$("$python" -c 'import platform; print(platform.python_version())')
key=$( { cat "$0"; echo "$suite $mirror $packages"; sha256sum "$prefix/bin/python$(echo "$version" | cut -d. -f1,2)"; } \
  | sha256sum | cut -c1-12)
image=localhost/rl-sandbox-base:$suite-py$version-$key

if [ "${1:-}" != --rebuild ] && podman image exists "$image"; then
  say "cached: $image"
  echo "$image"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rl-sandbox-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs=$work/root
start=$(date +%s)
say "debootstrap $suite (minbase) into $rootfs"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; say "debootstrap failed"; exit 1; }

# The same sources as Debian's own container images, for `apt-get install` in later stages.
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
EOF
# Like Debian's container images: no documentation, no apt caches in the image.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/rl-sandbox-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
echo 'APT::Install-Recommends "false";' >"$rootfs/etc/apt/apt.conf.d/90rl-sandbox-norecommends"
# apt's binary caches are ~80 MB that every `apt-get update` of a later stage would leave behind.
cat >"$rootfs/etc/apt/apt.conf.d/90rl-sandbox-clean" <<'EOF'
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; };
EOF
find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
rm -rf "$rootfs"/usr/share/{man,info,locale}/* "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log

say "CPython $version from $prefix into /usr/local"
short=$(echo "$version" | cut -d. -f1,2)
install -d "$rootfs/usr/local/bin" "$rootfs/usr/local/lib"
cp -a "$prefix/bin/python$short" "$rootfs/usr/local/bin/"
cp -a "$prefix"/lib/libpython"$short".so* "$prefix/lib/libpython3.so" "$rootfs/usr/local/lib/"
tar -C "$prefix/lib" -c \
  --exclude="python$short/test" --exclude="python$short/idlelib" --exclude="python$short/tkinter" \
  --exclude="python$short/turtledemo" --exclude="python$short/config-$short-*" \
  --exclude="python$short/site-packages/*" --exclude='*/__pycache__' --exclude='*_test.*.so' \
  --exclude='*_tkinter*' "python$short" | tar -C "$rootfs/usr/local/lib" -x
for name in python3 python; do ln -sf "python$short" "$rootfs/usr/local/bin/$name"; done
# The interpreter was linked with an rpath into its old prefix. Like python:3.12-slim's, it finds
# libpython next to itself ($ORIGIN/../lib): the jail mounts /usr but not /etc/ld.so.cache.
patchelf --set-rpath "\$ORIGIN/../lib" "$rootfs/usr/local/bin/python$short"
chroot "$rootfs" /sbin/ldconfig
chroot "$rootfs" /usr/local/bin/python3 -m ensurepip --default-pip >/dev/null
chroot "$rootfs" /usr/local/bin/python3 -c \
  'import ssl, ctypes, sqlite3, lzma, bz2, zlib, hashlib, uuid, readline, decimal; print("stdlib ok")' >&2
rm -rf "$rootfs/root/.cache"
find "$rootfs/usr/local" -name __pycache__ -prune -exec rm -rf {} +

say "importing $image"
tar --numeric-owner -C "$rootfs" -c . | podman import \
  --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --message "debootstrap $suite + CPython $version (scripts/image/base.sh)" \
  - "$image" >/dev/null
say "built $image in $(( $(date +%s) - start )) s"
echo "$image"
