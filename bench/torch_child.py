"""torch_child.py — what every bench/compare_*.py needs to run PyTorch in a child process on a known number
of threads, and to say what that child actually used. Import it from a script in bench/ (the scripts' own
directory is on sys.path): `from torch_child import torch_env, torch_setup, torch_config, torch_config_line`.

  torch_env(threads, torch_side=True) -> dict
      The environment for a child process: a copy of os.environ with OMP_NUM_THREADS, OPENBLAS_NUM_THREADS
      and MKL_NUM_THREADS set to `threads` (they must be in the child's environment before torch is
      imported: torch.set_num_threads alone leaves OpenBLAS on its own count). For the PyTorch child
      (torch_side) OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed, so that OpenBLAS picks its kernel for
      this CPU; pass torch_side=False for a qkv child (which keeps them, harmlessly).
  torch_setup(threads) -> torch
      In the child: imports torch, calls torch.set_num_threads(threads), returns the module.
  openblas_info() -> dict(path, blas, config, corename, threads)
      In the child, after torch is imported: what the libopenblas that torch loaded says about itself
      (openblas_get_config / openblas_get_corename / openblas_get_num_threads through ctypes on the library
      found in /proc/self/maps), and blas, the file behind the generic libblas.so.3 torch linked (None fields
      when torch did not load them).
  torch_config() -> dict(torch, torch_threads, parallel_info, openblas)
      In the child: the PyTorch version, torch.get_num_threads(), the thread lines of
      torch.__config__.parallel_info() and openblas_info(); JSON-serialisable, for the child to send back.
  torch_config_line(cfg) -> str
      In the parent: one line (two, joined by a newline) naming what a child's torch_config() reported.
  env_line(threads) -> str
      In the parent: the thread variables the children got and what happened to OPENBLAS_CORETYPE.
  require_openblas()
      In the parent, before any timing: starts a child as the PyTorch children are started and exits with a
      message when its torch did not load OpenBLAS. Debian's python3-torch links the generic libblas.so.3,
      which without an OpenBLAS package installed is the reference BLAS: PyTorch's products then run many
      times slower than usual and every ratio against it means nothing (preset (b) of compare_model gave
      0.18 PyTorch steps/s that way on a Zen 4, against 3.45 with OpenBLAS).
"""
import json
import os
import subprocess
import sys

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
OPENBLAS_TUNING_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def torch_env(threads, torch_side=True):
    env = dict(os.environ)
    for k in THREAD_VARS:
        env[k] = str(threads)
    if torch_side:
        for k in OPENBLAS_TUNING_VARS:
            env.pop(k, None)
    return env


def torch_setup(threads):
    import torch
    torch.set_num_threads(threads)
    return torch


def openblas_info():
    import ctypes
    path = blas = None
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and "openblas" in fields[-1].lower() and ".so" in fields[-1]:
                path = path or fields[-1]  # Debian: openblas-pthread/libblas.so.3 or libopenblas.so.0
            if len(fields) >= 6 and os.path.basename(fields[-1]).startswith("libblas.so"):
                blas = fields[-1]  # the generic BLAS torch links: OpenBLAS's or the reference one
    info = dict(path=path, blas=blas, config=None, corename=None, threads=None)
    if not path:
        return info
    lib = ctypes.CDLL(path)
    for name, key in (("openblas_get_config", "config"), ("openblas_get_corename", "corename")):
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_char_p
            info[key] = fn().decode()
    if hasattr(lib, "openblas_get_num_threads"):
        lib.openblas_get_num_threads.restype = ctypes.c_int
        info["threads"] = lib.openblas_get_num_threads()
    return info


def torch_config():
    import torch
    cfg = torch.__config__.parallel_info()
    return dict(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                parallel_info=[l.strip() for l in cfg.splitlines() if "thread" in l.lower() or "backend" in l.lower()],
                openblas=openblas_info())


def torch_config_line(cfg):
    ob = cfg["openblas"]
    return (f"PyTorch {cfg['torch']}: torch.get_num_threads() = {cfg['torch_threads']}; "
            f"{'; '.join(cfg['parallel_info'])}\n"
            f"OpenBLAS torch loaded: {ob['path']}: core {ob['corename']}, {ob['threads']} thread(s), "
            f"config '{ob['config']}'")


def env_line(threads):
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    return (f"environment of the children: {', '.join(f'{k}={threads}' for k in THREAD_VARS)}; OPENBLAS_CORETYPE "
            f"{'was ' + repr(coretype) + ', removed for PyTorch' if coretype is not None else 'not set'}")


def require_openblas():
    probe = ("import json, sys; sys.path.insert(0, %r); import torch_child as tc; tc.torch_setup(1); "
             "print(json.dumps(tc.openblas_info()))" % os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", probe], env=torch_env(1), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{os.path.basename(sys.argv[0])}: PyTorch cannot be imported by {sys.executable} "
                 f"(apt-get install -y python3-torch): {out.stderr.strip().splitlines()[-1:]}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    if not info["path"] or (info["blas"] and "openblas" not in info["blas"].lower()):
        sys.exit(f"{os.path.basename(sys.argv[0])}: PyTorch's BLAS is {info['blas'] or 'not OpenBLAS'}, the reference one, "
                 "and runs its products many times slower than usual: every ratio against it would be wrong. "
                 "Install OpenBLAS (apt-get install -y libopenblas-dev), or select it with update-alternatives --config "
                 "libblas.so.3-x86_64-linux-gnu, and run again.")
