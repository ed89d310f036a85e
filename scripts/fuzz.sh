#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz/ (see tests/fuzz/README.md), built with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer in build-fuzz/.
#
#   scripts/fuzz.sh replay              every target over its committed seed corpus, then a
#                                       short bounded random run (20000 executions or 20 s,
#                                       whichever comes first); the CI stage, ~2 minutes
#   scripts/fuzz.sh campaign N [T...]   N executions per target (all targets, or those
#                                       named: cact schema regex json_canon chat export
#                                       hub validation schema_diff openai train), one
#                                       after the other, growing a working corpus in
#                                       build-fuzz/corpus/<target>; prints executions,
#                                       exec/s, coverage and the time taken per target
#   (a resumable campaign of one target, corpus kept outside the tree: fuzz-campaign.sh)
#
# Crash reproducers are written to build-fuzz/artifacts/. The committed corpora are never
# written to: new inputs go to a scratch or working directory. Exit 0 only if no target
# crashed, leaked, timed out or ran out of memory. Environment: FUZZ_JOBS, the build's
# parallelism (default 2); FUZZ_BUILD, the build folder (default build-fuzz: a campaign
# in its own folder keeps running while the tree is rebuilt); FUZZ_MAX_TIME, seconds
# after which a campaign target stops short of N (its line says how many ran);
# FUZZ_TIMEOUT, seconds one input may take before it counts as a hang (default 30; raise
# it on a loaded machine, where a niced campaign gets little CPU).
# Campaigns are meant to run under `nice -n 19`.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/fuzz-common.sh
. scripts/fuzz-common.sh
TARGETS=("${FUZZ_TARGETS[@]}")
BUILD=$FUZZ_BUILD_DIR
ARTIFACTS=$BUILD/artifacts

usage() {
  sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

build() {
  fuzz_build
  mkdir -p "$ARTIFACTS"
}

# run TARGET WORKDIR ARGS...: runs one target, prints its figures, returns its status.
run() {
  local t=$1 work=$2
  shift 2
  local log=$BUILD/fuzz_$t.log start end rc=0
  start=$(date +%s)
  # shellcheck disable=SC2046
  "$BUILD/fuzz_$t" -artifact_prefix="$ARTIFACTS/$t-" -timeout="${FUZZ_TIMEOUT:-30}" -print_final_stats=1 \
    $(fuzz_options "$t") "$@" "$work" "$(fuzz_seeds "$t")" >"$log" 2>&1 || rc=$?
  end=$(date +%s)
  local execs speed cov
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  printf '%-11s %s  executions %-10s exec/s %-7s coverage (edges) %-6s %ss\n' "$t" \
    "$([ $rc = 0 ] && echo ok || echo FAILED)" "${execs:-?}" "${speed:-?}" "${cov:-?}" $((end - start))
  if [ $rc != 0 ]; then
    grep -E 'ERROR|SUMMARY|runtime error|invariant|Test unit written' "$log" | head -8
  fi
  return $rc
}

[ $# -ge 1 ] || usage
mode=$1
shift
case $mode in
  replay)
    build
    failed=0
    for t in "${TARGETS[@]}"; do
      work=$(mktemp -d)
      run "$t" "$work" -runs=20000 -max_total_time=20 || failed=1
      rm -rf "$work"
    done
    exit $failed
    ;;
  campaign)
    [ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]] || usage
    n=$1
    shift
    [ $# -ge 1 ] && TARGETS=("$@")
    build
    failed=0
    for t in "${TARGETS[@]}"; do
      mkdir -p "$BUILD/corpus/$t"
      run "$t" "$BUILD/corpus/$t" -runs="$n" ${FUZZ_MAX_TIME:+-max_total_time=$FUZZ_MAX_TIME} || failed=1
    done
    exit $failed
    ;;
  *) usage ;;
esac
