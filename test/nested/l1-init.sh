#!/bin/sh
# PID 1 of the nested test host's L1 (see docs/nested.md). Started by the
# kernel (init=) from the host's root filesystem, which L1 sees read-only over
# 9p. It mounts what a userspace needs, sets the clock, copies TORPOR_HOME into
# a tmpfs, checks that /dev/kvm is a hardware-virtualization KVM, runs the
# command test/nested/run.ts wrote into the run share, writes its exit status
# there and ends L1 through sysrq (QEMU runs with -no-reboot).
#
# Everything it prints goes to the serial console, which the runner shows live.
# Lines starting with "nested: " are markers the runner reads.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

finish() {
  echo "$1" > /run/nested/status
  sync
  echo "nested: exit status $1"
  echo b > /proc/sysrq-trigger
  sleep 60
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /run/nested /run/home-src

checkout=
hostdate=
for arg in $(cat /proc/cmdline); do
  case $arg in
    nested.checkout=*) checkout=${arg#nested.checkout=} ;;
    hostdate=*) hostdate=${arg#hostdate=} ;;
  esac
done
# L1 has no RTC (torpor.config leaves it out): the host's time, passed on the command line.
[ -n "$hostdate" ] && date -s "@$hostdate" > /dev/null

opts=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o $opts,cache=none run /run/nested || { echo "nested: cannot mount the run share"; echo b > /proc/sysrq-trigger; }
echo "nested: userspace at $(cut -d' ' -f1 /proc/uptime) s"
# A heartbeat on the console for the runner, however quiet the command: when they stop, L1
# itself has stopped (QEMU's emulated CPU spinning without progress;
# docs/nested.md#emulated-machine), and the runner ends the run instead of waiting for its
# overall timeout.
(while sleep 30; do echo "nested: alive at $(cut -d' ' -f1 /proc/uptime) s"; done) &
# A checkout under /tmp lies under L1's tmpfs now: make its mount point there.
mkdir -p "$checkout" 2> /dev/null
mount -t 9p -o $opts,cache=loose checkout "$checkout" || finish setup
mount -t 9p -o $opts,cache=loose,ro torporhome /run/home-src || finish setup

. /run/nested/env
export HOME=/tmp/home TMPDIR=/tmp
mkdir -p "$HOME" "$TORPOR_HOME"
# cp -a keeps modes and mtimes, so the store's cheap checks (size, mtime, head
# hash) pass and nothing is rebuilt inside L1.
t0=$(cut -d' ' -f1 /proc/uptime)
(cd /run/home-src && xargs -d '\n' -a /run/nested/home-paths cp -a --parents -t "$TORPOR_HOME") || finish setup
echo "nested: TORPOR_HOME copied into tmpfs ($(du -sm "$TORPOR_HOME" | cut -f1) MiB, from ${t0} s to $(cut -d' ' -f1 /proc/uptime) s)"

# Loopback for the tests' own servers, and an interface for the sandboxes' network backend
# (passt takes the addresses and default route of an interface as its template): one end
# of a veth pair whose other end goes nowhere, so nothing leaves L1.
ip link set lo up
if ip link add eth0 type veth peer name eth0-peer 2> /dev/null; then
  ip link set eth0-peer up && ip addr add 192.0.2.2/24 dev eth0 && ip link set eth0 up &&
    ip route add default via 192.0.2.1 || echo "nested: could not set up eth0 for the sandbox network"
else
  echo "nested: no veth in this L1 kernel: sandboxes get no network backend"
fi

cd "$checkout" || finish setup
if [ ! -c /dev/kvm ]; then
  echo "nested: no /dev/kvm in L1; its kernel log about KVM and SVM:"
  dmesg | grep -iE 'kvm|svm' | tail -n 20
  finish nokvm
fi
node bin/torpor.js doctor > /run/nested/doctor.txt 2>&1
if ! grep -qE '^Host kind: +hardware' /run/nested/doctor.txt || ! grep -qE '^Missing: +nothing' /run/nested/doctor.txt; then
  echo "nested: torpor doctor inside L1 does not report a hardware-virtualization host with nothing missing:"
  cat /run/nested/doctor.txt
  finish hostkind
fi
echo "nested: doctor says hardware at $(cut -d' ' -f1 /proc/uptime) s; running: $(cat /run/nested/command)"
sh /run/nested/command < /dev/null
finish $?
