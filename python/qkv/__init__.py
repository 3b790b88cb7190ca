"""qkv from Python: ctypes bindings of libqkv and a small Pythonic layer (Context, Tensor, operators).

The shared library is found, in order: the QKV_LIBRARY environment variable (a path to libqkv.so, e.g.
build/libqkv.so of a build tree), the libqkv installed inside this package by `pip install .`, then the
system's (ctypes.util.find_library). Python reads only the public, read-only fields of qkv_tensor
(include/qkv.h); every error of the C library becomes a QkvError with its code and message.
"""
import contextlib
import ctypes
import ctypes.util
import glob
import os
import weakref

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
        self.message = message
        super().__init__(f"{self.name}: {message}")


class Context:
    """A qkv context (owns every tensor made in it). step_end() ends a step: the step tensors made since the
    last one become invalid (using their Tensor objects afterwards raises QkvError), parameters stay."""

    def __init__(self, seed=0, threads=1, release_grads=False, arena_chunk=0):
        options = lib.qkv_default_options()
        options.seed, options.threads = seed, threads
        options.release_grads, options.arena_chunk = release_grads, arena_chunk
        self._ptr = lib.qkv_ctx_new(ctypes.byref(options))
        if not self._ptr:
            raise MemoryError("qkv_ctx_new: out of memory")
        self.step = 0
        self._owned = []  # optimizers and models of this context: freed before it
        self._views = []  # weak references to the buffers of live .numpy() views
        self._raised = []  # exceptions of Python callbacks (hooks, user-defined operators) of the current C call
        self._callbacks = set()  # what C may call back while the context lives (user-defined operators)
        self._closed = False

    def _check(self):
        if self._closed or not self._ptr:
            raise QkvError(9, "the context is closed")
        code = lib.qkv_error(self._ptr)
        if code != 0:
            message = lib.qkv_errmsg(self._ptr).decode(errors="replace")
            lib.qkv_clear_error(self._ptr)  # the error is reported once, as the exception
            cause = self._raised[0] if self._raised else None  # a Python callback's exception behind it
            self._raised = []
            if cause is not None and not isinstance(cause, Exception):
                raise cause  # KeyboardInterrupt, SystemExit in a callback: C has unwound, they go on as they were
            raise QkvError(code, message) from cause
        self._raised = []

    def _callback_failed(self, exc):
        """In a Python callback called by C: exc becomes the context's error (a QkvError keeps its code, anything
        else is QKV_ERR_ARG), and the QkvError that Python raises when the C call returns has exc as its cause."""
        self._raised.append(exc)
        code = exc.code if isinstance(exc, QkvError) else 2
        text = exc.message if isinstance(exc, QkvError) else f"Python {type(exc).__name__}: {exc}"
        lib.qkv_set_error(self._ptr, code, b"%s", text.encode(errors="replace"))

    def _wrap(self, ptr, persistent=False):
        self._check()
        if not ptr:
            raise QkvError(1, "a qkv call returned no tensor")
        return Tensor(self, ptr, persistent)

    def step_end(self):
        lib.qkv_step_end(self._ptr)
        self.step += 1

    @contextlib.contextmanager
    def no_grad(self):
        """with ctx.no_grad(): operators record nothing (qkv_set_grad_enabled off), for evaluation."""
        prev = lib.qkv_set_grad_enabled(self._ptr, False)
        try:
            yield
        finally:
            lib.qkv_set_grad_enabled(self._ptr, prev)

    def close(self):
        """Frees the context and everything in it. While a .numpy() view of one of its tensors is alive, the
        context is only marked closed (every use raises QkvError) and freed when the last view goes."""
        self._closed = True
        if self._ptr and any(v() is not None for v in self.__dict__.get("_views", [])):
            return
        if self._ptr:
            for obj in reversed(self._owned):
                obj.close()
            self._owned = []
            lib.qkv_ctx_free(self._ptr)
            self._ptr = None

    def __del__(self):
        self._views = []
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
        self._owner = None  # a Model whose parameter this is: closing it frees the tensor

    def _p(self):
        if self._step is not None and self._step != self.ctx.step:
            raise QkvError(8, f"step tensor of step {self._step} used in step {self.ctx.step} (after step_end)")
        if self.ctx._ptr is None or self.ctx._closed:
            raise QkvError(9, "the tensor's context is closed")
        if self._owner is not None and not self._owner._ptr:
            raise QkvError(9, "the tensor's model or optimizer is closed (its parameters were freed)")
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
        self.ctx._views = [v for v in self.ctx._views if v() is not None] + [weakref.ref(buf)]
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


