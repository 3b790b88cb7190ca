"""Files from Python: .npy (qkv_npy_save / qkv_npy_load) and safetensors (qkv_safetensors_save / _load), through
the C library's readers and writers (atomic writes; the readers treat their input as untrusted)."""
import ctypes
import os

import numpy as np

from . import Tensor, _args, _t_p, default_context, lib


class _NamedTensor(ctypes.Structure):  # qkv_named_tensor (include/qkv/safetensors.h)
    _fields_ = [("name", ctypes.c_char_p), ("tensor", _t_p)]


def save_npy(tensor, path):
    """Write tensor to path as .npy (qkv_npy_save, atomic)."""
    ctx, (p,) = _args("save_npy", tensor)
    lib.qkv_npy_save(ctx._ptr, p, os.fsencode(path))
    ctx._check()


def load_npy(path, ctx=None, keep=False):
    """A .npy file as a Tensor of ctx (the default context when None): a step tensor, or with keep=True a
    persistent copy (qkv_keep) that outlives step_end."""
    ctx = ctx or default_context()
    t = ctx._wrap(lib.qkv_npy_load(ctx._ptr, os.fsencode(path)))
    if keep:
        t = ctx._wrap(lib.qkv_keep(ctx._ptr, t._p()), persistent=True)
    return t


def save_safetensors(path, tensors, metadata=None, ctx=None):
    """Write {name: Tensor or numpy array} to path as safetensors (qkv_safetensors_save, atomic), with metadata
    {key: value} strings. Arrays are copied into ctx (the default context when None) for the write."""
    if not isinstance(tensors, dict) or not tensors:
        raise TypeError("qkv.save_safetensors: tensors must be a non-empty dict {name: Tensor or array}")
    given = [t for t in tensors.values() if isinstance(t, Tensor)]
    if given:
        ctx2, _ = _args("save_safetensors", *given)
        if ctx is not None and ctx is not ctx2:
            raise ValueError("qkv.save_safetensors: tensors of another context than ctx")
        ctx = ctx2
    ctx = ctx or default_context()
    named = (_NamedTensor * len(tensors))()
    for i, (name, t) in enumerate(tensors.items()):
        if not isinstance(name, str):
            raise TypeError(f"qkv.save_safetensors: names must be strings, got {type(name).__name__}")
        if not isinstance(t, Tensor):
            t = ctx.tensor(t)
        named[i].name, named[i].tensor = name.encode(), t._p()
    items = [s.encode() for kv in (metadata or {}).items() for s in kv]
    meta = (ctypes.c_char_p * max(1, len(items)))(*items)
    lib.qkv_safetensors_save(ctx._ptr, os.fsencode(path), ctypes.addressof(named), len(tensors),
                             ctypes.cast(meta, ctypes.c_void_p) if items else None, len(items) // 2)
    ctx._check()


def load_safetensors(path, ctx=None):
    """(tensors, metadata): a safetensors file's tensors as {name: numpy array} (copies, in name order) and its
    metadata as {key: value} strings (qkv_safetensors_load)."""
    ctx = ctx or default_context()
    st = lib.qkv_safetensors_load(ctx._ptr, os.fsencode(path))
    ctx._check()
    try:
        tensors = {}
        for i in range(lib.qkv_safetensors_count(st)):
            name = lib.qkv_safetensors_name(st, i)
            ptr = ctypes.cast(lib.qkv_safetensors_get(st, name), _t_p)
            tensors[name.decode()] = np.array(Tensor(ctx, ptr, persistent=True).numpy())
        metadata = {}
        for i in range(lib.qkv_safetensors_metadata_count(st)):
            key = lib.qkv_safetensors_metadata_key(st, i)
            metadata[key.decode()] = lib.qkv_safetensors_metadata(st, key).decode()
        return tensors, metadata
    finally:
        lib.qkv_safetensors_free(ctx._ptr, st)


Tensor.save_npy = save_npy

__all__ = ["save_npy", "load_npy", "save_safetensors", "load_safetensors"]
