#!/usr/bin/env python3
"""compare_gemm.py — qkv's f32 and f64 GEMMs against OpenBLAS sgemm / dgemm, one thread, same shapes, same run.

Runs bench/gemm with --openblas: the benchmark loads libopenblas into its own process, sets it to one
thread (and the child's environment is bench/torch_child.py's torch_env(1): OMP/OPENBLAS/MKL_NUM_THREADS=1,
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed so OpenBLAS picks its kernel for this CPU), and times qkv and
OpenBLAS interleaved, run by run, so load on the machine hits both alike (each ratio is the median over runs
of the ratio within a run). With --cpu (the default; --wall for wall time) both are timed in process CPU
time, which leaves out the time slices other processes take on a shared machine.
Prints the benchmark's tables (each figure also as a share of the core's measured FMA peak, bench/peak.h),
then the target rows (square 256..2048 and the attention shapes, f32 and f64) with qkv/OpenBLAS and whether
each meets 0.9x. On a busy machine, rerun when it is quiet.

    python3 bench/compare_gemm.py [--build build] [--runs 11] [--min] [--quick] [--wall] [--dtype both]
                                  [--openblas /path/libopenblas.so]

Needs OpenBLAS (Debian: apt-get install -y libopenblas-dev); without it, says so and exits 0.
Prints figures, asserts nothing.
"""
import argparse
import ctypes.util
import os
import platform
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_child import env_line, torch_env  # noqa: E402

TARGET = 0.9


def find_openblas(explicit):
    if explicit:
        return explicit
    name = ctypes.util.find_library("openblas")
    if name:
        return name
    for path in ("/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
                 "/usr/lib64/libopenblas.so.0", "/usr/local/lib/libopenblas.so"):
        if os.path.exists(path):
            return path
    return None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def is_target(label):
    m = re.match(r"(\S+) (\d+)x(\d+)x(\d+)", label)
    if not m:
        return False
    kind, dims = m.group(1), [int(x) for x in m.groups()[1:]]
    if kind == "square":
        return 256 <= dims[0] <= 2048
    return kind in ("QK^T", "AV", "A^TdO") and max(dims) >= 128


def parse_tables(text):
    """{dtype: (columns, [(label, values)])} from bench/gemm's output, and its peak line."""
    tables, dtype, cols, peak = {}, None, None, None
    for line in text.splitlines():
        m = re.match(r"# (f32|f64) GEMM", line)
        if m:
            dtype = m.group(1)
            tables[dtype] = (None, [])
            continue
        if line.startswith("# peak"):
            peak = line[2:]
            continue
        if line.startswith("# shape") and dtype:
            cols = line[line.index("trans)") + len("trans)"):].split()
            tables[dtype] = (cols, [])
            continue
        if line.startswith("#") or not line.strip() or not dtype:
            continue
        tables[dtype][1].append((line[:30].strip(), line[30:].split()))
    return tables, peak


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(root, "build"), help="meson build directory")
    ap.add_argument("--runs", type=int, default=11, help="runs per figure (median)")
    ap.add_argument("--min", action="store_true", help="report the fastest run instead of the median")
    ap.add_argument("--quick", action="store_true", help="skip the largest shapes")
    ap.add_argument("--wall", action="store_true", help="wall time instead of process CPU time")
    ap.add_argument("--dtype", default="both", choices=("f32", "f64", "both"))
    ap.add_argument("--openblas", help="path of libopenblas")
    args = ap.parse_args()

    exe = os.path.join(args.build, "bench", "gemm")
    if not os.access(exe, os.X_OK):
        print(f"no benchmark at {exe}: build it first (meson setup {args.build} && ninja -C {args.build})")
        return 1
    lib = find_openblas(args.openblas)
    if not lib:
        print("OpenBLAS not found (apt-get install -y libopenblas-dev): nothing to compare against")
        return 0

    cmd = [exe, "--runs", str(args.runs), "--openblas", lib, "--dtype", args.dtype]
    if args.min:
        cmd.append("--min")
    if args.quick:
        cmd.append("--quick")
    if not args.wall:
        cmd.append("--cpu")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {cpu_name()}, {os.cpu_count()} cpus, "
          f"load average {os.getloadavg()[0]:.2f} (start)")
    print("# " + env_line(1).replace("children", "child"))
    print("# " + " ".join(cmd))
    out = subprocess.run(cmd, env=torch_env(1), capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.stdout.write(out.stderr)
        return out.returncode
    print(f"# load average {os.getloadavg()[0]:.2f} (end)")

    tables, peak = parse_tables(out.stdout)
    # The benchmark's last column is qkv/OpenBLAS as the median over runs of the ratio within each run
    # (both timed back to back), which holds up better under load than a ratio of two medians.
    print(f"\n# targets: qkv / OpenBLAS >= {TARGET} (square 256..2048, attention shapes n >= 128), f32 and f64")
    if peak:
        print(f"# {peak}")
    for dtype, (cols, rows) in tables.items():
        if not cols or "openblas" not in cols:
            continue
        i_qkv, i_ob = cols.index("qkv"), cols.index("openblas")
        i_qp, i_op = cols.index("qkv%pk"), cols.index("ob%pk")
        met = total = 0
        for label, vals in rows:
            if not is_target(label) or len(vals) != len(cols):
                continue
            qkv, ob, ratio = float(vals[i_qkv]), float(vals[i_ob]), float(vals[-1].rstrip("x"))
            total += 1
            met += ratio >= TARGET
            print(f"{dtype} {label:<30} qkv {qkv:6.1f} GF/s ({vals[i_qp]:>4} of peak)  openblas {ob:6.1f} "
                  f"({vals[i_op]:>4})  ratio {ratio:5.2f}  {'met' if ratio >= TARGET else 'NOT MET'}")
        print(f"# {dtype}: {met} of {total} target shapes at >= {TARGET}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