# ---- every operator: a qkv_* function of (ctx, tensors and scalars) returning a tensor ---------------------
_TENSOR_ARGS = ("qkv_tensor *", "const qkv_tensor *")
_SCALAR_ARGS = ("int", "int64_t", "double", "float", "bool", "qkv_dtype", "qkv_gelu_approx")


def _make_operator(cname, args):
    kinds = args[1:]

    def op(*values):
        if len(values) != len(kinds):
            raise TypeError(f"qkv.{cname[4:]}: {len(kinds)} arguments ({', '.join(kinds)}), got {len(values)}")
        tensors = [v for v, k in zip(values, kinds) if k in _TENSOR_ARGS and v is not None]
        ctx, _ = _args(cname[4:], *tensors)
        if ctx is None:
            raise TypeError(f"qkv.{cname[4:]}: no tensor argument")
        call = []
        for v, k in zip(values, kinds):
            if k in _TENSOR_ARGS:
                call.append(None if v is None else v._p())  # None: NULL (an optional mask; C refuses it elsewhere)
            elif k in ("double", "float"):
                call.append(float(v))
            elif k == "bool":
                call.append(bool(v))
            else:
                call.append(int(v))
        return ctx._wrap(getattr(lib, cname)(ctx._ptr, *call))

    op.__name__ = cname[4:]
    op.__doc__ = f"{cname}(ctx, {', '.join(kinds)}) of the C API (docs/api.md); errors raise QkvError."
    return op


OPERATORS = []
for _name, (_ret, _a) in SIGNATURES.items():
    if (_ret == "qkv_tensor *" and _a and _a[0] == "qkv_ctx *" and any(k in _TENSOR_ARGS for k in _a[1:])
            and all(k in _TENSOR_ARGS + _SCALAR_ARGS for k in _a[1:]) and not _name.startswith("qkv_model") and _name not in ("qkv_param", "qkv_keep")):
        OPERATORS.append(_name[4:])
        if _name[4:] not in globals():
            globals()[_name[4:]] = _make_operator(_name, _a)


def _tensor_array(tensors, fname):
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"qkv.{fname}: expected qkv.Tensor, got {type(t).__name__}")
    arr = (_t_p * max(1, len(tensors)))(*[t._p() for t in tensors])
    return arr


class Optimizer:
    """qkv_optimizer over persistent tensors (parameters): Optimizer(params, "adam", lr=1e-3, ...); the
    option names are qkv_optim_options' fields, the defaults qkv_optim_defaults(kind)'s."""
    KINDS = {"sgd": 0, "adam": 1, "adamw": 2}

    def __init__(self, params, kind="adam", **options):
        params = list(params)
        if not params:
            raise ValueError("qkv.Optimizer: no parameters")
        if kind not in self.KINDS:
            raise ValueError(f"qkv.Optimizer: kind {kind!r}, not one of {sorted(self.KINDS)}")
        self.ctx = params[0].ctx
        _args("Optimizer", *params)
        opts = lib.qkv_optim_defaults(self.KINDS[kind])
        names = {f[0] for f in _ctypes_map.OptimOptions._fields_} - {"kind", "param_names"}
        for k, v in options.items():
            if k not in names:
                raise TypeError(f"qkv.Optimizer: unknown option {k!r} (options: {sorted(names)})")
            setattr(opts, k, v)
        self._params = params
        self._ptr = lib.qkv_optim_new(self.ctx._ptr, ctypes.byref(opts), _tensor_array(params, "Optimizer"),
                                      len(params))
        self.ctx._check()
        if not self._ptr:
            raise QkvError(7, "qkv_optim_new returned NULL")
        self.ctx._owned.append(self)

    def _p(self):
        if not self._ptr:
            raise QkvError(9, "the optimizer is closed (or its context is)")
        return self._ptr

    def step(self):
        lib.qkv_optim_step(self._p())
        self.ctx._check()

    def zero_grad(self):
        lib.qkv_optim_zero_grad(self._p())
        self.ctx._check()

    @property
    def lr(self):
        return lib.qkv_optim_lr(self._p())

    @lr.setter
    def lr(self, value):
        lib.qkv_optim_set_lr(self._p(), float(value))
        self.ctx._check()

    @property
    def step_count(self):
        return lib.qkv_optim_step_count(self._p())

    def close(self):
        if self._ptr:
            lib.qkv_optim_free(self._ptr)
            self._ptr = None

    def __del__(self):
        if self.__dict__.get("_ptr"):
            self.close()


