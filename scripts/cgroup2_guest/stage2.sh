#!/bin/sh
# PID 1 of the guest after the initramfs: a cgroup v2 host with nothing delegated yet, the
# checkout at its own path, then the command. Powers the guest off when the command ends.
export PATH=/opt/rl-sandbox-guest/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
for d in /tmp /run /var/tmp /dev/shm; do mkdir -p $d && mount -t tmpfs -o mode=1777 tmpfs $d; done
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
ip link set lo up
hostname cg2guest
printf "127.0.0.1 localhost cg2guest\n::1 localhost ip6-localhost\n" > /etc/hosts  # debootstrap writes none
W=$(cat /cg2ctl/workdir)
mkdir -p "$W" && mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576,cache=mmap work "$W" \
  || echo "cg2guest: cannot mount $W"
export PYTHONPATH="$W"
RC=$(cat /cg2ctl/root_controllers)
[ -z "$RC" ] || echo "$RC" | sed 's/[^ ][^ ]*/+&/g' > /sys/fs/cgroup/cgroup.subtree_control
CG=$(cat /cg2ctl/cgroup)
if [ -n "$CG" ]; then mkdir -p "/sys/fs/cgroup/$CG" && echo $$ > "/sys/fs/cgroup/$CG/cgroup.procs"; fi
cd "$W" || cd /
echo "=== cg2guest: kernel $(uname -r), $(nproc) CPUs, in cgroup $(cut -d: -f3 /proc/self/cgroup)," \
  "root delegates [$(cat /sys/fs/cgroup/cgroup.subtree_control)], booted in $(cut -d' ' -f1 /proc/uptime) s"
bash -c "$(cat /cg2ctl/cmd)" </dev/null
echo $? > /cg2ctl/rc
sync
exec 2>/dev/null; echo o > /proc/sysrq-trigger; while :; do sleep 1; done
