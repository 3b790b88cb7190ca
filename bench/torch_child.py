"""torch_child.py — what the bench/compare_*.py scripts share to run PyTorch fairly beside qkv.

Each side runs in a child process whose environment pins its threads before anything is imported:

  - child_env(torch_side) is os.environ with OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = the
    stated count (THREAD_VARS). torch.set_num_threads alone leaves OpenBLAS on its own thread count: only the
    variable, set before torch (and so libopenblas) is loaded, pins it. For the PyTorch side only,
    OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed, so that OpenBLAS picks the kernels for this CPU
    (a machine's environment may force e.g. Haswell's); qkv's side, the tests and CI keep the environment
    as it is.
  - the PyTorch child calls torch.set_num_threads(n) as well, and reports what it actually ran with:
    torch_report() gives torch's version, torch.get_num_threads(), the thread lines of
    torch.__config__.parallel_info(), and openblas_info(): openblas_get_config / openblas_get_corename /
    openblas_get_num_threads through ctypes on the libopenblas that torch loaded.
  - describe(report) is the line a script prints about it, env_line() the line about the environment.

Used by bench/compare_ops.py, bench/compare_copy_task.py and bench/compare_attention_skinny.py (and in the
same way by bench/compare_model.py).
"""
import os
import resource

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
DROPPED_FOR_TORCH = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def maxrss_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child_env(torch_side, threads=1):
    """The environment of a child: threads pinned; for PyTorch, OpenBLAS left to choose its own kernels."""
    env = dict(os.environ)
    for k in THREAD_VARS:
        env[k] = str(threads)
    if torch_side:
        for k in DROPPED_FOR_TORCH:
            env.pop(k, None)
    return env


def env_line(threads=1):
    """What the children's environment was, for the scripts' output."""
    dropped = [f"{k}={os.environ[k]!r}" for k in DROPPED_FOR_TORCH if k in os.environ]
    return (f"children's environment: {', '.join(f'{k}={threads}' for k in THREAD_VARS)}; "
            + (f"removed for PyTorch only: {', '.join(dropped)}" if dropped
               else "OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE not set"))


def openblas_info():
    """What the libopenblas that torch loaded says about itself (None fields if it is not OpenBLAS)."""
    import ctypes
    path = None
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and "openblas" in fields[-1].lower() and ".so" in fields[-1]:
                path = fields[-1]  # Debian: openblas-pthread/libblas.so.3 or libopenblas.so.0
                break
    info = dict(path=path, config=None, corename=None, threads=None)
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


def torch_report():
    """In the PyTorch child, after torch is imported and used: what it ran with (a JSON-able dict)."""
    import torch
    cfg = torch.__config__.parallel_info()
    return dict(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                parallel_info=[l.strip() for l in cfg.splitlines() if "thread" in l.lower() or "backend" in l.lower()],
                openblas=openblas_info())


def describe(report):
    """Two lines about a torch_report(): PyTorch's threads, and OpenBLAS's kernel and threads."""
    ob = report["openblas"]
    return (f"PyTorch {report['torch']}: torch.get_num_threads() = {report['torch_threads']}; "
            f"{'; '.join(report['parallel_info'])}\n"
            f"OpenBLAS torch loaded: {ob['path']}: core {ob['corename']}, {ob['threads']} thread(s), "
            f"config '{ob['config']}'")
