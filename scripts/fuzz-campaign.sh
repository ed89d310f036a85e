#!/usr/bin/env bash
# A resumable fuzz campaign for one libFuzzer target of tests/fuzz/ (see its README).
#
#   scripts/fuzz-campaign.sh TARGET EXECS
#
# TARGET: cact_v2 cact_v3 (fuzz_cact seeded with the Needle 2 or the Needle 3 fixtures),
# schema schema_diff regex json_canon export (the safetensors / tokenizer / config readers)
# hub validation chat openai (the server's request bodies). EXECS: executions for this run
# (libFuzzer -runs).
#
# The working corpus lives outside the tree, in $FUZZ_CORPUS_ROOT/TARGET (default
# ~/.cache/needle-fuzz), so a campaign resumes where the last one stopped and a rebuild or a
# checkout never loses it; it is seeded from tests/fuzz/corpus/ or the fixture models on
# every run (libFuzzer reads both directories, writes only to the first). One process (no
# -jobs/-fork: the machine is shared; run it under `nice -n 19`). Findings (crash-, leak-,
# timeout-, oom- reproducers) go to $FUZZ_CORPUS_ROOT/TARGET.findings/. The last line
# is the figures of this run, also appended to $FUZZ_CORPUS_ROOT/TARGET.log with the
# running total over every run of that corpus.
#
# Environment: FUZZ_BUILD (build folder, default build-fuzz; built here unless
# FUZZ_NO_BUILD=1), FUZZ_MAX_TIME (seconds after which the run stops short of EXECS),
# FUZZ_TIMEOUT (seconds one input may take before it is a hang, default 30).
# Exit status: 0 when no finding was written by this run, 1 when one was, 2 on bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/fuzz-common.sh
. scripts/fuzz-common.sh

usage() {
  sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# = 2 ] && [[ $2 =~ ^[0-9]+$ ]] || usage
name=$1 execs=$2
case $name in
  cact_v2 | cact_v3) target=cact ;;
  schema | schema_diff | regex | json_canon | export | hub | validation | chat | openai) target=$name ;;
  *) echo "fuzz-campaign.sh: unknown target '$name'" >&2; usage ;;
esac

root=${FUZZ_CORPUS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/needle-fuzz}
corpus=$root/$name findings=$root/$name.findings
mkdir -p "$corpus" "$findings"
[ "${FUZZ_NO_BUILD:-0}" = 1 ] || fuzz_build "fuzz_$target"
seeddir=$(fuzz_seeds "$name")

log=$(mktemp)
trap 'rm -f "$log"' EXIT
before=$(find "$findings" -type f | wc -l)
files_before=$(find "$corpus" -type f | wc -l)
start=$(date +%s)
rc=0
# shellcheck disable=SC2046
"$FUZZ_BUILD_DIR/fuzz_$target" -artifact_prefix="$findings/" -timeout="${FUZZ_TIMEOUT:-30}" \
  -print_final_stats=1 -runs="$execs" ${FUZZ_MAX_TIME:+-max_total_time=$FUZZ_MAX_TIME} \
  $(fuzz_options "$target") "$corpus" "$seeddir" >"$log" 2>&1 || rc=$?
secs=$(( $(date +%s) - start ))
ran=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
# libFuzzer's own figure counts from its start and reads 0 under a second
[ "${ran:-0}" -gt 0 ] && [ "$secs" -gt 0 ] && speed=$((ran / secs))
new=$(( $(find "$findings" -type f | wc -l) - before ))
files=$(find "$corpus" -type f | wc -l)
total=$(( $(awk '{ for (i = 1; i < NF; i++) if ($i == "executions") s += $(i + 1) } END { print s + 0 }' \
  "$root/$name.log" 2>/dev/null || echo 0) + ${ran:-0} ))
line="$(date -u +%FT%TZ) $name $(git rev-parse --short HEAD 2>/dev/null || echo ?) executions ${ran:-?} exec/s ${speed:-?} coverage ${cov:-?} features ${ft:-?} seconds $secs corpus $files_before->$files findings $new total_executions $total"
echo "$line" >>"$root/$name.log"
echo "$line"
if [ "$new" != 0 ] || [ $rc != 0 ]; then
  grep -E 'ERROR|SUMMARY|runtime error|invariant|Test unit written' "$log" | head -8
  echo "fuzz-campaign.sh: $name: finding(s) in $findings (exit $rc); minimize with" \
    "$FUZZ_BUILD_DIR/fuzz_$target -minimize_crash=1 -runs=100000 FILE" >&2
  exit 1
fi
