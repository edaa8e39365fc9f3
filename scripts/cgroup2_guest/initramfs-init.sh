#!/bin/busybox sh
# The guest's first process: load the virtio, ext4 and 9p modules, mount the root image
# (/dev/vda, a throwaway snapshot of root.img) and the control share, and hand over to
# the run's stage2.sh (written by run.sh into the control share).
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
while read -r m; do
  insmod "/lib/modules/$(basename "$m" | sed 's/\.ko.*//').ko" || echo "initramfs: insmod $m failed"
done < /lib/modules/order
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
mount -t ext4 -o rw,noatime /dev/vda /newroot || {
  echo "initramfs: cannot mount the root"; ls /sys/bus/virtio/devices /dev; cat /proc/partitions; dmesg | tail -20
  echo o >/proc/sysrq-trigger
}
mkdir -p /newroot/cg2ctl
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 ctl /newroot/cg2ctl \
  || { echo "initramfs: cannot mount the control share"; echo o >/proc/sysrq-trigger; }
for d in proc sys dev; do mount --move /$d /newroot/$d; done
exec switch_root /newroot /bin/sh /cg2ctl/stage2.sh
