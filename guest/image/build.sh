#!/usr/bin/env bash
# Builds torpor's base root filesystem: Debian bookworm (mmdebstrap, minbase
# plus the tools a user expects), written to a sparse ext4 image. The agent is
# added by add-agent.sh, so a new agent costs a second, not a debootstrap.
#
# usage: build.sh OUTDIR
#        build.sh --tar OUTDIR
#   OUTDIR/base.ext4      the image (block size 4096, headroom for user files)
#   OUTDIR/packages.txt   name and version of every installed package
#   with --tar, OUTDIR/base.tar instead of base.ext4: the same tree as a tarball
#   (numeric owners, xattrs, sorted names), the one layer of the base as a container
#   image (scripts/build-base-image.ts), which needs no root to become an ext4.
# env:
#   APT_SOURCES   space-separated apt sources files to build from (default: the
#                 host's own enabled files under /etc/apt). No mirror is named
#                 here on purpose: the image comes from wherever this host's apt
#                 is configured to fetch.
#
# The caller runs this in a temporary directory and renames the result into
# place (lib/store), so a failed build never leaves a half-written image.
set -euo pipefail

as_tar=0
if [[ ${1:-} == --tar ]]; then
  as_tar=1
  shift
fi
out=${1:?usage: build.sh [--tar] OUTDIR}
suite=bookworm
# Keep in step with the README's list of what the base image holds.
packages=(bash coreutils findutils grep sed tar gzip procps util-linux iproute2
          ca-certificates python3 sqlite3 sudo curl git)

# As root, mmdebstrap's root mode. As another user only --tar works, in its unshare mode (user
# namespaces: newuidmap and /etc/subuid, /etc/subgid entries); its tarball is the root mode's,
# bit for bit, and the caller turns it into ext4 without root (lib/image).
mode=root
if [[ $(id -u) -ne 0 ]]; then
  if (( ! as_tar )); then
    echo "build.sh: building the ext4 image needs root: mmdebstrap's root mode creates files owned by root" >&2
    echo "build.sh: and mkfs.ext4 -d copies ownership as found. Run the setup as root, or build.sh --tar (unshare mode)." >&2
    exit 3
  fi
  mode=unshare
  command -v newuidmap >/dev/null || { echo "build.sh: mmdebstrap's unshare mode needs newuidmap (apt-get install uidmap)" >&2; exit 2; }
fi
for tool in mmdebstrap mkfs.ext4 du truncate dpkg-query; do
  command -v "$tool" >/dev/null || { echo "build.sh: missing tool '$tool'" >&2; exit 2; }
done

if [[ -z ${APT_SOURCES:-} ]]; then
  APT_SOURCES=""
  [[ -s /etc/apt/sources.list ]] && grep -qE '^\s*deb\s' /etc/apt/sources.list && APT_SOURCES=/etc/apt/sources.list
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -s $f ]] && APT_SOURCES+=" $f"
  done
