#!/usr/bin/python3
"""Where a training step of the model layer spends its time: each operator's share, forward and backward.

Runs build/bench/model under `perf record -e cpu-clock --call-graph dwarf` (a software clock, so it works
where hardware counters are not exposed; needs perf, Debian's linux-perf) and attributes every sample by its
call stack:
  - the phase is the outermost qkv entry point on the stack: qkv_model_forward / qkv_model_loss (forward),
    qkv_backward (backward), qkv_optim_step (AdamW), qkv_optim_zero_grad (zero grad), qkv_step_end;
  - the operator is the outermost frame whose function is defined in ops/<op>.c (known from `nm` on the
    build's object files): the operator the model called, or the backward function the tape called, so the
    shared code (ops/gemm.c, ops/kernels/: GEMM, softmax, attention; the tensor helpers: allocation, zero
    fill, f64 conversions) counts for the operator that called it; a backward sample in no operator is the
    tape's own work (autograd/: walking the tape, making and adding gradients).
The figures are shares of the samples of the whole run (model construction and one warm-up step included,
a small part of a run of many steps). perf's sampling is statistical: shares under ~1% are noise.

    /usr/bin/python3 bench/model_breakdown.py [--preset a|b|c|llama] [--steps S] [--threads T] [--build build]
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = [("qkv_backward", "backward"), ("qkv_optim_step", "AdamW step"), ("qkv_optim_zero_grad", "zero grad"),
          ("qkv_step_end", "step end"), ("qkv_model_forward", "forward"), ("qkv_model_loss", "forward"),
          ("qkv_cross_entropy", "forward")]  # qkv_model_loss tail-calls qkv_cross_entropy: no frame of its own
# add_backward tail-calls ops/binary.c's shared backward (the model uses add, and mul only when ablating)
ALIASES = {"binary": "add (binary.c)", "add": "add (binary.c)"}


def symbol_files(build):
    """function name -> (area, stem) for every object file of the library (ops, optim, autograd, ...)."""
    table = {}
    objs = glob.glob(os.path.join(build, "libqkv.a.p", "*.o")) or glob.glob(os.path.join(build, "*.p", "*.o"))
    objs += glob.glob(os.path.join(build, "ops", "kernels", "*.p", "*.o"))
    for o in objs:
        base = os.path.basename(o)
        m = re.match(r"(ops|optim|autograd|tensor|model)_(.+)\.c\.o$", base)
        if m:
            area, stem = m.group(1), m.group(2)
        elif "kernels" in o:
            area, stem = "kernels", re.sub(r"\.c\.o$", "", base)
        else:
            continue
        out = subprocess.run(["nm", "--defined-only", o], capture_output=True, text=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "tTwW":
                table.setdefault(f[2], (area, stem))
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="a", choices=["a", "b", "c", "llama"])
    ap.add_argument("--steps", type=int, default=0, help="steps to sample (0: 150 for a, 12 for b and llama, 3 for c)")
    ap.add_argument("--threads", type=int, default=1, help="bench/model --threads")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--freq", type=int, default=1999, help="samples per second")
    a = ap.parse_args()
    steps = a.steps or {"a": 150, "c": 3}.get(a.preset, 12)
    exe = os.path.join(a.build, "bench", "model")
    table = symbol_files(a.build)
    if not table:
        sys.exit(f"model_breakdown: no object files under {a.build}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(a.freq), "--call-graph", "dwarf,16384",
                        "-o", data, "--", exe, "--preset", a.preset, "--runs", "1", "--steps", str(steps),
                        "--warmup", "1", "--threads", str(a.threads)], check=True, env=env, stdout=subprocess.DEVNULL)
        script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym"], capture_output=True,
                                text=True).stdout
    counts = collections.Counter()
    total = 0
    for block in script.split("\n\n"):
        frames = []
        for line in block.splitlines():
            f = line.split()
            if len(f) >= 2:
                frames.append(re.sub(r"\+0x[0-9a-f]+$", "", f[1]))
        if not frames:
            continue
        total += 1
        phase = "other (ids, bench, startup)"
        for name, label in PHASES:  # the outermost phase entry point (leaf first in perf's order)
            if name in frames:
                phase = label
                break
        if "qkv_model_new" in frames or "qkv_optim_new" in frames:
            phase = "other (ids, bench, startup)"
        op = None
        for fr in reversed(frames):  # the outermost frame defined in ops/<op>.c: the operator the model called
            area, stem = table.get(fr, (None, None))
            if area == "ops":
                op = ALIASES.get(stem, stem)
                break
        if op is None:
            areas = {table.get(fr, (None, None))[0] for fr in frames}
            op = {"backward": "tape (autograd)", "AdamW step": "optim", "zero grad": "optim",
                  "step end": "arena"}.get(phase, "model glue, tensors" if "model" in areas or "tensor" in areas
                                           else "-")
        counts[(phase, op)] += 1
    if not total:
        sys.exit("model_breakdown: perf recorded no samples")
    print(f"preset {a.preset}: {total} samples over {steps} steps (perf cpu-clock, {a.freq} Hz, dwarf call graphs)")
    by_phase = collections.Counter()
    for (phase, op), c in counts.items():
        by_phase[phase] += c
    for phase, pc in by_phase.most_common():
        print(f"{phase:28} {100.0 * pc / total:6.1f}%")
        for (ph, op), c in sorted(counts.items(), key=lambda kv: -kv[1]):
            if ph == phase and 100.0 * c / total >= 0.3:
                print(f"    {op:24} {100.0 * c / total:6.1f}%")
    print(f"\nby operator (forward + backward):")
    by_op = collections.Counter()
    for (phase, op), c in counts.items():
        if phase in ("forward", "backward"):
            by_op[op] += c
    for op, c in by_op.most_common():
        f, b = counts[("forward", op)], counts[("backward", op)]
        if 100.0 * c / total >= 0.3:
            print(f"    {op:24} {100.0 * c / total:6.1f}%   (forward {100.0 * f / total:5.1f}%, backward "
                  f"{100.0 * b / total:5.1f}%)")


if __name__ == "__main__":
    main()
