#!/bin/sh
# test_programs.sh BUILD_DIR — the command lines of the example and benchmark programs (examples/args.h):
# --help exits 0 with the usage on stdout; an unknown flag, a missing value or a bad value exits 2 with a
# message naming the flag; and copy_task's outputs (--svg, --json, --load, --clip) do what --help says.
# Prints TAP.
build=$(cd "${1:?usage: test_programs.sh BUILD_DIR}" && pwd) || exit 1
ex=$build/examples
bench=$build/bench
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qkv-programs.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0
failed=0

ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; sed 's/^/#   /' "$tmp/err" "$tmp/out" | head -n 8; }

# expect NAME STATUS TEXT PROGRAM ARGS...: the exit status is STATUS and stdout + stderr contain TEXT
expect() {
    name=$1 status=$2 text=$3
    shift 3
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    got=$?
    if [ "$got" -eq "$status" ] && { [ -z "$text" ] || cat "$tmp/out" "$tmp/err" | grep -q -F -e "$text"; }; then
        ok "$name"
    else echo "# exit $got, expected $status; expected to see: $text" >>"$tmp/err"; not_ok "$name"; fi
}

for p in examples/copy_task examples/seed_example examples/usage examples/model_usage examples/train \
         examples/softmax_study examples/induction examples/extending bench/gemm bench/ops \
         bench/attention bench/softmax bench/copy_task bench/model bench/decode; do
    [ -x "$build/$p" ] || { n=$((n + 1)); echo "ok $n - $p # SKIP not built"; continue; }
    expect "$p --help exits 0 with the usage" 0 "usage:" "$build/$p" --help
    expect "$p --bogus exits 2 naming it" 2 "--bogus" "$build/$p" --bogus
done

# numbers: whole string, in range, the flag named
expect "bench/gemm --shape -1 2 3 0 0 is refused" 2 "--shape M" "$bench/gemm" --shape -1 2 3 0 0
expect "bench/gemm --shape with too few values" 2 "--shape needs 5 values" "$bench/gemm" --shape 1 2
expect "bench/gemm --runs 10x" 2 "--runs" "$bench/gemm" --runs 10x
expect "bench/attention --shape 1 2 3 4 (causal 0 or 1)" 2 "--shape causal" "$bench/attention" --shape 1 2 3 4
expect "bench/softmax --help does not run the benchmark" 0 "takes no flags" "$bench/softmax" --help
if grep -q "GB/s" "$tmp/out"; then not_ok "bench/softmax --help prints no figures"; else ok "bench/softmax --help prints no figures"; fi
expect "bench/copy_task --threads 100000" 2 "--threads" "$bench/copy_task" --threads 100000
expect "bench/copy_task --runs" 2 "--runs needs a value" "$bench/copy_task" --runs
expect "bench/copy_task --config d99" 2 "--config needs one of d16|d256" "$bench/copy_task" --config d99
expect "bench/model --preset d" 2 "--preset needs one of a|b|c|llama" "$bench/model" --preset d
expect "bench/model --runs 0" 2 "--runs" "$bench/model" --runs 0
if [ -x "$bench/decode" ]; then
    expect "bench/decode --prompt 1000 --new 100 (past n_ctx)" 2 "more than n_ctx 1024" "$bench/decode" --prompt 1000 --new 100
else n=$((n + 1)); echo "ok $n - bench/decode # SKIP not built"; fi
expect "softmax_study --part 5" 2 "--part" "$ex/softmax_study" --part 5 --out "$tmp/study"
expect "softmax_study --seed -1" 2 "--seed" "$ex/softmax_study" --seed -1 --out "$tmp/study"
expect "seed_example --quick (no flags)" 2 "--quick" "$ex/seed_example" --quick
expect "induction --data foo" 2 "--data needs one of segment|repeat" "$ex/induction" --data foo --out "$tmp/ind"
expect "induction --n-head 3 (does not divide --d-model 32)" 2 "d_model 32 must be a positive multiple" "$ex/induction" --n-head 3 --out "$tmp/ind"
expect "induction --steps 0" 2 "--steps" "$ex/induction" --steps 0 --out "$tmp/ind"
expect "extending --steps 0" 2 "--steps needs an integer in [1, 100000]" "$ex/extending" --steps 0
if [ -x "$ex/stability" ]; then
    expect "examples/stability --help exits 0 with the usage" 0 "usage:" "$ex/stability" --help
    expect "examples/stability --bogus exits 2 naming it" 2 "--bogus" "$ex/stability" --bogus
    expect "stability --jobs 0" 2 "--jobs" "$ex/stability" --jobs 0 --out "$tmp/stability"
    expect "stability --seed 1x" 2 "--seed" "$ex/stability" --seed 1x --out "$tmp/stability"
