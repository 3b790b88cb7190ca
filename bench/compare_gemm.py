#!/usr/bin/env python3
"""compare_gemm.py — qkv's f32 GEMM against OpenBLAS sgemm, one thread, same shapes, same run (by hand).

Runs bench/gemm with --openblas: the benchmark loads libopenblas into its own process, sets it to one
thread (and OPENBLAS_NUM_THREADS=1 is set here too), and times qkv and OpenBLAS interleaved, run by run,
so load on the machine hits both alike (each ratio is the median over runs of the ratio within a run).
Prints the benchmark's table, then the issue-6 target rows (square 256..2048 and the attention shapes)
with qkv/OpenBLAS and whether each meets 0.9x. On a busy machine, rerun when it is quiet.

    python3 bench/compare_gemm.py [--build build] [--runs 11] [--min] [--quick] [--openblas /path/libopenblas.so]

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


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(root, "build"), help="meson build directory")
    ap.add_argument("--runs", type=int, default=11, help="runs per figure (median)")
    ap.add_argument("--min", action="store_true", help="report the fastest run instead of the median")
    ap.add_argument("--quick", action="store_true", help="skip the largest shapes")
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

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = [exe, "--runs", str(args.runs), "--openblas", lib]
    if args.min:
        cmd.append("--min")
    if args.quick:
        cmd.append("--quick")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {cpu_name()}, {os.cpu_count()} cpus, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("# " + " ".join(cmd))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.stdout.write(out.stderr)
        return out.returncode

    header = None
    rows = []
    for line in out.stdout.splitlines():
        if line.startswith("# shape"):
            header = line[1:].split()
            continue
        if line.startswith("#") or not line.strip():
            continue
        label, rest = line[:30].strip(), line[30:].split()
        rows.append((label, rest))
    if header is None:
        return 0
    cols = header[header.index("p,") + 2:] if "p," in header else header[-len(rows[0][1]):]
    try:
        i_qkv, i_ob = cols.index("qkv"), cols.index("openblas")
    except ValueError:
        return 0

    # The benchmark's last column is qkv/OpenBLAS as the median over runs of the ratio within each run
    # (both timed back to back), which holds up better under load than a ratio of two medians.
    print(f"\n# issue-6 targets: qkv / OpenBLAS >= {TARGET} (square 256..2048, attention shapes n >= 128)")
    met = total = 0
    for label, vals in rows:
        if not is_target(label):
            continue
        qkv, ob, ratio = float(vals[i_qkv]), float(vals[i_ob]), float(vals[-1].rstrip("x"))
        total += 1
        met += ratio >= TARGET
        print(f"{label:<30} qkv {qkv:7.1f}  openblas {ob:7.1f}  ratio {ratio:5.2f}  "
              f"{'ok' if ratio >= TARGET else 'BELOW'}")
    print(f"# {met} of {total} target shapes at >= {TARGET}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
