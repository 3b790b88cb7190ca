#!/usr/bin/python3
"""compare_attention.py — qkv's attention against PyTorch eager, forward + backward, f32 and f64, in one run.

qkv: build/bench/attention --shape B n d causal --dtype D (fused and composed, one thread); its --tsv run
(f32) for 2 threads against 1 at (4,512,64) and the extra peak memory at (1,4096,64). PyTorch 1.13 eager runs
the seed's attention on the same shapes and dtypes in a child process whose environment is
bench/torch_child.py's torch_env(threads) (OMP/OPENBLAS/MKL_NUM_THREADS set before torch is imported,
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed), with torch.set_num_threads; the child reports the OpenBLAS
configuration and thread count it actually used, printed at the top:

    scores = q @ k^T / sqrt(d);  scores.masked_fill(~mask, -inf) when causal;  A = softmax(scores);  out = A @ v
    out.backward(dO)

Times: median of >= 5 samples, a sample averaging enough iterations to last >= 20 ms (as bench/attention.c
does), in process CPU time on both sides (--wall for wall time: on a shared machine wall time also counts the
slices other processes take). Each dtype is measured in two interleaved rounds (qkv, PyTorch, qkv, PyTorch)
and each side's lower median is kept. Ratios are PyTorch time / qkv time (> 1: qkv is faster). Each fused
figure is also printed as a share of the core's measured FMA peak for its dtype (bench/peak.h; nominal flops
6 * 2 B n^2 d, as if nothing were recomputed or skipped), and so is PyTorch's.

Targets, printed as met or not met: f32 fused 50x at (1,3,2) and (1,64,16), 2x at (8,128,64), (4,512,64),
(1,2048,64) and 3x there with the causal mask; f64 fused 1.5x at (8,128,64), (4,512,64) and (1,2048,64);
f32 fused at 75% of the measured f32 peak at (4,512,64) and (1,2048,64); (1,64,16) f32 at 20x PyTorch,
printed beside the time its six products alone take at the peak (the least a call can take).
Attention variants (include/qkv/attention.h), f32: each variant's fused forward + backward beside the fused
softmax's at (4,512,64) and (8,128,64) (bench/attention --variants --tsv, in process CPU time unless --wall:
five interleaved rounds, the medians),
target within 1.2x of the softmax; --variants-only prints that table alone (no PyTorch needed).
A variant built from operators (f32, no mask): softmax plus one as docs/extending.md builds it from public
operators, w = softmax_dim(s) / (1 + e^-logsumexp_dim(s)) between the two matmuls (bench/attention --shape B n d 0
--primitives), against PyTorch eager's same composition (torch.softmax, torch.logsumexp, torch.exp) at
(8,128,64), (4,512,64) and (1,2048,64), two interleaved rounds, the lower medians; target 1.2x PyTorch (issue
28: building from primitives is not a penalty); --primitives-only prints that table alone.
Prints figures, asserts nothing. Needs Debian's python3-torch; run by hand:

    /usr/bin/python3 bench/compare_attention.py [--bench build/bench/attention] [--quick] [--wall] [--dtype both]
        [--variants-only] [--primitives-only]
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_child import env_line, require_openblas, torch_config, torch_config_line, torch_env, torch_setup  # noqa: E402

SHAPES = [(1, 3, 2), (1, 64, 16), (8, 128, 64), (4, 512, 64), (1, 2048, 64)]
TARGETS = {  # (dtype, shape, causal) -> fused speed-up over PyTorch
    **{("f32", s, 0): 50.0 for s in SHAPES[:2]},
    **{("f32", s, 0): 2.0 for s in SHAPES[2:]},
    **{("f32", s, 1): 3.0 for s in SHAPES[2:]},
    **{("f64", s, 0): 1.5 for s in SHAPES[2:]},
}
PEAK_TARGETS = {("f32", (4, 512, 64)): 75.0, ("f32", (1, 2048, 64)): 75.0}  # fused, non-causal: % of the peak
SMALL_CALL = ((1, 64, 16), 20.0)  # f32 fused, non-causal: x PyTorch, beside what its arithmetic allows
VARIANT_GOAL = 1.2  # each variant's fused forward + backward within this factor of the fused softmax's (f32)
PRIMITIVE_SHAPES = [(8, 128, 64), (4, 512, 64), (1, 2048, 64)]
PRIMITIVE_GOAL = 1.2  # softmax plus one from operators, qkv against PyTorch eager's same composition (f32)


def print_variants(bench, quick, wall):
    """The variants' table from bench/attention --variants --tsv (f32, one thread; process CPU time unless wall)."""
    out = subprocess.run([bench, "--variants", "--tsv"] + (["--quick"] if quick else []) + ([] if wall else ["--cpu"]),
                         check=True, capture_output=True, text=True).stdout
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("variant\t")]
    print(f"\nattention variants, f32, one thread, {'wall' if wall else 'process CPU'} time; fused forward+backward "
          f"against the fused softmax "
          f"(target within {VARIANT_GOAL:g}x; load average {os.getloadavg()[0]:.2f}):")
    print(f"{'(B, n, d)':<15} {'variant':<9} {'variant ms':>11} {'softmax ms':>11} {'ratio':>7}  target")
    met = 0
    for _, b, n, d, _causal, name, tv, ts in rows:
        ratio = float(tv) / float(ts)
        met += ratio <= VARIANT_GOAL
        print(f"({b}, {n}, {d}){'':<{15 - len(f'({b}, {n}, {d})')}} {name:<9} {float(tv) * 1e3:11.4f} "
              f"{float(ts) * 1e3:11.4f} {ratio:6.2f}x  {'met' if ratio <= VARIANT_GOAL else 'NOT MET'}")
    print(f"  {met} of {len(rows)} within {VARIANT_GOAL:g}x")