else n=$((n + 1)); echo "ok $n - examples/stability # SKIP not built"; fi

ct=$ex/copy_task
expect "copy_task --steps 12x" 2 "--steps needs an integer" "$ct" --steps 12x
expect "copy_task --steps -1" 2 "--steps" "$ct" --steps -1
expect "copy_task --lr 0" 2 "--lr needs a positive number" "$ct" --lr 0
expect "copy_task --lr nan" 2 "--lr" "$ct" --lr nan
expect "copy_task --clip 0 is an error" 2 "--clip needs a positive number" "$ct" --clip 0
expect "copy_task --clip off" 0 "" "$ct" --clip off --steps 2 --quiet
expect "copy_task --task foo" 2 "--task needs one of copy|shift|reverse" "$ct" --task foo
expect "copy_task --threads 100000" 2 "--threads" "$ct" --threads 100000
expect "copy_task --n 0" 2 "--n" "$ct" --n 0
expect "copy_task --heads 3 (does not divide V)" 2 "--heads 3 does not divide --V 8" "$ct" --heads 3
expect "copy_task --svg (missing value)" 2 "--svg needs a value" "$ct" --svg
expect "copy_task --svg with --n 100" 2 "--svg" "$ct" --svg "$tmp/a.svg" --n 100

expect "copy_task --quiet --svg F" 0 "" "$ct" --quiet --steps 5 --svg "$tmp/quiet.svg"
if [ -s "$tmp/quiet.svg" ] && grep -q "</svg>" "$tmp/quiet.svg"; then ok "copy_task --quiet --svg F writes F"
else not_ok "copy_task --quiet --svg F writes F"; fi
expect "copy_task --svg into a missing folder exits 1" 1 "--svg: cannot write" "$ct" --quiet --steps 5 \
    --svg "$tmp/missing/a.svg"
(cd "$tmp" && "$ct" --quiet --steps 2 >/dev/null 2>&1)
if [ $? -ne 0 ] || [ -e "$tmp/attention.svg" ]; then not_ok "copy_task --quiet writes no default attention.svg"
else ok "copy_task --quiet writes no default attention.svg"; fi

expect "copy_task --json --steps 0: final_loss null" 0 '"final_loss":null' "$ct" --json --quiet --steps 0
if grep -q nan "$tmp/out"; then not_ok "copy_task --json prints no nan"; else ok "copy_task --json prints no nan"; fi
expect "copy_task --json --steps 3: final_loss a number" 0 '"final_loss":' "$ct" --json --quiet --steps 3
if grep -q '"final_loss":[0-9]' "$tmp/out"; then ok "copy_task --json final_loss is a number"
else not_ok "copy_task --json final_loss is a number"; fi

expect "copy_task --save at step 20" 0 "" "$ct" --quiet --steps 20 --save "$tmp/ck.safetensors"
expect "copy_task --load of step 20 with --steps 10 is refused" 2 "past --steps 10" "$ct" --quiet --steps 10 \
    --load "$tmp/ck.safetensors"
expect "copy_task --load of step 20 with --steps 20 trains nothing, says so" 0 "nothing to train" "$ct" --steps 20 \
    --load "$tmp/ck.safetensors" --svg "$tmp/b.svg"
expect "copy_task --load of step 20 with --steps 25 trains 5 more" 0 '"steps":25' "$ct" --quiet --json --steps 25 \
    --load "$tmp/ck.safetensors"
expect "copy_task --load: the differing flag named, by name" 1 "--task: checkpoint has reverse, flags say copy" "$ct" \
    --quiet --steps 30 --task copy --load "$tmp/ck.safetensors"
expect "copy_task --load: the optimizer by name" 1 "--optimizer: checkpoint has adam, flags say sgd" "$ct" \
    --quiet --steps 30 --optimizer sgd --load "$tmp/ck.safetensors"

echo "1..$n"
[ "$failed" -eq 0 ]
