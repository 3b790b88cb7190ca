#!/bin/sh
# build.sh — install what is missing (Debian 12), build, and run.
#   ./build.sh example   build, then run the main example
#   ./build.sh test      build, then run every test; prints "N passed, M failed" (test cases)
#   ./build.sh asan      the same tests in a separate build with AddressSanitizer and UBSan
#   ./build.sh clang     build everything with clang (-Wall -Wextra -Werror), no run
set -eu
cd "$(dirname "$0")"

PACKAGES="meson ninja-build gcc g++ pkg-config python3 libcriterion-dev libsleef-dev libcjson-dev"

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

# setup DIR [meson options...]: configure DIR once, then build it.
setup() {
    dir=$1
    shift
    [ -f "$dir/build.ninja" ] || meson setup "$dir" "$@" >/dev/null
    ninja -C "$dir" >/dev/null
}

run_tests() {
    dir=$1
    meson test -C "$dir" --print-errorlogs >"$dir/test-output.txt" 2>&1 || true
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
*)
    echo "usage: ./build.sh example|test|asan|clang" >&2
    exit 2
    ;;
esac
