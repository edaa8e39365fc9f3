#!/usr/bin/env bash
# Run a shell command inside the cgroup v2 test guest (build.sh makes it) and exit with its
# status. QEMU with software emulation (TCG): the development machines' KVM is paravirtual and
# cannot boot a stock kernel. The guest is Debian 12's kernel with only the unified hierarchy
# mounted, the root is a throwaway snapshot of the ext4 image, and the checkout (WORKDIR) is
# shared read-write at its own path over 9p.
# usage: run.sh 'command args...'
# env: WORKDIR (default: the checkout), MEM (MiB, 2048), SMP (2), TIMEOUT (s, 1200: a backstop;
#      a guest that stalls is killed and the run fails), CG2_CGROUP (the cgroup the command
#      starts in, default system.slice/rl-sandbox.service as under systemd; empty: the root),
#      ROOT_CONTROLLERS (enabled in the root's cgroup.subtree_control before the command; default
#      none, as on a host whose init delegated nothing: the service must do it itself).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${RL_SANDBOX_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rl-sandbox/cgroup2-guest}
WORKDIR=${WORKDIR:-$REPO}
[ $# -ge 1 ] || { echo "usage: $0 'command'" >&2; exit 2; }
for f in vmlinux initrd.gz root.img; do
  [ -f "$CACHE/$f" ] || { echo "cgroup2-guest: $CACHE/$f is missing: run $HERE/build.sh" >&2; exit 2; }
done
CTL=$(mktemp -d "${TMPDIR:-/tmp}/cg2guest-ctl.XXXXXX"); trap 'rm -rf "$CTL"' EXIT
printf '%s\n' "$*" > "$CTL/cmd"
echo "$WORKDIR" > "$CTL/workdir"
echo "${CG2_CGROUP-system.slice/rl-sandbox.service}" > "$CTL/cgroup"
echo "${ROOT_CONTROLLERS:-}" > "$CTL/root_controllers"
echo 255 > "$CTL/rc"
cp "$HERE/stage2.sh" "$CTL/stage2.sh"
started=$(date +%s.%N)
status=0
timeout --foreground -k 5 "${TIMEOUT:-1200}" qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu max -smp "${SMP:-2}" -m "${MEM:-2048}" \
  -display none -nodefaults -no-reboot -serial stdio -monitor none \
  -kernel "$CACHE/vmlinux" -initrd "$CACHE/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off rdinit=/init" \
  -drive file="$CACHE/root.img",format=raw,if=virtio,snapshot=on,cache=unsafe \
  -virtfs local,path="$CTL",mount_tag=ctl,security_model=none \
  -virtfs local,path="$WORKDIR",mount_tag=work,security_model=none,multidevs=remap \
  </dev/null || status=$?
wall=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$started" "$(date +%s.%N)")
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "cgroup2-guest: killed after TIMEOUT=${TIMEOUT:-1200} s (the guest stalled or the command ran too long)" >&2
  exit 124
fi
rc=$(cat "$CTL/rc")
echo "cgroup2-guest: exit status $rc, ${wall} s from qemu start to power-off" >&2
exit "$rc"