# ---- the model (include/qkv/model.h) ------------------------------------------------------------------------
def _enum_names(fn):
    names = []
    while True:
        n = fn(len(names))
        if not n:
            return names
        names.append(n.decode())


_ENUMS = {"norm": lambda: _enum_names(lib.qkv_norm_kind_name), "qk_norm": lambda: _enum_names(lib.qkv_norm_kind_name),
          "positions": lambda: _enum_names(lib.qkv_positions_kind_name),
          "activation": lambda: _enum_names(lib.qkv_activation_kind_name),
          "attn_variant": lambda: _enum_names(lib.qkv_attn_variant_name),
          "attn_gate": lambda: _enum_names(lib.qkv_attn_gate_kind_name)}
_CONFIG_FIELDS = [f[0] for f in _ctypes_map.ModelConfig._fields_ if not f[0].startswith("attn_weights")]


def _config_to_dict(cfg):
    out = {}
    for name in _CONFIG_FIELDS:
        v = getattr(cfg, name)
        if name in _ENUMS:
            v = _ENUMS[name]()[v]
        elif name == "dtype":
            v = _DTYPE_NAMES[v]
        out[name] = v
    return out


def default_config():
    """qkv_model_default_config() as a dict: enums by name, dtype as "f32"/"f64"."""
    return _config_to_dict(lib.qkv_model_default_config())


