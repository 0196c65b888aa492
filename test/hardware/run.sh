#!/usr/bin/env bash
# Unpacks a hardware bundle (npm run bundle:hardware) and runs the Linux-guest
# suite from it on this machine, offline; writes RESULTS_DIR/results.json.
# Needs: Node.js >= 20, tar, xz, /dev/kvm (hardware virtualization for the Linux
# suite; elsewhere results.json says it is not runnable). Time limit: 7.5 minutes.
#   run-hardware.sh torpor-hw.tar.xz RESULTS_DIR [WORK_DIR] [-- run.js options]
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUNDLE.tar.xz RESULTS_DIR [WORK_DIR] [-- --linux-only --limit-s N]" >&2
  exit 2
fi
bundle=$1 results=$2
shift 2
work=
if [[ $# -gt 0 && $1 != -- ]]; then work=$1; shift; fi
[[ ${1:-} == -- ]] && shift
if ! command -v node >/dev/null || ! node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)'; then
  echo "$0: Node.js >= 20 is required (found: $(node --version 2>/dev/null || echo none))" >&2
  exit 1
fi
if [[ -z $work ]]; then
  work=$(mktemp -d /var/tmp/torpor-hw.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work" "$results"
start=$(date +%s%N)
tar --sparse -xJf "$bundle" -C "$work"
echo "unpacked in $(( ($(date +%s%N) - start) / 1000000 )) ms into $work"
timeout --kill-after=10 480 node "$work/torpor-hw/test/hardware/run.js" "$results" "$@"
