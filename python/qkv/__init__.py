"""qkv from Python: ctypes bindings of libqkv and a small Pythonic layer (Context, Tensor, operators).

The shared library is found, in order: the QKV_LIBRARY environment variable (a path to libqkv.so, e.g.
build/libqkv.so of a build tree), the libqkv installed inside this package by `pip install .`, then the
system's (ctypes.util.find_library). Python reads only the public, read-only fields of qkv_tensor
(include/qkv.h); every error of the C library becomes a QkvError with its code and message.
"""
import ctypes
import ctypes.util
import glob
import os

import numpy as np

__all__ = ["QkvError", "Context", "Tensor", "lib", "tensor", "add", "mul", "sum", "mean", "matmul",
           "F32", "F64", "I32", "U8"]

F32, F64, I32, U8 = 0, 1, 2, 3
_DTYPE_NAMES = {F32: "f32", F64: "f64", I32: "i32", U8: "u8"}
_NUMPY = {F32: np.float32, F64: np.float64, I32: np.int32, U8: np.uint8}
_FROM_NUMPY = {np.dtype(v): k for k, v in _NUMPY.items()}
MAX_DIMS = 4


def _find_library():
    path = os.environ.get("QKV_LIBRARY")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "libqkv.so*")) + glob.glob(os.path.join(here, "libqkv*.dylib")))
    if found:
        return found[0]
    name = ctypes.util.find_library("qkv")
    if name:
        return name
    raise ImportError("qkv: libqkv not found: set QKV_LIBRARY to the path of libqkv.so (e.g. build/libqkv.so) "
                      "or install the package with `pip install .`")


lib = ctypes.CDLL(_find_library())


from . import _ctypes_map
from ._capi import SIGNATURES

_TensorStruct = _ctypes_map.TensorStruct
_t_p = ctypes.POINTER(_TensorStruct)


def _declare_all():
    """Declares every public function of the headers (_capi.SIGNATURES) on lib: restype and argtypes (a
    variadic function's fixed arguments). A function the library does not export is an ImportError."""
    for name, (ret, args) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"qkv: {lib._name} has no {name} (the headers declare it): an older libqkv?")
        fn.restype = _ctypes_map.ctype(ret)
        fn.argtypes = [_ctypes_map.ctype(a) for a in args if a != "..."]


_declare_all()


def version():
    return lib.qkv_version().decode()


class QkvError(RuntimeError):
    """A failed qkv call: .code is the qkv_status number, .name its name ("QKV_ERR_SHAPE"), the message
    qkv's own (naming the function, the shapes and the problem)."""

    def __init__(self, code, message):
        self.code = code
        self.name = lib.qkv_status_name(code).decode()
        super().__init__(f"{self.name}: {message}")


