#!/usr/bin/env bash
# Writes the guest agent into a copy of the base image, as /usr/sbin/torpor-agent
# (root:root, 0755), without mounting anything (debugfs edits the ext4 file
# directly, so no root is needed). The kernel starts it with
# init=/usr/sbin/torpor-agent.
#
# usage: add-agent.sh BASE_IMAGE AGENT OUT_IMAGE
#        add-agent.sh --in-place IMAGE AGENT
#   --in-place writes into IMAGE itself (lib/image/ext4.ts: an image's root
#   filesystem, just built by mke2fs in a temporary directory); /usr/sbin must exist.
set -euo pipefail
usage="usage: add-agent.sh BASE_IMAGE AGENT OUT_IMAGE | add-agent.sh --in-place IMAGE AGENT"
in_place=0
if [[ ${1:-} == --in-place ]]; then
  in_place=1
  shift
  base=${1:?$usage}
  agent=${2:?$usage}
  out=$base
else
  base=${1:?$usage}
  agent=${2:?$usage}
  out=${3:?$usage}
fi
export PATH=$PATH:/usr/sbin:/sbin
for tool in debugfs e2fsck resize2fs dumpe2fs; do
  command -v "$tool" >/dev/null || { echo "add-agent.sh: missing tool '$tool' (e2fsprogs)" >&2; exit 2; }
done
[[ -f $agent ]] || { echo "add-agent.sh: agent binary $agent is missing" >&2; exit 2; }
case $agent in *[[:space:]\"]*) echo "add-agent.sh: agent path must not contain spaces or quotes: $agent" >&2; exit 2 ;; esac

if (( in_place )); then
  work=$out
else
  work=$out.tmp
  cp --sparse=always "$base" "$work"
  # The stored base is read-only (lib/store), and cp keeps its mode: debugfs -w needs to write the copy.
  chmod u+w "$work"
fi
# An image without /usr or /usr/sbin (a scratch image) gets them, root:root 0755.
for dir in /usr /usr/sbin; do
  if ! debugfs -R "stat $dir" "$work" 2>/dev/null | grep -q 'Type: directory'; then
    debugfs -w -f - "$work" >/dev/null 2>&1 <<CMDS
mkdir $dir
set_inode_field $dir mode 040755
set_inode_field $dir uid 0
set_inode_field $dir gid 0
CMDS
  fi
done
# debugfs reports failures on stderr but still exits 0 (and `rm` of a file that is
# not there is expected): check the result explicitly below instead.
debugfs -w -f - "$work" >/dev/null 2>&1 <<CMDS
rm /usr/sbin/torpor-agent
write $agent /usr/sbin/torpor-agent
set_inode_field /usr/sbin/torpor-agent mode 0100755
set_inode_field /usr/sbin/torpor-agent uid 0
set_inode_field /usr/sbin/torpor-agent gid 0
CMDS
stat=$(debugfs -R 'stat /usr/sbin/torpor-agent' "$work" 2>/dev/null)
want=$(stat -c %s "$agent")
grep -qE "Size: ${want}\b" <<< "$stat" || { echo "add-agent.sh: /usr/sbin/torpor-agent was not written ($want bytes expected)" >&2; exit 1; }
grep -qE 'Mode: +0755' <<< "$stat" || { echo "add-agent.sh: /usr/sbin/torpor-agent has the wrong mode" >&2; exit 1; }
# At least 1 GiB free for the user's files (npm install of a real project): the base image
# grows offline (resize2fs on the sparse file, ~50 ms); free space costs no host disk until
# written. The guest mounts with noinit_itable, so the new groups' inode tables (holes, read as
# zeros) are not zeroed again into every template's and sandbox's disk. (An image's root
# filesystem is sized by lib/image/ext4.ts before this runs in place.)
if (( ! in_place )); then
  min_free=$(( 1024 * 1048576 ))
  block=$(dumpe2fs -h "$work" 2>/dev/null | awk -F: '/^Block size/ { gsub(/ /, "", $2); print $2 }')
  free=$(dumpe2fs -h "$work" 2>/dev/null | awk -F: '/^Free blocks/ { gsub(/ /, "", $2); print $2 }')
  if (( free * block < min_free )); then
    truncate -s +$(( min_free - free * block + 64 * 1048576 )) "$work"
    resize2fs -f "$work" >/dev/null 2>&1 || { echo "add-agent.sh: resize2fs could not grow $work" >&2; exit 1; }
  fi
fi
e2fsck -fn "$work" >/dev/null
(( in_place )) || mv "$work" "$out"
echo "add-agent.sh: $out holds the agent ($want bytes)"