class Model:
    """qkv_model. Model(ctx, **config): the keyword arguments are qkv_model_config's fields (default_config()
    gives the C defaults); enums by name ("rms", "rope", "swiglu", ...), dtype "f32" or "f64"."""

    def __init__(self, ctx, _ptr=None, **config):
        self.ctx = ctx
        if _ptr is None:
            cfg = lib.qkv_model_default_config()
            for k, v in config.items():
                if k not in _CONFIG_FIELDS:
                    raise TypeError(f"qkv.Model: unknown config field {k!r} (fields: {_CONFIG_FIELDS})")
                if k in _ENUMS:
                    names = _ENUMS[k]()
                    if v not in names:
                        raise ValueError(f"qkv.Model: {k} {v!r}, not one of {names}")
                    v = names.index(v)
                elif k == "dtype":
                    if v not in ("f32", "f64"):
                        raise ValueError(f"qkv.Model: dtype {v!r}, not 'f32' or 'f64'")
                    v = F32 if v == "f32" else F64
                setattr(cfg, k, v)
            _ptr = lib.qkv_model_new(ctx._ptr, ctypes.byref(cfg))
        ctx._check()
        if not _ptr:
            raise QkvError(7, "qkv_model_new returned NULL")
        self._ptr = _ptr
        ctx._owned.append(self)

    @classmethod
    def load(cls, ctx, path):
        ptr = lib.qkv_model_load(ctx._ptr, os.fsencode(path))
        ctx._check()
        return cls(ctx, _ptr=ptr)

    def _p(self):
        if not self._ptr:
            raise QkvError(9, "the model is closed (or its context is)")
        return self._ptr

    @property
    def config(self):
        return _config_to_dict(lib.qkv_model_get_config(self._p()).contents)

    @property
    def params(self):
        """{name: Tensor} of the parameters, in the model's order."""
        n = lib.qkv_model_param_count(self._p())
        ptrs = lib.qkv_model_params(self._p())
        names = ctypes.cast(lib.qkv_model_param_names(self._p()), ctypes.POINTER(ctypes.c_char_p))
        out = {}
        for i in range(n):
            out[names[i].decode()] = t = Tensor(self.ctx, ptrs[i], persistent=True)
            t._owner = self
        return out

    def _ids(self, ids, what):
        if isinstance(ids, Tensor):
            return ids
        a = np.asarray(ids)
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"qkv.Model.{what}: ids must be integers, got {a.dtype}")
        return self.ctx.tensor(a.astype(np.int32))

    def forward(self, ids, causal=True):
        """logits [B, n, vocab] for ids [B, n] (an integer array or an i32 Tensor)."""
        t = self._ids(ids, "forward")
        return self.ctx._wrap(lib.qkv_model_forward(self.ctx._ptr, self._p(), t._p(), 1 if causal else 0))

    def loss(self, logits, targets):
        t = self._ids(targets, "loss")
        _args("Model.loss", logits, t)
        return self.ctx._wrap(lib.qkv_model_loss(self.ctx._ptr, logits._p(), t._p()))

    def save(self, path, optimizer=None, metadata=None):
        """Writes a checkpoint (atomic); metadata: {key: value} strings of your own (keys not "qkv.*")."""
        items = [s.encode() for kv in (metadata or {}).items() for s in kv]
        extra = (ctypes.c_char_p * max(1, len(items)))(*items)
        lib.qkv_model_save(self.ctx._ptr, self._p(), os.fsencode(path), optimizer._p() if optimizer else None,
                           ctypes.cast(extra, ctypes.c_void_p), len(items) // 2)
        self.ctx._check()

    def close(self):
        if self._ptr:
            lib.qkv_model_free(self._ptr)
            self._ptr = None


def _typed_value(field, text, path):
    """A qkv.model.<field> metadata string as the type of the config field: bool from "true"/"false" only
    (never truthiness of the string), int, float ("default" for attn_scale: the C default), enum names."""
    proto = lib.qkv_model_default_config()
    ctype = dict(_ctypes_map.ModelConfig._fields_)[field]
    if field in _ENUMS:
        if text not in _ENUMS[field]():
            raise QkvError(11, f"qkv.checkpoint_metadata: {path}: qkv.model.{field} is {text!r}, not one of {_ENUMS[field]()}")
        return text
    if field == "dtype":
        if text not in ("f32", "f64"):
            raise QkvError(11, f"qkv.checkpoint_metadata: {path}: qkv.model.dtype is {text!r}")
        return text
    if ctype is ctypes.c_bool:
        if text not in ("true", "false"):
            raise QkvError(11, f"qkv.checkpoint_metadata: {path}: qkv.model.{field} is {text!r}, not true or false")
        return text == "true"
    if ctype is ctypes.c_double:
        if field == "attn_scale" and text == "default":
            return proto.attn_scale
        return float(text)
    return int(text)


def checkpoint_metadata(path, ctx=None):
    """(config, other): a checkpoint's qkv.model.* metadata as {field: value} typed as the config field
    (bool, int, float, enum name, dtype name), and every other metadata key as its string."""
    ctx = ctx or default_context()
    st = lib.qkv_safetensors_load(ctx._ptr, os.fsencode(path))
    ctx._check()
    try:
        config, other = {}, {}
        for i in range(lib.qkv_safetensors_metadata_count(st)):
            key = lib.qkv_safetensors_metadata_key(st, i).decode()
            value = lib.qkv_safetensors_metadata(st, key.encode()).decode()
            field = key[len("qkv.model."):]
            if key.startswith("qkv.model.") and field in _CONFIG_FIELDS:
                config[field] = _typed_value(field, value, path)
            else:
                other[key] = value
        return config, other
    finally:
        lib.qkv_safetensors_free(ctx._ptr, st)


class _SampleOptions(ctypes.Structure):  # qkv_sample_options (include/qkv/model.h)
    _fields_ = [("temperature", ctypes.c_double), ("top_k", ctypes.c_int64)]


INSPECT_KINDS = ["resid_pre", "resid_mid", "resid_post", "pattern", "head_out", "scores"]


def _model_sample(self, prompt, n_new, temperature=1.0, top_k=0):
    """n_new token ids (an int32 array) extending prompt (a 1-D integer sequence) with the causal model,
    from the context RNG (qkv_model_sample: temperature 0 is greedy)."""
    p = np.ascontiguousarray(np.asarray(prompt), dtype=np.int32)
    if p.ndim != 1 or p.size < 1:
        raise ValueError(f"qkv.Model.sample: prompt must be a non-empty 1-D sequence, got shape {p.shape}")
    n_new = int(n_new)
    if n_new < 0:
        raise ValueError(f"qkv.Model.sample: n_new {n_new} < 0")
    out = np.zeros(max(1, n_new), np.int32)
    opts = _SampleOptions(float(temperature), int(top_k))
    lib.qkv_model_sample(self.ctx._ptr, self._p(), p.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), p.size, n_new,
                         ctypes.byref(opts), out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)))
    self.ctx._check()
    return out[:n_new]


