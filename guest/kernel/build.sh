#!/usr/bin/env bash
# Builds torpor's guest kernel (vmlinux with a PVH entry note) from Debian's
# linux-source-6.1 package.
#
# usage: build.sh OUTDIR
#   OUTDIR/vmlinux   the kernel (ELF, PVH note, loaded directly by the VMM)
#   OUTDIR/config    the full .config it was built with
# env:
#   LINUX_SOURCE_TARBALL  source tarball (default /usr/src/linux-source-6.1.tar.xz)
#   KERNEL_JOBS           parallel jobs (default: nproc)
#   KERNEL_WORKDIR        where to unpack and build (default OUTDIR/.work, removed on success)
#
# The caller (lib/setup, through the artifact store) runs this in a temporary
# directory and renames the result into place, so a failed build never leaves a
# half-written kernel where a VMM would find it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: build.sh OUTDIR}
tarball=${LINUX_SOURCE_TARBALL:-/usr/src/linux-source-6.1.tar.xz}
jobs=${KERNEL_JOBS:-$(nproc)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${KERNEL_WORKDIR:-$out/.work}

if [[ ! -r $tarball ]]; then
  echo "build.sh: kernel source $tarball not found; install it with: apt-get install linux-source-6.1" >&2
  exit 2
fi
for tool in make gcc flex bison bc perl xz; do
  command -v "$tool" >/dev/null || { echo "build.sh: missing tool '$tool'" >&2; exit 2; }
done

mkdir -p "$work"
echo "phase: unpack $(basename "$tarball")"
tar -xJf "$tarball" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'linux-*' | head -n1)
[[ -n $src ]] || { echo "build.sh: no linux-* directory in $tarball" >&2; exit 2; }

echo "phase: configure"
# allnoconfig + our fragment: only what we ask for (and what it needs) is on.
make -s -C "$src" ARCH=x86_64 allnoconfig KCONFIG_ALLCONFIG="$here/torpor.config"
make -s -C "$src" ARCH=x86_64 olddefconfig
"$here/verify-config.sh" "$here/torpor.config" "$src/.config"

echo "phase: compile (jobs=$jobs)"
# KBUILD_BUILD_* pin the version banner so rebuilds from the same inputs match.
make -C "$src" ARCH=x86_64 -j"$jobs" \
  KBUILD_BUILD_USER=torpor KBUILD_BUILD_HOST=torpor \
  KBUILD_BUILD_TIMESTAMP="${KBUILD_BUILD_TIMESTAMP:-1970-01-01}" \
  vmlinux

cp "$src/vmlinux" "$out/vmlinux.tmp"
cp "$src/.config" "$out/config"
mv "$out/vmlinux.tmp" "$out/vmlinux"
if [[ -z ${KERNEL_WORKDIR:-} ]]; then rm -rf "$work"; fi
echo "phase: done $(stat -c %s "$out/vmlinux") bytes"
