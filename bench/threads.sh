#!/bin/sh
# bench/threads.sh — do threads help the copy task? Training steps per second (bench/copy_task: median of
# several runs) with 1 and 2 threads, on an idle machine and with a process spinning on one core (pinned
# there with taskset), for the d16 and d256 configurations. Prints figures, asserts nothing.
#
#   bench/threads.sh [BUILD_DIR] [RUNS] [STEPS]      (defaults: build, 5 runs of 1000 steps)
#
# What it shows: with 2 threads each OpenMP region waits for its slowest thread; when that thread shares
# its core with a busy process it runs only when the scheduler gives it a slice (milliseconds), so a step
# made of microsecond regions can slow down by orders of magnitude. Regions below the grain size run on
# the calling thread only (ops/attention.c, ops/softmax.c), which is what keeps d16 at its 1-thread speed.
# On a machine with fewer than 2 cores, or without taskset, the "busy" rows are skipped.
set -eu
build=${1:-build}
runs=${2:-5}
steps=${3:-1000}
bench="$build/bench/copy_task"
if [ ! -x "$bench" ]; then
    echo "threads.sh: $bench not found (build with examples enabled: ninja -C $build bench/copy_task)" >&2
    exit 1
fi
spinner=
stop_spinner() {
    if [ -n "$spinner" ]; then
        kill "$spinner" 2>/dev/null || true
        wait "$spinner" 2>/dev/null || true
        spinner=
    fi
}
trap stop_spinner EXIT INT TERM

cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
can_spin=0
if [ "$cores" -ge 2 ] && command -v taskset >/dev/null 2>&1; then can_spin=1; fi

printf '%-6s %-26s %8s %14s\n' config load threads steps/s
for config in d16 d256; do
    for load in idle busy; do
        if [ "$load" = busy ]; then
            [ "$can_spin" = 1 ] || continue
            # a process that never sleeps, pinned on the last core
            taskset -c $((cores - 1)) sh -c 'while :; do :; done' &
            spinner=$!
            sleep 0.2
        fi
        for threads in 1 2; do
            line=$("$bench" --config "$config" --runs "$runs" --steps "$steps" --threads "$threads" --json)
            sps=$(printf '%s\n' "$line" | sed -n 's/.*"median_steps_per_s":\([0-9.]*\).*/\1/p')
            label=$load
            [ "$load" = busy ] && label="busy (core $((cores - 1)) spinning)"
            printf '%-6s %-26s %8s %14s\n' "$config" "$label" "$threads" "$sps"
        done
        stop_spinner
    done
done
