#!/bin/sh
# build.sh — install what is missing (Debian 12), build, and run.
#   ./build.sh example   build, then run the main example
#   ./build.sh test      build, then run every test; prints "N passed, M failed" (test cases)
#   ./build.sh asan      the same tests in a separate build with AddressSanitizer and UBSan
#   ./build.sh clang     build everything with clang (-Wall -Wextra -Werror), no run
#   ./build.sh fuzz      the libFuzzer targets (clang, ASan+UBSan), each run for $QKV_FUZZ_SECONDS (60) seconds
#   ./build.sh tsan      tests/test_threads under ThreadSanitizer, in a build without OpenMP
#   ./build.sh valgrind  valgrind memcheck over the examples' quick modes
# test, asan, fuzz, tsan and valgrind each end with "N passed, M failed".
set -eu
cd "$(dirname "$0")"

PACKAGES="meson ninja-build gcc g++ pkg-config python3 libcriterion-dev libsleef-dev libcjson-dev libsimde-dev"

install_missing() {
    missing=""
    for p in $PACKAGES "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    echo "installing:$missing"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
}

# quiet LOG COMMAND...: run COMMAND with its output in LOG; print the log only if it fails (and fail).
quiet() {
    log=$1
    shift
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "build.sh: failed: $* (output above, also in $log)" >&2
        return 1
    fi
}

# setup DIR [meson options...]: configure DIR once, then build it (quiet unless something fails).
setup() {
    dir=$1
    shift
    if [ ! -f "$dir/build.ninja" ]; then
        mkdir -p "$dir"
        quiet "$dir/setup.log" meson setup "$dir" "$@"
    fi
    quiet "$dir/build.log" ninja -C "$dir"
}

# run_tests DIR [meson test arguments...]: run the tests (all, or those named), count the cases.
run_tests() {
    dir=$1
    shift
    meson test -C "$dir" --print-errorlogs "$@" >"$dir/test-output.txt" 2>&1 || true
    grep -E '^ *[0-9]+/[0-9]+ ' "$dir/test-output.txt" || true
    python3 tests/count_cases.py "$dir/meson-logs/testlog.json"
}

case "${1:-}" in
example)
    install_missing
    setup build
    ./build/examples/copy_task
    ;;
test)
    install_missing
    setup build
    run_tests build
    ;;
asan)
    install_missing
    setup build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized -Dbench=false
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_tests build-asan
    ;;
clang)
    install_missing clang
    CC=clang CXX=clang++ setup build-clang
    echo "clang build: ok"
    ;;
fuzz)
    install_missing clang libclang-rt-14-dev
    CC=clang CXX=clang++ setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
        -Dbuildtype=debugoptimized -Dtests=false -Dexamples=false -Dbench=false
    fuzz/run.sh build-fuzz "${QKV_FUZZ_SECONDS:-60}" || true
    ;;
tsan)
    # Only test_threads runs here (two contexts in two threads): TSan cannot see OpenMP's runtime, so the
    # build has none, and the rest of the suite is not built.
    install_missing
    if [ ! -f build-tsan/build.ninja ]; then
        mkdir -p build-tsan
        quiet build-tsan/setup.log meson setup build-tsan -Db_sanitize=thread -Dopenmp=disabled -Db_lundef=false \
            -Dbuildtype=debugoptimized -Dbench=false
    fi
    quiet build-tsan/build.log ninja -C build-tsan tests/test_threads
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 run_tests build-tsan --no-rebuild threads
    ;;
valgrind)
    install_missing valgrind
    setup build-valgrind -Dbuildtype=debugoptimized -Dtests=false -Dbench=false
    out=$(mktemp -d)
    ex=build-valgrind/examples
    i=0
    passed=0
    failed=0
    # memcheck: any error, or a leak (definite or possible), fails the program's case
    check() {
        i=$((i + 1))
        name=$1
        shift
        if valgrind -q --error-exitcode=1 --leak-check=full "$@" >"$out/log-$i.txt" 2>&1; then
            echo "ok $i - valgrind $name"
            passed=$((passed + 1))
        else
            echo "not ok $i - valgrind $name (log: $out/log-$i.txt)"
            tail -n 20 "$out/log-$i.txt" | sed 's/^/#   /'
            failed=$((failed + 1))
        fi
    }
    check "copy_task --steps 20 --wo --heads 2 --save" $ex/copy_task --steps 20 --quiet --wo --heads 2 \
        --save "$out/ck.safetensors" --svg "$out/a.svg"
    check "copy_task --load --steps 30 --json" $ex/copy_task --steps 30 --quiet --wo --heads 2 \
        --load "$out/ck.safetensors" --json --svg "$out/a.svg"
    check "seed_example" $ex/seed_example
    check "usage" $ex/usage
    # parts 1-3 of the study (part 4 trains the copy task, which copy_task covers above; under valgrind it
    # alone takes over 15 minutes)
    [ -x $ex/softmax_study ] && check "softmax_study --quick --part 1 --part 2 --part 3" $ex/softmax_study --quick \
        --part 1 --part 2 --part 3 --out "$out/study"
    [ "$failed" -eq 0 ] && rm -rf "$out"
    echo "$passed passed, $failed failed"
    ;;
*)
    echo "usage: ./build.sh example|test|asan|clang|fuzz|tsan|valgrind" >&2
    exit 2
    ;;
esac