fi
read -r -a sources <<< "$APT_SOURCES"
(( ${#sources[@]} > 0 )) || { echo "build.sh: this host has no apt sources configured under /etc/apt" >&2; exit 2; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
tree=$out/tree

# Mount points at or below $1 (mountinfo field 5, octal escapes decoded), deepest first.
mounts_under() {
  awk -v t="$1" '{ p = $5; while (match(p, /\\[0-7][0-7][0-7]/)) { c = substr(p, RSTART + 1, 3); p = substr(p, 1, RSTART - 1) sprintf("%c", (substr(c,1,1) * 64) + (substr(c,2,1) * 8) + substr(c,3,1)) substr(p, RSTART + 4) }
    if (p == t || index(p, t "/") == 1) print p }' /proc/self/mountinfo | sort -r
}
# Removes the tree, even after a failed or killed mmdebstrap: whatever it left
# mounted inside (proc, sys, dev binds) is detached first, because a recursive
# delete through a bind mount deletes the host's files (--one-file-system does
# not see a bind mount of the same file system). If a mount will not go, the
# tree stays and the message says how to clear it.
remove_tree() {
  [[ -e $tree ]] || return 0
  local m
  while IFS= read -r m; do umount -l -- "$m" 2>/dev/null || true; done < <(mounts_under "$tree")
  if [[ -n $(mounts_under "$tree") ]]; then
    echo "build.sh: mounts remain under $tree; not deleting it. Clear it with: umount -R $tree && rm -rf $tree" >&2
    return 1
  fi
  rm -rf --one-file-system -- "$tree"
}
remove_tree
trap 'rc=$?; remove_tree || rc=1; exit "$rc"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# What the image must hold, checked inside mmdebstrap (as the image's root, in either mode):
# the agent makes `user` the default user of commands and files (guest/agent/src/users.h).
checks='grep -q "^nobody:" "$1/etc/passwd" || { echo "build.sh: no nobody user in the image" >&2; exit 1; }
grep -q "^user:x:1000:1000:.*:/home/user:/bin/bash\$" "$1/etc/passwd" || { echo "build.sh: no user account (uid 1000, /home/user) in the image" >&2; exit 1; }
[ "$(stat -c %u "$1/home/user")" = 1000 ] || { echo "build.sh: /home/user is not owned by uid 1000" >&2; exit 1; }
chroot "$1" visudo -cq || { echo "build.sh: the image'"'"'s sudoers do not parse" >&2; exit 1; }'
if (( as_tar )); then
  # mmdebstrap writes the tarball itself (sorted, numeric owners, xattrs); the package list
  # comes out of the tree before it is packed.
  target=$out/base.tar.tmp
  output=(--mode="$mode" --format=tar --customize-hook="copy-out /.packages.txt $out" --customize-hook='rm "$1/.packages.txt"')
else
  target=$tree
  output=(--mode=root)
fi

echo "phase: debootstrap $suite (${#packages[@]} packages from ${sources[*]}; $mode mode)"
include=$(IFS=,; echo "${packages[*]}")
# path-exclude: no documentation, man pages or translations (about 40% of the tree).
mmdebstrap \
  --variant=minbase \
  --include="$include" \
  --aptopt='Acquire::Check-Valid-Until "false"' \
  --aptopt='Acquire::Languages "none"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook='echo torpor > "$1/etc/hostname"' \
  --customize-hook='printf "127.0.0.1\tlocalhost\n127.0.1.1\ttorpor\n::1\tlocalhost ip6-localhost ip6-loopback\n" > "$1/etc/hosts"' \
  --customize-hook='grep -q "^nobody:" "$1/etc/passwd" || chroot "$1" useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nobody' \
  --customize-hook='chroot "$1" useradd --create-home --home-dir /home/user --uid 1000 --user-group --groups sudo --shell /bin/bash user' \
  --customize-hook='printf "# torpor: the default user may become root without a password, as in E2B sandboxes.\nuser ALL=(ALL:ALL) NOPASSWD: ALL\n" > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"' \
  --customize-hook='chroot "$1" dpkg-query -W -f="\${Package} \${Version}\n" > "$1/.packages.txt"' \
  --customize-hook="$checks" \
  "${output[@]}" \
  "$suite" "$target" "${sources[@]}"

if (( as_tar )); then
  mv "$out/.packages.txt" "$out/packages.txt"
  mv "$out/base.tar.tmp" "$out/base.tar"
  echo "phase: done tar $(stat -c %s "$out/base.tar") bytes"
  exit 0
fi
mv "$tree/.packages.txt" "$out/packages.txt"

echo "phase: mkfs.ext4"
tree_bytes=$(du -sb "$tree" | cut -f1)
# Headroom: half the tree again plus 256 MiB for the user's files; sparse, so
# the unused part costs no disk until written.
size_mib=$(( (tree_bytes * 3 / 2) / 1048576 + 256 ))
image=$out/base.ext4
truncate -s "${size_mib}M" "$image.tmp"
# A fixed UUID and directory hash seed: two builds from the same tree give the
# same file system layout (root=/dev/vda, so nothing looks the UUID up).
mkfs.ext4 -q -F -d "$tree" -b 4096 -m 0 -L torpor-root \
  -U 5b1f7a0e-3c2d-4e6f-9a8b-7c6d5e4f3a2b -E hash_seed=0f1e2d3c-4b5a-4968-8776-655443322110 "$image.tmp"
mv "$image.tmp" "$image"
echo "phase: done tree ${tree_bytes} bytes, image ${size_mib} MiB ($(du -k "$image" | cut -f1) KiB used)"