def _model_set_inspect(self, on=True):
    """Keep the inspected tensors of every later forward (qkv_model_set_inspect); returns the old setting."""
    return lib.qkv_model_set_inspect(self._p(), bool(on))


def _model_inspect(self, what, layer):
    """A tensor of the last forward: what is one of INSPECT_KINDS ("pattern", ...); a step tensor."""
    if what not in INSPECT_KINDS:
        raise ValueError(f"qkv.Model.inspect: {what!r}, not one of {INSPECT_KINDS}")
    return self.ctx._wrap(lib.qkv_model_inspect(self.ctx._ptr, self._p(), INSPECT_KINDS.index(what), int(layer)))


Model.sample = _model_sample
Model.set_inspect = _model_set_inspect
Model.inspect = _model_inspect


class _GradcheckOptions(ctypes.Structure):  # qkv_gradcheck_options (include/qkv.h)
    _fields_ = [("eps", ctypes.c_double), ("atol", ctypes.c_double), ("rtol", ctypes.c_double),
                ("five_point", ctypes.c_bool), ("seed", ctypes.c_uint64), ("check", ctypes.c_void_p)]


class _GradcheckResult(ctypes.Structure):  # qkv_gradcheck_result (include/qkv.h)
    _fields_ = [("passed", ctypes.c_bool), ("checked", ctypes.c_int64), ("failed", ctypes.c_int64),
                ("worst_input", ctypes.c_int), ("worst_index", ctypes.c_int64), ("analytic", ctypes.c_double),
                ("numeric", ctypes.c_double), ("abs_err", ctypes.c_double), ("rel_err", ctypes.c_double),
                ("message", ctypes.c_char * 256)]


_GRADCHECK_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_t_p), ctypes.c_int, ctypes.c_void_p)


def gradcheck(fn, inputs, eps=0.0, atol=0.0, rtol=0.0, five_point=False, seed=0):
    """qkv_gradcheck of fn(list of Tensors) -> Tensor over the f64 inputs: a dict of qkv_gradcheck_result's
    fields (passed, checked, failed, worst_input, worst_index, analytic, numeric, abs_err, rel_err,
    message). An exception raised by fn stops the check and is raised again here. The Tensors fn receives
    and makes are released after each call: keep none of them."""
    inputs = list(inputs)
    ctx, ptrs = _args("gradcheck", *inputs)
    if ctx is None:
        raise ValueError("qkv.gradcheck: no inputs")
    raised = []

    def callback(_ctx, in_ptrs, n, _user):
        if raised:
            return None
        try:
            out = fn([Tensor(ctx, ctypes.cast(in_ptrs[i], _t_p)) for i in range(n)])
            if not isinstance(out, Tensor):
                raise TypeError(f"qkv.gradcheck: fn returned {type(out).__name__}, not a qkv.Tensor")
            return ctypes.cast(out._p(), ctypes.c_void_p).value
        except BaseException as e:  # never through C
            raised.append(e)
            return None

    c_fn = _GRADCHECK_FN(callback)
    opts = _GradcheckOptions(eps, atol, rtol, five_point, seed, None)
    result = _GradcheckResult()
    arr = (_t_p * len(ptrs))(*ptrs)
    lib.qkv_gradcheck(ctx._ptr, ctypes.cast(c_fn, ctypes.c_void_p), arr, len(ptrs), None, ctypes.byref(opts),
                      ctypes.byref(result))
    if raised:
        lib.qkv_clear_error(ctx._ptr)
        raise raised[0]
    ctx._check()
    out = {f[0]: getattr(result, f[0]) for f in _GradcheckResult._fields_}
    out["message"] = result.message.decode(errors="replace")
    return out


# ---- hooks, user-defined operators, files (python/qkv/_hooks.py, _custom.py, _io.py) ---------------------------
from ._hooks import ABLATIONS  # noqa: E402  (adds Model.add_hook, run_with_cache, patch, ablate, ablate_head, ...)
from ._custom import CustomOp, CustomCall  # noqa: E402
from ._io import save_npy, load_npy, save_safetensors, load_safetensors  # noqa: E402

__all__ += ["Model", "Optimizer", "gradcheck", "checkpoint_metadata", "default_config", "ABLATIONS", "CustomOp",
            "CustomCall", "save_npy", "load_npy", "save_safetensors", "load_safetensors"]
