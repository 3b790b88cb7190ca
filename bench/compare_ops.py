#!/usr/bin/python3
"""compare_ops.py — qkv's building blocks against PyTorch eager, forward + backward, f32, one thread, one run.

Runs build/bench/ops --tsv (qkv: embedding, layer norm, RMS norm, GELU erf and tanh, every elementwise operator
of qkv/elementwise.h (exp, sigmoid, tanh, log, sqrt, rsqrt, softplus, abs, neg, square, pow 1.5, clamp, add and
mul by a scalar, div, maximum, minimum, where), sum along the last axis, log_softmax, and exp as a user-defined
operator, on x [32*128, 256] (log, sqrt, rsqrt and pow on b = |x'| + 0.5, in their domain); exp and the
user-defined exp again on [256], where a call's overhead shows; see bench/ops.c), then the same in
PyTorch 1.13 eager (the user-defined exp as a torch.autograd.Function), each side in a child process pinned to one thread
the way bench/torch_child.py says (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = 1 in the
child's environment before torch is imported, torch.set_num_threads(1); OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE removed for the PyTorch child only), and prints which OpenBLAS kernel and how many threads
PyTorch actually used:

    embedding   F.embedding(ids, table)                         table [4096, 256], ids [32, 128]
    layer_norm  F.layer_norm(x, (256,), gamma, beta, 1e-5)
    rms_norm    x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
    gelu_erf    F.gelu(x, approximate='none')
    gelu_tanh   F.gelu(x, approximate='tanh')
    exp ... minimum: the torch function of the same name (softplus: F.softplus; add/mul_scalar: x + 0.25,
                x * 0.75; pow: torch.pow(b, 1.5); clamp: torch.clamp(x, -0.5, 0.5))
    each: out.backward(dy), then the inputs' .grad set to None (PyTorch's cheapest path), or kept (below)

and prints the times and the speedup (PyTorch time / qkv time: 2.00x means qkv takes half PyTorch's time).
PyTorch runs each op twice: with .grad set to None after each iteration (each backward writes a new gradient,
PyTorch's cheapest path) and with .grad kept (each backward adds into it: what qkv's benchmark does, its x and
the others being parameters whose gradients add up, and what a PyTorch 1.13 training loop does with the default
optimizer.zero_grad(), which zeroes gradients in place). Each goal is judged against both.
Each child reports the median of >= 5 samples per op, a sample averaging enough iterations to last >= 20
ms; the children run in --rounds (5) interleaved rounds (qkv, PyTorch, qkv, PyTorch, ...) and the table
shows the median round of each side. Times are CPU time (time.process_time, CLOCK_PROCESS_CPUTIME_ID: on
a shared machine each side is charged only for its own cycles) unless --wall. Prints figures, asserts
nothing. Needs Debian's python3-torch; run by hand:

    /usr/bin/python3 bench/compare_ops.py [--bench build/bench/ops] [--quick] [--rounds 5] [--wall]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_child as tc  # noqa: E402  (bench/torch_child.py)

OPS = ["embedding", "layer_norm", "rms_norm", "gelu_erf", "gelu_tanh", "exp", "sigmoid", "tanh", "div", "maximum",
       "where", "sum_dim", "log_softmax", "custom_exp", "exp_small", "custom_exp_small", "log", "sqrt", "rsqrt",
       "softplus", "abs", "neg", "square", "pow", "clamp", "add_scalar", "mul_scalar", "minimum"]
# the speedup each row aims at: the building blocks 2x (issue 15), the operators of qkv/elementwise.h and
# qkv/reduce.h PyTorch's speed (issue 28); the user-defined exp and the small rows measure overhead (no goal)
GOALS = {"embedding": 2, "layer_norm": 2, "rms_norm": 2, "gelu_erf": 2, "gelu_tanh": 2, "exp": 1, "sigmoid": 1,
         "tanh": 1, "div": 1, "maximum": 1, "where": 1, "sum_dim": 1, "log_softmax": 1, "log": 1, "sqrt": 1,
         "rsqrt": 1, "softplus": 1, "abs": 1, "neg": 1, "square": 1, "pow": 1, "clamp": 1, "add_scalar": 1,
         "mul_scalar": 1, "minimum": 1}
SMALL = 256
ROWS, D, V, EPS = 32 * 128, 256, 4096, 1e-5


def torch_child(samples, sample_seconds, clock):
    """Runs in the child process (tc.torch_env: threads already pinned): one tsv line per op, then what ran."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(42)
    x = torch.randn(ROWS, D, generator=g).requires_grad_(True)
    gamma = (1 + 0.1 * torch.randn(D, generator=g)).requires_grad_(True)
    beta = (0.1 * torch.randn(D, generator=g)).requires_grad_(True)
    table = torch.randn(V, D, generator=g).requires_grad_(True)
    ids = (torch.arange(ROWS) % V)[torch.randperm(ROWS, generator=g)].reshape(32, 128)
    dy = torch.randn(ROWS, D, generator=g)
    dy3 = dy.reshape(32, 128, D)
    b = (torch.randn(ROWS, D, generator=g).abs() + 0.5).requires_grad_(True)
    i = torch.arange(ROWS * D)
    mask = ((i * 7 + i // 3) % 2).reshape(ROWS, D).bool()
    dy_rows = torch.randn(ROWS, 1, generator=g)
    small = torch.randn(SMALL, generator=g).requires_grad_(True)
    dy_small = torch.randn(SMALL, generator=g)

    class CustomExp(torch.autograd.Function):  # exp as a user-defined function, as bench/ops.c's custom_exp
        @staticmethod
        def forward(ctx, t):
            y = torch.exp(t)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy_):
            (y,) = ctx.saved_tensors
            return dy_ * y

    forward = {
        "exp": lambda: torch.exp(x),
        "sigmoid": lambda: torch.sigmoid(x),
        "tanh": lambda: torch.tanh(x),
        "div": lambda: x / b,
        "maximum": lambda: torch.maximum(x, b),
        "where": lambda: torch.where(mask, x, b),
        "sum_dim": lambda: x.sum(-1, keepdim=True),
        "log_softmax": lambda: torch.log_softmax(x, -1),
        "custom_exp": lambda: CustomExp.apply(x),
        "exp_small": lambda: torch.exp(small),
        "custom_exp_small": lambda: CustomExp.apply(small),
        "embedding": lambda: F.embedding(ids, table),
        "layer_norm": lambda: F.layer_norm(x, (D,), gamma, beta, EPS),
        "rms_norm": lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gamma,
        "gelu_erf": lambda: F.gelu(x, approximate="none"),
        "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),
        "log": lambda: torch.log(b),
        "sqrt": lambda: torch.sqrt(b),
        "rsqrt": lambda: torch.rsqrt(b),
        "softplus": lambda: F.softplus(x),
        "abs": lambda: torch.abs(x),
        "neg": lambda: torch.neg(x),
        "square": lambda: torch.square(x),
        "pow": lambda: torch.pow(b, 1.5),
        "clamp": lambda: torch.clamp(x, -0.5, 0.5),
        "add_scalar": lambda: x + 0.25,
        "mul_scalar": lambda: x * 0.75,
        "minimum": lambda: torch.minimum(x, b),
    }

    upstream = {"embedding": dy3, "sum_dim": dy_rows, "exp_small": dy_small, "custom_exp_small": dy_small}

    leaves = (x, gamma, beta, table, b, small)

    def iterate(op, keep):
        out = forward[op]()
        out.backward(upstream.get(op, dy))
        if not keep:  # PyTorch's cheapest path: the next backward makes a new .grad
            for t in leaves:
                t.grad = None

    for keep, suffix in ((False, ""), (True, "+kept")):
        for op in OPS:
            iterate(op, keep)  # warm up (and, kept, make the .grad the timed backwards add into)
            t0 = clock()
            iterate(op, keep)
            once = clock() - t0
            inner = max(1, int(sample_seconds / once) + 1) if once > 0 else 1000
            times = []
            for _ in range(samples):
                start = clock()
                for _ in range(inner):
                    iterate(op, keep)
                times.append((clock() - start) / inner)
            print(f"{op}{suffix}\t{statistics.median(times):.9g}\t{min(times):.9g}", flush=True)
        for t in leaves:
            t.grad = None
    print(f"report\t{json.dumps(tc.torch_config())}\t-")


def parse(text):
    rows = {}
    for line in text.splitlines():
        name, a, b = line.split("\t", 2)
        rows[name] = (a, b)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="build/bench/ops", help="path of qkv's bench/ops")
    parser.add_argument("--quick", action="store_true", help="3 shorter samples (qkv and PyTorch alike)")
    parser.add_argument("--wall", action="store_true", help="wall time instead of process CPU time")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of both children (default 5)")
    parser.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    samples, sample_seconds = (3, 0.005) if args.quick else (7, 0.02)
    if args.torch_child:
        torch_child(samples, sample_seconds, time.perf_counter if args.wall else time.process_time)
        return 0
    tc.require_openblas()

    flags = (["--quick"] if args.quick else []) + ([] if args.wall else ["--cpu-time"])
    child = [sys.executable, os.path.abspath(__file__), "--torch-child"] + (["--quick"] if args.quick else []) + \
        (["--wall"] if args.wall else [])
    bench = [args.bench, "--tsv"] + flags
    qkv, pt, pt_kept = {op: [] for op in OPS}, {op: [] for op in OPS}, {op: [] for op in OPS}
    report = None
    load = os.getloadavg()
    for _ in range(args.rounds):  # interleaved: qkv, PyTorch, qkv, PyTorch, ...
        q = parse(subprocess.run(bench, check=True, capture_output=True, text=True, env=tc.torch_env(1, torch_side=False)).stdout)
        t = parse(subprocess.run(child, check=True, capture_output=True, text=True, env=tc.torch_env(1)).stdout)
        report = json.loads(t["report"][0])
        for op in OPS:
            qkv[op].append(float(q[op][0]))
            pt[op].append(float(t[op][0]))
            pt_kept[op].append(float(t[op + "+kept"][0]))

    print(tc.torch_config_line(report))
    print(tc.env_line(1))
    print(f"building blocks forward+backward, f32, x [{ROWS}, {D}], one thread; PyTorch eager; each child's "
          f"median of {samples} samples, median of {args.rounds} interleaved rounds; "
          f"{'wall' if args.wall else 'CPU'} time; load average {load[0]:.1f} at the start")
    print("PyTorch ms: .grad set to None after each iteration, so each backward writes a new gradient (its cheapest "
          "path); kept ms: .grad kept, so each backward adds into it, as qkv's parameters do (and as a PyTorch 1.13 "
          "loop with optimizer.zero_grad(), whose default zeroes the gradients in place); ratios are PyTorch / qkv")
    print(f"{'op':<16} {'PyTorch ms':>11} {'kept ms':>9} {'qkv ms':>9} {'ratio':>7} {'kept':>7}  goal (PyTorch, kept)")
    for op in OPS:
        p_ms, k_ms, q_ms = statistics.median(pt[op]), statistics.median(pt_kept[op]), statistics.median(qkv[op])
        ratio, kept, goal = p_ms / q_ms, k_ms / q_ms, GOALS.get(op)
        verdict = "-" if goal is None else (f"{goal}x {'met' if ratio >= goal else 'NOT met'}, "
                                            f"{'met' if kept >= goal else 'NOT met'}")
        print(f"{op:<16} {p_ms * 1e3:11.3f} {k_ms * 1e3:9.3f} {q_ms * 1e3:9.3f} {ratio:6.2f}x {kept:6.2f}x  {verdict}")
    q_over = statistics.median(qkv["custom_exp_small"]) - statistics.median(qkv["exp_small"])
    p_over = statistics.median(pt["custom_exp_small"]) - statistics.median(pt["exp_small"])
    print(f"a user-defined operator's overhead per call (custom_exp_small - exp_small, [{SMALL}]): "
          f"qkv {q_over * 1e6:.2f} us, PyTorch autograd.Function {p_over * 1e6:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
