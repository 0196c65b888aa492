#!/bin/sh
# The control experiment for the nested host's guest failures (docs/nested.md):
# our guest kernel and image on 2 vCPUs under QEMU with KVM *inside L1* (the
# same emulated SVM and L1 KVM, a different VMM than torpor), under heavy
# device and interrupt load. If guests fail here too, the emulated stack is at
# fault, not torpor. Run it through the nested host:
#   npm run test:linux -- sh test/nested/qemu-stress.sh [SECONDS] [VCPUS]
# Outside L1 it runs the same guest under QEMU's TCG instead (no KVM at all).
set -eu
seconds=${1:-300}
vcpus=${2:-2}
home=${TORPOR_HOME:-$HOME/.local/share/torpor}
kernel=$(ls "$home"/artifacts/kernel/*/vmlinux | head -n1)
rootfs=$(ls "$home"/artifacts/rootfs/*/rootfs.ext4 | head -n1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The guest's PID 1 is a shell reading this script from the serial console (QEMU's
# stdin): microvm appends its virtio_mmio.device= arguments at the end of the
# command line, so init arguments after "--" would receive those. The leading
# blank lines absorb whatever the UART drops while its driver starts. Each round:
# 50 MiB of random data written to a tmpfs, read back and hashed by python3 on one
# vCPU while the other streams the root disk with O_DIRECT reads (interrupts and
# MMIO exits on both).
{ i=0; while [ $i -lt 64 ]; do echo; i=$((i+1)); done; } > "$work/script"
cat >> "$work/script" <<SCRIPT
PS1= PS2=
mount -t proc proc /proc
mount -t tmpfs tmpfs /tmp
end=\$(( \$(cut -d. -f1 /proc/uptime) + $seconds ))
i=0
while [ \$(cut -d. -f1 /proc/uptime) -lt \$end ]; do
  dd if=/dev/vda of=/dev/null bs=256k count=1600 iflag=direct 2>/dev/null &
  python3 -c "import os,hashlib; d=os.urandom(50<<20); open('/tmp/b','wb').write(d); assert hashlib.sha256(open('/tmp/b','rb').read()).digest()==hashlib.sha256(d).digest()" || printf 'QSTRESS-%s\\n' HASH-MISMATCH
  wait
  i=\$((i+1))
  printf 'qstress: round %s at %s s\\n' \$i \$(cut -d' ' -f1 /proc/uptime)
done
printf 'QSTRESS-%s %s rounds\\n' DONE \$i
exit 0
SCRIPT

# Inside L1 (TORPOR_NESTED=1, set by test/nested/run.ts) /dev/kvm is SVM KVM; on a
# PVM host it cannot boot this kernel, so elsewhere the guest runs on TCG.
if [ -n "${TORPOR_NESTED:-}" ]; then accel=kvm cpu=host; else accel=tcg,thread=multi cpu=max; fi
echo "qemu-stress: $kernel on $vcpus vCPUs, accel $accel, $seconds s"
set +e
timeout $((seconds + 300)) qemu-system-x86_64 -accel $accel -cpu $cpu -M microvm,acpi=off -m 512 -smp "$vcpus" \
  -display none -monitor none -no-reboot -serial stdio \
  -kernel "$kernel" \
  -append "console=ttyS0 panic=1 pci=off acpi=off root=/dev/vda ro init=/bin/sh" \
  -drive "id=root,file=$rootfs,format=raw,if=none,readonly=on" -device virtio-blk-device,drive=root \
  < "$work/script" > "$work/console" 2>&1
rc=$?
set -e
# (The tty echoes the script as it arrives: the markers are printed with printf
# so that the echoed source never matches them.)
grep -E 'qstress: round [0-9]|QSTRESS-(DONE|HASH)|Kernel panic|BUG|Oops|RIP|triple|rcu' "$work/console" | tail -n 40
if grep -q 'QSTRESS-DONE' "$work/console" && ! grep -qE 'QSTRESS-HASH-MISMATCH|BUG|Oops' "$work/console"; then
  echo "qemu-stress: passed (qemu exit $rc)"
  exit 0
fi
echo "qemu-stress: FAILED (qemu exit $rc); console tail:"
tail -n 60 "$work/console"
exit 1