# ---- the PyTorch child ------------------------------------------------------------------------------

def torch_child(job):
    torch = torch_setup(job["threads"])
    clock = time.perf_counter if job["wall"] else time.process_time
    dtype = torch.float64 if job["dtype"] == "f64" else torch.float32

    def seed_attention(q, k, v, causal):
        d = q.shape[-1]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        if causal:
            n_q, n_k = scores.shape[-2], scores.shape[-1]
            keep = torch.ones(n_q, n_k, dtype=torch.bool).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def make_inputs(shape):
        g = torch.Generator().manual_seed(42)
        q, k, v, dout = (torch.randn(shape, generator=g, dtype=dtype) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        return q, k, v, dout

    def plus_one_attention(q, k, v):  # docs/extending.md's softmax plus one from primitives, as bench/attention's
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        p = torch.softmax(s, dim=-1)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        return torch.matmul(p / (torch.exp(-lse) + 1.0), v)

    def iterate(q, k, v, dout, causal):
        out = plus_one_attention(q, k, v) if job.get("primitives") else seed_attention(q, k, v, causal)
        out.backward(dout)
        q.grad = k.grad = v.grad = None

    def time_one(shape, causal):
        q, k, v, dout = make_inputs(shape)
        iterate(q, k, v, dout, causal)  # warm up
        t0 = clock()
        iterate(q, k, v, dout, causal)
        once = clock() - t0
        inner = max(1, int(job["sample_seconds"] / once)) if once > 0 else 1000
        times = []
        for _ in range(job["samples"]):
            start = clock()
            for _ in range(inner):
                iterate(q, k, v, dout, causal)
            times.append((clock() - start) / inner)
        return statistics.median(times)

    mem = None
    if job.get("mem"):  # growth of the max RSS over one forward + backward, first, in a fresh process
        q, k, v, dout = make_inputs(tuple(job["mem"]))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        iterate(q, k, v, dout, False)
        mem = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024.0
    times = [time_one(tuple(s[:3]), bool(s[3])) for s in job["shapes"]]
    return dict(times=times, mem_mib=mem, config=torch_config())


def print_primitives(bench, quick, wall):
    """softmax plus one built from operators: qkv (bench/attention --primitives) against PyTorch's same ops."""
    samples, sample_seconds = (3, 0.005) if quick else (7, 0.02)
    flags = (["--quick"] if quick else []) + ([] if wall else ["--cpu"])
    job = dict(threads=1, wall=wall, samples=samples, sample_seconds=sample_seconds, dtype="f32", primitives=True,
               shapes=[list(s) + [0] for s in PRIMITIVE_SHAPES])
    qkv_runs, pt_runs = [], []
    for _ in range(2):  # interleaved rounds: qkv, PyTorch, qkv, PyTorch; the lower median of each side
        qkv_runs.append([float(subprocess.run([bench, "--shape", *map(str, s), "0", "--primitives"] + flags,
                                              check=True, capture_output=True, text=True,
                                              env=torch_env(1, False)).stdout.split("\t")[5])
                         for s in PRIMITIVE_SHAPES])
        pt_runs.append(run_torch(job)["times"])
    print(f"\nsoftmax plus one from operators (docs/extending.md), f32, no mask, forward+backward, one thread, "
          f"{'wall' if wall else 'process CPU'} time; lower of two interleaved medians of {samples} samples; "
          f"target {PRIMITIVE_GOAL:g}x PyTorch eager's same composition")
    print(f"{'(B, n, d)':<15} {'PyTorch ms':>11} {'qkv ms':>10} {'PT/qkv':>8}  target")
    met = 0
    for i, shape in enumerate(PRIMITIVE_SHAPES):
        q, pt = min(r[i] for r in qkv_runs), min(r[i] for r in pt_runs)
        met += pt / q >= PRIMITIVE_GOAL
        print(f"{str(shape):<15} {pt * 1e3:11.4f} {q * 1e3:10.4f} {pt / q:7.2f}x  "
              f"{'met' if pt / q >= PRIMITIVE_GOAL else 'NOT MET'}")
    print(f"  {met} of {len(PRIMITIVE_SHAPES)} at {PRIMITIVE_GOAL:g}x")


def run_torch(job):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(job)], check=True,
                         capture_output=True, text=True, env=torch_env(job["threads"])).stdout
    return json.loads(out.strip().splitlines()[-1])


