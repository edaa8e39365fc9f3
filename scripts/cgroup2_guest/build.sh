#!/usr/bin/env bash
# Build (or bring up to date) the cgroup v2 test guest in $CACHE (default
# ~/.cache/rl-sandbox/cgroup2-guest, outside the checkout): Debian 12's own kernel, a busybox
# initramfs, and an ext4 root image holding a Debian 12 minbase, the host's Python 3.12 (at its
# own path) and a virtual environment with the service's dependencies. Everything comes from the
# package registries this machine uses (apt's Debian mirror, PyPI through uv). Each stage keeps a
# stamp of what it was built from and is redone only when that changes, so a second run is
# seconds. Needs root (debootstrap, chroot-free ownership of the image's files).
# usage: build.sh [PYTHON]   (PYTHON: the interpreter whose installation the guest gets; default
#                             the one scripts/find-python.sh finds, as `make setup` does)
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "cgroup2-guest build: needs root (apt-get, debootstrap)" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${RL_SANDBOX_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rl-sandbox/cgroup2-guest}
PY=${1:-$("$REPO/scripts/find-python.sh" 3.12)}
GUEST_VENV=/opt/rl-sandbox-guest/venv
# Debian packages of the guest: nsjail's libraries, redis-server for `rl-sandbox up`, iproute2
# and procps as on a real worker host.
GUEST_DEBS=libnl-3-200,libnl-route-3-200,libprotobuf32,redis-server,iproute2,procps
# The kernel modules the initramfs loads, with their dependencies (ext4 asks the crypto API for
# crc32c at mount time, which a busybox initramfs cannot load on demand).
MODULES="virtio_pci virtio_blk crc32c_generic ext4 9pnet_virtio 9p"
HOST_DEBS="qemu-system-x86 debootstrap busybox-static e2fsprogs"
mkdir -p "$CACHE"; cd "$CACHE"
say() { echo "cgroup2-guest build: $*" >&2; }
t0=$(date +%s.%N)
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)"; }
# A stage is redone when its key (what it is built from) differs from the stamp it left.
fresh() { [ -f "stamps/$1" ] && [ "$(cat "stamps/$1")" = "$2" ]; }
done_stage() { mkdir -p stamps; echo "$2" > "stamps/$1"; }
key_of() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

# 1. host tools
missing=""
for p in $HOST_DEBS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  say "installing host packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  # shellcheck disable=SC2086  # one word per package
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $missing >/dev/null
fi

