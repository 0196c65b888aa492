#!/usr/bin/env bash
# Runs every libFuzzer target (or those named) for SECONDS each, one after the
# other, from its committed seed corpus (native/fuzz/corpus/<target>, read
# only) plus a working corpus that persists between campaigns
# ($FUZZ_WORK/<target>, default native/test/out/fuzz/work, git-ignored), and
# prints inputs, inputs/s and coverage (edges) per target. Exits non-zero at
# the first crash, leak, undefined behaviour (the builds' -fno-sanitize-recover),
# timeout or out-of-memory (the reproducer is left in $FUZZ_WORK/artifacts).
#   native/fuzz/campaign.sh                  10 minutes each, all targets
#   native/fuzz/campaign.sh 45               CI: 45 s each
#   native/fuzz/campaign.sh 36000 vsock      a long run of one target
#   FUZZ_RUNS=100000000 native/fuzz/campaign.sh 10800 vsock
#                                            stop at 10^8 inputs (or at 3 h, whichever comes first)
#   FUZZ_JOBS=2 ...                          one campaign on 2 cores: 2 fuzzer processes on the one
#                                            working corpus (libFuzzer -jobs, each reloading what the
#                                            other finds), FUZZ_RUNS split between them, inputs summed
# Long campaigns: run under nice (the CI host is shared), e.g. nice -n 19.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
seconds=${1:-600}
shift || true
# host_codec is the host side of the agent protocol (TypeScript: test/fuzz/host-codec-fuzz.ts),
# run by Node with structure-aware random inputs (no coverage feedback, no corpus).
all=(vsock net virtqueue snapshot_loader agent_frame overlay_map kernel_loader host_codec)
targets=("${@:-${all[@]}}")
native=()
for t in "${targets[@]}"; do [[ $t == host_codec ]] || native+=("$t"); done
bin=$(cd "$here/.." && pwd)/test/out/fuzz  # as the Makefile names it (make matches targets textually)
work=${FUZZ_WORK:-$bin/work}
# UBSan's report with the stack that reached it (it prints none by default); options of the
# caller's own come after, so they win.
export UBSAN_OPTIONS=print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}
(( ${#native[@]} == 0 )) || make -s -C "$here" -j2 $(printf "$bin/%s_libfuzzer " "${native[@]}")
mkdir -p "$work/artifacts"
work=$(cd "$work" && pwd)  # absolute: FUZZ_JOBS runs the fuzzers from another directory
rows=()
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  log=$work/$t.log
  rc=0
  jobs=${FUZZ_JOBS:-1}
  mode=one
  if [[ $t == host_codec ]]; then mode=node; elif (( jobs > 1 )); then mode=jobs; fi
  case $mode in
    node)
      (cd "$here/../.." && FUZZ_WORK="$work" node --import tsx test/fuzz/host-codec-fuzz.ts "$seconds") > "$log" 2>&1 || rc=$? ;;
    one)
      "$bin/${t}_libfuzzer" -max_total_time="$seconds" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} -print_final_stats=1 \
        -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$work/artifacts/$t-" "$work/$t" "$here/corpus/$t" > "$log" 2>&1 || rc=$? ;;
    jobs)
      # libFuzzer's -jobs: N whole fuzzer processes at once, each with its own log
      # (fuzz-<i>.log, in the directory it starts in) and its share of FUZZ_RUNS, all reading and
      # adding to the one working corpus. (-fork runs short jobs instead: each starts a process,
      # replays its share of the corpus and starts its input-length limit small again.)
      started=$SECONDS
      logs=$work/$t.jobs
      rm -rf "$logs" && mkdir -p "$logs"
      (cd "$logs" && "$bin/${t}_libfuzzer" -jobs="$jobs" -workers="$jobs" -max_total_time="$seconds" \
        ${FUZZ_RUNS:+-runs=$(( (FUZZ_RUNS + jobs - 1) / jobs ))} -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$work/artifacts/$t-" "$work/$t" "$here/corpus/$t") > "$log" 2>&1 || rc=$?
      cat "$logs"/fuzz-*.log >> "$log" ;;
  esac
  if [[ $mode == jobs ]]; then
    runs=$(cat "$logs"/fuzz-*.log | sed -n 's/^stat::number_of_executed_units: *//p' | awk '{ n += $1 } END { print n + 0 }')
    rate=$(( runs / (SECONDS - started > 0 ? SECONDS - started : 1) ))
    # Each process's "cov" is its own view: count the edges of the corpus they left, the usual
    # way (one pass, no fuzzing).
    cov=$("$bin/${t}_libfuzzer" -runs=0 -rss_limit_mb=2048 "$work/$t" "$here/corpus/$t" 2>&1 | grep -o 'cov: [0-9]*' | tail -1 | cut -d' ' -f2 || true)
  else
    # One process (host_codec prints the same stat lines).
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  fi
  corpus=$(ls "$work/$t" | wc -l)
  rows+=("$(printf '%-16s %12s %10s %8s %8s' "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" "$corpus")")
  if (( rc != 0 )); then
    tail -40 "$log" >&2
    echo "campaign: $t FAILED (exit $rc); log $log, reproducer under $work/artifacts" >&2
    printf '%s\n' "${rows[@]}"
    exit "$rc"
  fi
done
echo "fuzz campaign: ${seconds} s per target on $(nproc) CPUs ($(uname -n)), clang $(clang --version | sed -n 's/.*version \([0-9.]*\).*/\1/p' | head -1)"
printf '%-16s %12s %10s %8s %8s\n' target inputs inputs/s edges corpus
printf '%s\n' "${rows[@]}"
