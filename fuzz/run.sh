#!/bin/sh
# fuzz/run.sh BUILD_DIR [SECONDS [TARGET...]] — run each libFuzzer target (npy, safetensors, graph, misuse,
# or the ones named) for SECONDS (default 60) from the committed seed corpus plus what earlier runs in BUILD_DIR
# found (BUILD_DIR/fuzz-work/<target>/corpus: the repository is never written). Prints one TAP-like line
# per target, with its executions, and ends with "N passed, M failed" (one case per target). A crash leaves
# its input in BUILD_DIR/fuzz-work/<target>/: copy it to fuzz/regress/<target>/ (and add a named test to
# fuzz/replay.c) so the Criterion replay test keeps checking it.
set -u
build=${1:?usage: fuzz/run.sh BUILD_DIR [SECONDS [TARGET...]]}
secs=${2:-60}
shift
[ $# -gt 0 ] && shift
targets=${*:-npy safetensors graph misuse}
here=$(cd "$(dirname "$0")" && pwd)
passed=0
failed=0
i=0
for target in $targets; do
    i=$((i + 1))
    exe="$build/fuzz/fuzz_$target"
    work="$build/fuzz-work/$target"
    mkdir -p "$work/corpus"
    if [ ! -x "$exe" ]; then
        echo "not ok $i - fuzz_$target: $exe not built (clang, -Dfuzz=true)"
        failed=$((failed + 1))
        continue
    fi
    dict=""
    [ -f "$here/$target.dict" ] && dict="-dict=$here/$target.dict"
    log="$work/last-run.log"
    # -timeout: one input may take at most 10 s; -rss_limit_mb: the process at most 2 GiB;
    # -max_len: inputs up to 8 KiB; -print_final_stats: the execution count for the summary.
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
        -artifact_prefix="$work/" $dict "$work/corpus" "$here/corpus/$target" >"$log" 2>&1
    rc=$?
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    cov=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -n 1 | sed -E 's/.*cov: ([0-9]+).*/\1/')
    if [ "$rc" -eq 0 ]; then
        echo "ok $i - fuzz_$target: ${runs:-?} executions in ${secs} s, coverage ${cov:-?} edges, no crash"
        passed=$((passed + 1))
    else
        artifact=$(grep -oE "Test unit written to [^ ]+" "$log" | tail -n 1 | sed 's/Test unit written to //')
        echo "not ok $i - fuzz_$target: exit $rc after ${runs:-?} executions; input: ${artifact:-none}; log: $log"
        grep -E "ERROR|invariant|SUMMARY|runtime error" "$log" | head -n 5 | sed 's/^/#   /'
        failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