class Context:
    """A qkv context (owns every tensor made in it). step_end() ends a step: the step tensors made since the
    last one become invalid (using their Tensor objects afterwards raises QkvError), parameters stay."""

    def __init__(self, seed=0):
        self._ptr = lib.qkv_ctx_new(None)
        if not self._ptr:
            raise MemoryError("qkv_ctx_new: out of memory")
        self.step = 0
        lib.qkv_seed(self._ptr, seed)

    def _check(self):
        code = lib.qkv_error(self._ptr)
        if code != 0:
            message = lib.qkv_errmsg(self._ptr).decode(errors="replace")
            lib.qkv_clear_error(self._ptr)  # the error is reported once, as the exception
            raise QkvError(code, message)

    def _wrap(self, ptr, persistent=False):
        self._check()
        if not ptr:
            raise QkvError(1, "a qkv call returned no tensor")
        return Tensor(self, ptr, persistent)

    def step_end(self):
        lib.qkv_step_end(self._ptr)
        self.step += 1

    def close(self):
        if self._ptr:
            lib.qkv_ctx_free(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()

    def tensor(self, array, dtype=None, requires_grad=False, param=False):
        """A copy of array (anything np.asarray takes) as a tensor of this context: a step tensor, or with
        param=True a persistent parameter (requires grad, kept across step_end)."""
        a = np.asarray(array)
        if dtype is not None:
            a = a.astype(_NUMPY[dtype])
        if a.dtype not in _FROM_NUMPY:
            if a.dtype == np.bool_:
                a = a.astype(np.uint8)
            elif np.issubdtype(a.dtype, np.integer):
                a = a.astype(np.int32)
            else:
                raise TypeError(f"qkv.tensor: dtype {a.dtype} has no qkv dtype (f32, f64, i32, u8)")
        if a.ndim > MAX_DIMS:
            raise ValueError(f"qkv.tensor: {a.ndim} dimensions, at most {MAX_DIMS}")
        a = np.ascontiguousarray(a)
        shape = (ctypes.c_int64 * MAX_DIMS)(*a.shape)
        ptr = lib.qkv_from_data(self._ptr, _FROM_NUMPY[a.dtype], a.ndim, shape, a.ctypes.data_as(ctypes.c_void_p))
        t = self._wrap(ptr)
        if param:
            t = self._wrap(lib.qkv_param(self._ptr, t._p()), persistent=True)
        elif requires_grad:
            t.requires_grad = True
        return t


_default = None


def default_context():
    global _default
    if _default is None:
        _default = Context()
    return _default


def tensor(array, dtype=None, requires_grad=False, ctx=None):
    """qkv.tensor(ndarray): a copy of the array in ctx (the default context if None)."""
    return (ctx or default_context()).tensor(array, dtype=dtype, requires_grad=requires_grad)


class Tensor:
    """A qkv tensor. .numpy() is a zero-copy view of its data; the view keeps this Tensor (and so its
    context) alive. A step tensor is valid until its context's step_end."""

    def __init__(self, ctx, ptr, persistent=False):
        self.ctx = ctx
        self._ptr = ptr
        self._step = None if persistent else ctx.step

    def _p(self):
        if self._step is not None and self._step != self.ctx.step:
            raise QkvError(8, f"step tensor of step {self._step} used in step {self.ctx.step} (after step_end)")
        if self.ctx._ptr is None:
            raise QkvError(9, "the tensor's context is closed")
        return self._ptr

    @property
    def shape(self):
        s = self._p().contents
        return tuple(s.shape[i] for i in range(s.ndim))

    @property
    def ndim(self):
        return self._p().contents.ndim

    @property
    def dtype(self):
        return _DTYPE_NAMES[self._p().contents.dtype]

    @property
    def numel(self):
        return self._p().contents.numel

    @property
    def requires_grad(self):
        return self._p().contents.requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        lib.qkv_set_requires_grad(self.ctx._ptr, self._p(), bool(value))
        self.ctx._check()

    @property
    def grad(self):
        g = self._p().contents.grad
        if not g:
            return None
        t = Tensor(self.ctx, ctypes.cast(g, _t_p), persistent=self._step is None)
        if self._step is not None:
            t._step = self._step
        return t

    def numpy(self):
        s = self._p().contents
        np_dtype = np.dtype(_NUMPY[s.dtype])
        shape = tuple(s.shape[i] for i in range(s.ndim))
        if s.numel == 0:
            return np.zeros(shape, np_dtype)
        buf = (ctypes.c_char * (s.numel * np_dtype.itemsize)).from_address(s.data)
        buf._qkv_owner = self  # the view's base is buf, which keeps this Tensor alive
        return np.frombuffer(buf, dtype=np_dtype).reshape(shape)

    def backward(self):
        lib.qkv_backward(self.ctx._ptr, self._p(), None)
        self.ctx._check()

    def item(self):
        return self.numpy().reshape(()).item() if self.numel == 1 else self.numpy().item()

    def __repr__(self):
        return f"qkv.Tensor(shape={self.shape}, dtype={self.dtype})"

    def __add__(self, other):
        return add(self, other)

    def __mul__(self, other):
        return mul(self, other)

    def __matmul__(self, other):
        return matmul(self, other)


def _args(fname, *tensors):
    ctx = None
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"qkv.{fname}: expected qkv.Tensor, got {type(t).__name__}")
        if ctx is None:
            ctx = t.ctx
        elif t.ctx is not ctx:
            raise ValueError(f"qkv.{fname}: tensors of different contexts")
    return ctx, [t._p() for t in tensors]


def add(a, b):
    ctx, (pa, pb) = _args("add", a, b)
    return ctx._wrap(lib.qkv_add(ctx._ptr, pa, pb))


def mul(a, b):
    ctx, (pa, pb) = _args("mul", a, b)
    return ctx._wrap(lib.qkv_mul(ctx._ptr, pa, pb))


def sum(a):  # noqa: A001 (qkv_sum)
    ctx, (pa,) = _args("sum", a)
    return ctx._wrap(lib.qkv_sum(ctx._ptr, pa))


def mean(a):
    ctx, (pa,) = _args("mean", a)
    return ctx._wrap(lib.qkv_mean(ctx._ptr, pa))


def matmul(a, b, trans_a=False, trans_b=False):
    ctx, (pa, pb) = _args("matmul", a, b)
    return ctx._wrap(lib.qkv_matmul(ctx._ptr, pa, pb, (1 if trans_a else 0) | (2 if trans_b else 0)))