# ---- the parent ---------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="build/bench/attention", help="path of qkv's bench/attention")
    parser.add_argument("--quick", action="store_true", help="3 shorter samples (qkv and PyTorch alike)")
    parser.add_argument("--wall", action="store_true", help="wall time instead of process CPU time")
    parser.add_argument("--dtype", default="both", choices=("f32", "f64", "both"))
    parser.add_argument("--variants-only", action="store_true",
                        help="only the attention variants against the fused softmax (no PyTorch)")
    parser.add_argument("--primitives-only", action="store_true",
                        help="only softmax plus one from operators against PyTorch's same composition")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(torch_child(json.loads(args.child))))
        return 0
    if args.variants_only:
        print_variants(args.bench, args.quick, args.wall)
        return 0
    require_openblas()
    if args.primitives_only:
        print_primitives(args.bench, args.quick, args.wall)
        return 0
    samples, sample_seconds = (3, 0.005) if args.quick else (7, 0.02)
    flags = (["--quick"] if args.quick else []) + ([] if args.wall else ["--cpu"])
    dtypes = ["f32", "f64"] if args.dtype == "both" else [args.dtype]
    configs = [(s, c) for s in SHAPES for c in (0, 1)]
    job = dict(threads=1, wall=args.wall, samples=samples, sample_seconds=sample_seconds,
               shapes=[list(s) + [c] for s, c in configs])

    def run(cmd):
        return subprocess.run(cmd, check=True, capture_output=True, text=True, env=torch_env(1, False)).stdout

    peak = run([args.bench, "--peak"]).split("\t")
    peak = {"f32": float(peak[1]), "f64": float(peak[2]), "isa": peak[3].strip()}
    load0 = os.getloadavg()[0]
    results, cfg, torch_mem = {}, None, None
    for dt in dtypes:
        qkv_runs, pt_runs = [], []
        for _ in range(2):  # interleaved rounds: qkv, PyTorch, qkv, PyTorch; the lower median of each side
            qkv_runs.append([tuple(map(float, run([args.bench, "--shape", *map(str, s), str(c), "--dtype", dt]
                                                  + flags).split("\t")[5:7])) for s, c in configs])
            r = run_torch(dict(job, dtype=dt, mem=[1, 4096, 64] if torch_mem is None else None))
            if torch_mem is None:
                torch_mem = r["mem_mib"]
            cfg = cfg or r["config"]
            pt_runs.append(r["times"])
        results[dt] = [(min(q[i][0] for q in qkv_runs), min(q[i][1] for q in qkv_runs),
                        min(p[i] for p in pt_runs)) for i in range(len(configs))]

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cpus, load average {load0:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end")
    print(torch_config_line(cfg))
    print(env_line(1))
    print(f"attention forward+backward, one thread; PyTorch {cfg['torch']} eager (seed's attention); "
          f"{'wall' if args.wall else 'process CPU'} time, lower of two interleaved medians of {samples} samples")
    print(f"peak of one core (bench/peak.h, {peak['isa']}): f32 {peak['f32']:.1f} GFLOP/s, "
          f"f64 {peak['f64']:.1f} GFLOP/s")

    def flops(shape):  # the nominal flops of a forward + backward: the six products, 12 B n^2 d
        return 12.0 * shape[0] * shape[1] ** 2 * shape[2]

    def share(shape, seconds, dt):  # % of the dtype's peak
        return 100.0 * flops(shape) / seconds * 1e-9 / peak[dt]

    summary = []
    for dt in dtypes:
        print(f"\n{dt}:")
        print(f"{'(B, n, d)':<15} {'mask':<7} {'PyTorch ms':>11} {'qkv fused':>10} {'composed':>10} "
              f"{'fused/PT':>9} {'fused %pk':>9} {'PT %pk':>7} {'composed/PT':>11}  target")
        for (shape, causal), (fused, composed, pt) in zip(configs, results[dt]):
            name = f"({shape[0]}, {shape[1]}, {shape[2]})"
            goal = TARGETS.get((dt, shape, causal))
            verdict = "-" if goal is None else f"{goal:g}x: {'met' if pt / fused >= goal else 'NOT MET'}"
            if goal is not None:
                summary.append((dt, name, causal, pt / fused, goal))
            print(f"{name:<15} {'causal' if causal else 'none':<7} {pt * 1e3:11.4f} {fused * 1e3:10.4f} "
                  f"{composed * 1e3:10.4f} {pt / fused:8.2f}x {share(shape, fused, dt):8.1f}% {share(shape, pt, dt):6.1f}% "
                  f"{pt / composed:10.2f}x  {verdict}")
    print("\ntargets:")
    for dt, name, causal, ratio, goal in summary:
        print(f"  {dt} {name:<15} {'causal' if causal else 'none':<7} {ratio:6.2f}x of PyTorch, target {goal:g}x: "
              f"{'met' if ratio >= goal else 'NOT MET'}")
    print(f"  {sum(r >= g for _, _, _, r, g in summary)} of {len(summary)} met")
    if "f32" in dtypes:
        by_shape = {(shape, causal): r for (shape, causal), r in zip(configs, results["f32"])}
        print("\nf32 fused at a share of the peak (nominal flops, no mask):")
        for (dt, shape), goal in PEAK_TARGETS.items():
            pct = share(shape, by_shape[(shape, 0)][0], dt)
            print(f"  {dt} {str(shape):<15} {pct:5.1f}% of the f32 peak, target {goal:g}%: "
                  f"{'met' if pct >= goal else 'NOT MET'}")
        shape, goal = SMALL_CALL
        fused, _, pt = by_shape[(shape, 0)]
        least = flops(shape) / (peak["f32"] * 1e9)
        print(f"  f32 {str(shape):<15} {pt / fused:5.2f}x of PyTorch ({fused * 1e6:.1f} us a call), target "
              f"{goal:g}x: {'met' if pt / fused >= goal else 'NOT MET'}; {goal:g}x is {pt / goal * 1e6:.1f} us, "
              f"the six products alone take {least * 1e6:.1f} us at the peak")

    if "f32" in dtypes:  # threads and memory: bench/attention --tsv (f32)
        qkv = {}
        for line in run([args.bench, "--tsv"] + (["--quick"] if args.quick else [])).splitlines():
            fields = line.split("\t")
            if fields[0] != "peak":  # "peak\tf32\tf64\tisa" has four fields, the figures seven
                kind, b, n, d, causal, x, y = fields[:7]
                qkv[(kind, int(b), int(n), int(d), int(causal))] = (float(x), float(y))
        cpus = len(os.sched_getaffinity(0))
        if cpus < 2:  # under taskset -c N both threads share one core: a 2-thread figure would measure nothing
            print(f"\n2 threads against 1: not measured, this process may run on {cpus} CPU (taskset)")
        else:
            one, two = qkv[("threads", 4, 512, 64, 0)]
            one_best, two_best = qkv[("threads_best", 4, 512, 64, 0)]
            pt_job = dict(job, dtype="f32", wall=True, shapes=[[4, 512, 64, 0]])
            pt2 = run_torch(dict(pt_job, threads=2))["times"][0]
            pt1 = run_torch(pt_job)["times"][0]
            print(f"\n2 threads against 1 at (4, 512, 64), f32, wall time: qkv fused {one * 1e3:.3f} -> "
                  f"{two * 1e3:.3f} ms ({one / two:.2f}x; fastest samples {one_best * 1e3:.3f} -> "
                  f"{two_best * 1e3:.3f} ms, {one_best / two_best:.2f}x); PyTorch {pt1 * 1e3:.3f} -> "
                  f"{pt2 * 1e3:.3f} ms ({pt1 / pt2:.2f}x)")
        fused_mem, composed_mem = qkv[("memory", 1, 4096, 64, 0)]
        print(f"\nextra peak memory at (1, 4096, 64), forward+backward, f32: qkv fused {fused_mem / 2**20:.2f} MiB, "
              f"qkv composed {composed_mem / 2**20:.2f} MiB (step arena); PyTorch {torch_mem:.1f} MiB "
              f"(max RSS growth)")
        print_variants(args.bench, args.quick, args.wall)
        print_primitives(args.bench, args.quick, args.wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