# 2. kernel: Debian's own, uncompressed for a fast direct (PVH) boot, and its modules
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
KERNEL_KEY=$(key_of "$KPKG" "$MODULES")
if ! fresh kernel "$KERNEL_KEY" || [ ! -f vmlinux ]; then
  say "kernel $KPKG"
  rm -rf dl kpkg; mkdir dl kpkg
  (cd dl && apt-get download "$KPKG" >/dev/null 2>&1) || { apt-get update -qq; (cd dl && apt-get download "$KPKG" >/dev/null); }
  dpkg-deb -x dl/*.deb kpkg
  python3 - <<'PY'
import glob, lzma
data = open(glob.glob("kpkg/boot/vmlinuz-*")[0], "rb").read()
open("vmlinux.new", "wb").write(lzma.LZMADecompressor().decompress(data[data.find(b"\xfd7zXZ\x00"):]))
PY
  mv vmlinux.new vmlinux
  # 3. initramfs: busybox, the modules (dependencies first), an init that mounts the ext4 root
  rm -rf initramfs; mkdir -p initramfs/{bin,dev,proc,sys,newroot,lib/modules}
  cp /bin/busybox initramfs/bin/
  KDIR=$(echo kpkg/lib/modules/*)
  # shellcheck disable=SC2086  # one word per module
  python3 - "$KDIR" $MODULES > initramfs/lib/modules/order <<'PY'
import os, re, sys
kdir, wanted = sys.argv[1], sys.argv[2:]
# The package ships no modules.dep (depmod makes it at install): read each module's
# dependencies from its own .modinfo section ("depends=a,b").
paths = {}
for top, _, files in os.walk(os.path.join(kdir, "kernel")):
    for f in files:
        if ".ko" in f:
            paths[f.split(".ko")[0].replace("-", "_")] = os.path.relpath(os.path.join(top, f), kdir)
def depends(name):
    path = os.path.join(kdir, paths[name])
    data = open(path, "rb").read()
    if path.endswith(".xz"):
        import lzma; data = lzma.decompress(data)
    found = re.search(rb"depends=([^\0]*)", data)
    return [d for d in (found.group(1).decode().split(",") if found else []) if d]
order, seen = [], set()
def visit(name):
    name = name.replace("-", "_")
    if name in seen or name not in paths:
        return  # built into the kernel
    seen.add(name)
    for dep in depends(name):
        visit(dep)
    order.append(paths[name])
for name in wanted:
    visit(name)
print("\n".join(order))
PY
  while read -r mod; do
    out=initramfs/lib/modules/$(basename "$mod" | sed 's/\.ko.*//').ko
    case "$mod" in
      *.xz) xz -dc "$KDIR/$mod" > "$out" ;;
      *.zst) zstd -qdc "$KDIR/$mod" > "$out" ;;
      *) cp "$KDIR/$mod" "$out" ;;
    esac
  done < initramfs/lib/modules/order
  cp "$HERE/initramfs-init.sh" initramfs/init; chmod +x initramfs/init
  (cd initramfs && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > initrd.gz
  rm -rf dl kpkg initramfs
  done_stage kernel "$KERNEL_KEY"
fi
# the initramfs's init is ours: rebuild the cpio when it changes (cheap)
if ! fresh init "$(key_of "$KERNEL_KEY" "$(sha256sum < "$HERE/initramfs-init.sh")")"; then
  mkdir -p initramfs && (cd initramfs && gzip -dc ../initrd.gz | busybox cpio -id 2>/dev/null)
  cp "$HERE/initramfs-init.sh" initramfs/init; chmod +x initramfs/init
  (cd initramfs && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > initrd.gz
  rm -rf initramfs
  done_stage init "$(key_of "$KERNEL_KEY" "$(sha256sum < "$HERE/initramfs-init.sh")")"
fi

# 4. root: Debian 12 minbase from the mirror apt uses here
MIRROR=${DEBIAN_MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOT_KEY=$(key_of bookworm "$GUEST_DEBS")
if ! fresh rootfs "$ROOT_KEY" || [ ! -x rootfs/usr/bin/redis-server ]; then
  say "debootstrap bookworm minbase + $GUEST_DEBS from $MIRROR"
  rm -rf rootfs
  debootstrap --variant=minbase --include="$GUEST_DEBS" bookworm rootfs "$MIRROR" >/dev/null
  rm -rf rootfs/var/cache/apt/archives/*.deb rootfs/var/lib/apt/lists/*
  done_stage rootfs "$ROOT_KEY"
  rm -f stamps/python stamps/venv
fi

# 5. the host's Python installation, at the same path (pyenv builds link libpython by that path)
BASE=$("$PY" -c 'import os, sys; print(os.path.realpath(sys.base_prefix))')
PY_KEY=$(key_of "$BASE" "$("$PY" -VV)")
if ! fresh python "$PY_KEY"; then
  say "python $BASE"
  rm -rf "rootfs$BASE"; mkdir -p "rootfs$(dirname "$BASE")"
  tar -C "$BASE" --exclude=test --exclude=idlelib --exclude=tkinter --exclude=turtledemo -cf - . \
    | tar -C "rootfs$(dirname "$BASE")" --one-top-level="$(basename "$BASE")" -xf -
  # the jailed uid must traverse every directory above it (as scripts/make-runtime-traversable.sh)
  d=$BASE; while [ "$d" != / ]; do chmod o+x "rootfs$d"; d=$(dirname "$d"); done
  done_stage python "$PY_KEY"
  rm -f stamps/venv
fi

# 6. the guest's virtual environment: the service's dependencies and pytest's plugins (the
# project itself is the checkout, shared into the guest at run time)
UV=${UV:-$(command -v uv || echo "$REPO/.venv/bin/uv")}
REQS=$("$PY" - "$REPO/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
dev = project["optional-dependencies"]["dev"]
test = [d for d in dev if d.split(">")[0].split("=")[0].split("[")[0] in ("pytest", "pytest-asyncio", "pytest-timeout")]
print("\n".join(project["dependencies"] + test))
PY
)
VENV_KEY=$(key_of "$PY_KEY" "$REQS")
if ! fresh venv "$VENV_KEY"; then
  say "virtual environment $GUEST_VENV"
  rm -rf "rootfs$GUEST_VENV"
  "$UV" venv -q --relocatable --python "$PY" "rootfs$GUEST_VENV"
  printf '%s\n' "$REQS" > reqs.txt
  "$UV" pip install -q --compile-bytecode --python "rootfs$GUEST_VENV/bin/python" -r reqs.txt
  cat > "rootfs$GUEST_VENV/bin/rl-sandbox" <<SH
#!/bin/sh
exec $GUEST_VENV/bin/python -m sandbox_service.cli "\$@"
SH
  chmod 755 "rootfs$GUEST_VENV/bin/rl-sandbox"
  d=$GUEST_VENV; while [ "$d" != / ]; do chmod o+x "rootfs$d"; d=$(dirname "$d"); done
  done_stage venv "$VENV_KEY"
fi

# 7. the ext4 image (the root must not be 9p: see docs/deploy.md, "cgroup v2 test guest")
IMG_KEY=$(key_of "$ROOT_KEY" "$PY_KEY" "$VENV_KEY")
if ! fresh image "$IMG_KEY" || [ ! -f root.img ]; then
  say "ext4 image"
  mkdir -p rootfs/cg2ctl
  size_mb=$(( $(du -sm rootfs | cut -f1) + 512 ))
  rm -f root.img.new
  mke2fs -q -t ext4 -L cg2root -E root_owner=0:0 -d rootfs root.img.new "${size_mb}M" >/dev/null
  mv root.img.new root.img
  done_stage image "$IMG_KEY"
fi
say "ready in $(elapsed) s: $CACHE ($(du -sh root.img | cut -f1) image)"
