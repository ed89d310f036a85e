#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz/ (see tests/fuzz/README.md), built with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer in build-fuzz/.
#
#   scripts/fuzz.sh replay              every target over its committed seed corpus, then a
#                                       short bounded random run (20000 executions or 20 s,
#                                       whichever comes first); the CI stage, ~2 minutes
#   scripts/fuzz.sh campaign N [T...]   N executions per target (all targets, or those
#                                       named: cact schema regex json_canon chat export
#                                       hub validation schema_diff), one
#                                       after the other, growing a working corpus in
#                                       build-fuzz/corpus/<target>; prints executions,
#                                       exec/s, coverage and the time taken per target
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

TARGETS=(cact schema regex json_canon chat export hub validation schema_diff)
BUILD=${FUZZ_BUILD:-build-fuzz}
ARTIFACTS=$BUILD/artifacts

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

build() {
  command -v clang >/dev/null || { echo "fuzz.sh: clang is needed (libFuzzer)" >&2; exit 1; }
  cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DNEEDLE_SANITIZE=ON -DNEEDLE_FUZZ=ON -DNEEDLE_WERROR=ON -DNEEDLE_CUDA=OFF \
    -DNEEDLE_BUILD_TESTS=OFF >/dev/null
  cmake --build "$BUILD" -j "${FUZZ_JOBS:-2}" --target "${TARGETS[@]/#/fuzz_}" >/dev/null
  mkdir -p "$ARTIFACTS"
}

# The seed directory of a target. The loader's seeds are the small fixture models.
seeds() {
  local t=$1
  if [ "$t" = cact ]; then
    local d=$BUILD/seeds-cact
    mkdir -p "$d"
    cp -f tests/fixtures/tiny_cq2.cact tests/fixtures/tiny_ternary.cact tests/fixtures/tinyb_cq2.cact "$d"/
    # Needle 3 (format/cact3.c): the smallest v3 fixture
    cp -f tests/fixtures/v3/v3c.cact "$d"/v3c.cact
    echo "$d"
  else
    echo "tests/fuzz/corpus/$t"
  fi
}

# Per-target options: input size caps that keep each execution short.
options() {
  case $1 in
    cact) echo "-max_len=400000 -rss_limit_mb=4096" ;;
    regex) echo "-max_len=256" ;;
    chat) echo "-max_len=2048" ;;
    export) echo "-max_len=16384" ;;
    schema_diff) echo "-max_len=512" ;;
    *) echo "-max_len=4096" ;;
  esac
}

# run TARGET WORKDIR ARGS...: runs one target, prints its figures, returns its status.
run() {
  local t=$1 work=$2
  shift 2
  local log=$BUILD/fuzz_$t.log start end rc=0
  start=$(date +%s)
  # shellcheck disable=SC2046
  "$BUILD/fuzz_$t" -artifact_prefix="$ARTIFACTS/$t-" -timeout="${FUZZ_TIMEOUT:-30}" -print_final_stats=1 \
    $(options "$t") "$@" "$work" "$(seeds "$t")" >"$log" 2>&1 || rc=$?
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
