#!/usr/bin/env bash
# Runs libFuzzer harnesses: tests/fuzz/run.sh BUILD_DIR NAME... (make fuzz
# calls it). Each NAME runs for FUZZ_SECONDS on BUILD_DIR/corpus/NAME, a
# scratch corpus that starts as a copy of tests/fuzz/corpus/NAME and keeps
# what earlier runs found; FUZZ_JOBS harnesses run at a time. Prints one
# line per harness (executions, coverage, features, crashes) and exits
# non-zero if any harness crashed, leaked, timed out or ran out of memory;
# its log and reproducer are then in BUILD_DIR/logs and BUILD_DIR/artifacts.
set -uo pipefail
cd "$(dirname "$0")/../.."
fz=$1
shift
secs=${FUZZ_SECONDS:-600}
jobs=${FUZZ_JOBS:-1}
mkdir -p "$fz/logs"

run_one() {
    local name=$1 bin=$fz/fuzz_$1 corpus=$fz/corpus/$1 art=$fz/artifacts/$1/ log=$fz/logs/$1.log
    mkdir -p "$corpus" "$art"
    cp -n tests/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null
    local dict=()
    [ -f tests/fuzz/"$name".dict ] && dict=(-dict=tests/fuzz/"$name".dict)
    FUZZ_PACKED_SEEDS=$([ "$name" = packed ] && echo "$corpus") \
    "$bin" "$corpus" "${dict[@]}" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -detect_leaks=1 \
        -print_final_stats=1 -artifact_prefix="$art" >"$log" 2>&1
    echo $? >"$fz/logs/$name.rc"
}

summary() {
    local name=$1 log=$fz/logs/$1.log rc
    rc=$(cat "$fz/logs/$name.rc")
    local execs cov ft crashes
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    crashes=$(ls "$fz/artifacts/$name" | wc -l)
    [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes=1
    printf '%-18s %3ss  execs %-9s cov %-6s ft %-6s crashes %s\n' "$name" "$secs" "${execs:-?}" "${cov:-?}" \
        "${ft:-?}" "$crashes"
    if [ "$rc" -ne 0 ]; then
        grep -m1 -E 'ERROR: |fuzz invariant|SUMMARY' "$log" | sed 's/^/    /'
        ls "$fz/artifacts/$name" | sed "s|^|    reproducer: $fz/artifacts/$name/|"
        echo "    log: $fz/logs/$name.log"
        return 1
    fi
}

names=("$@")
for ((i = 0; i < ${#names[@]}; i += jobs)); do
    for name in "${names[@]:i:jobs}"; do
        rm -rf "$fz/artifacts/$name"
        run_one "$name" &
    done
    wait
done
failed=0
for name in "${names[@]}"; do summary "$name" || failed=1; done
exit $failed
