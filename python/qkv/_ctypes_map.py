"""C types of the public headers as ctypes types: what python/qkv/__init__.py declares every function of
_capi.SIGNATURES with. The by-value structs mirror their header definitions field by field
(python/tests/test_capi.py compares the field names and order with the headers)."""
import ctypes
import re

MAX_DIMS = 4


class TensorStruct(ctypes.Structure):
    """The public, read-only head of qkv_tensor (include/qkv.h); the private fields that follow it in C are
    never read."""
    _fields_ = [("dtype", ctypes.c_int), ("ndim", ctypes.c_int), ("shape", ctypes.c_int64 * MAX_DIMS),
                ("numel", ctypes.c_int64), ("data", ctypes.c_void_p), ("grad", ctypes.c_void_p),
                ("requires_grad", ctypes.c_bool)]


class Allocator(ctypes.Structure):
    _fields_ = [("malloc_fn", ctypes.c_void_p), ("free_fn", ctypes.c_void_p), ("user", ctypes.c_void_p)]


class Options(ctypes.Structure):  # qkv_options
    _fields_ = [("allocator", Allocator), ("seed", ctypes.c_uint64), ("threads", ctypes.c_int),
                ("arena_chunk", ctypes.c_size_t), ("release_grads", ctypes.c_bool)]


class OptimOptions(ctypes.Structure):  # qkv_optim_options
    _fields_ = [("kind", ctypes.c_int), ("lr", ctypes.c_double), ("momentum", ctypes.c_double),
                ("dampening", ctypes.c_double), ("nesterov", ctypes.c_bool), ("weight_decay", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("param_names", ctypes.c_void_p)]


class ModelConfig(ctypes.Structure):  # qkv_model_config
    _fields_ = [("vocab", ctypes.c_int64), ("n_ctx", ctypes.c_int64), ("d_model", ctypes.c_int64),
                ("n_layer", ctypes.c_int64), ("n_head", ctypes.c_int64), ("n_kv_head", ctypes.c_int64),
                ("d_mlp", ctypes.c_int64), ("norm", ctypes.c_int), ("positions", ctypes.c_int),
                ("qk_norm", ctypes.c_int), ("attn_scale", ctypes.c_double), ("attn_softcap", ctypes.c_double),
                ("tied_embeddings", ctypes.c_bool), ("dropout", ctypes.c_double), ("activation", ctypes.c_int),
                ("attn_bias", ctypes.c_bool), ("attn_variant", ctypes.c_int), ("attn_gate", ctypes.c_int),
                ("attn_diff", ctypes.c_bool), ("norm_eps", ctypes.c_double),
                ("init_std", ctypes.c_double), ("init_embed_std", ctypes.c_double),
                ("init_resid_std", ctypes.c_double), ("rope_base", ctypes.c_double),
                ("dtype", ctypes.c_int), ("seed", ctypes.c_uint64), ("attn_weights", ctypes.c_void_p),
                ("attn_weights_user", ctypes.c_void_p), ("attn_weights_name", ctypes.c_char_p)]


class AttentionOptions(ctypes.Structure):  # qkv_attention_options
    _fields_ = [("variant", ctypes.c_int), ("scale", ctypes.c_double), ("flags", ctypes.c_int),
                ("mask", ctypes.c_void_p), ("heads", ctypes.c_int), ("sink", ctypes.c_void_p),
                ("sigmoid_bias", ctypes.c_double), ("ssmax_c", ctypes.c_void_p), ("softpick_eps", ctypes.c_double),
                ("softcap", ctypes.c_double), ("kv_heads", ctypes.c_int)]


STRUCTS = {"qkv_options": Options, "qkv_optim_options": OptimOptions, "qkv_model_config": ModelConfig,
           "qkv_attention_options": AttentionOptions}

_SCALARS = {
    "void": None, "bool": ctypes.c_bool, "int": ctypes.c_int, "double": ctypes.c_double, "float": ctypes.c_float,
    "size_t": ctypes.c_size_t, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32,
    "uint8_t": ctypes.c_uint8, "char": ctypes.c_char,
}
# enums of the headers (qkv_status, qkv_dtype, qkv_norm_kind, ...) are C ints
_ENUM = re.compile(r"qkv_(status|dtype|\w+_kind|gelu_approx|attn_variant)$")


def ctype(c):
    """The ctypes type for a C type spelled as in _capi.SIGNATURES; KeyError for one it cannot pass."""
    base = re.sub(r"\bconst\b", "", c).replace(" ", "")
    stars = base.count("*")
    base = base.replace("*", "")
    if "(*)" in c or base.endswith("_fn"):
        return ctypes.c_void_p  # a function pointer (callbacks are not bound from Python)
    if stars == 0:
        if base in _SCALARS:
            return _SCALARS[base]
        if _ENUM.match(base):
            return ctypes.c_int
        return STRUCTS[base]
    if stars == 1:
        if base == "char":
            return ctypes.c_char_p
        if base == "qkv_tensor":
            return ctypes.POINTER(TensorStruct)
        if base in STRUCTS:
            return ctypes.POINTER(STRUCTS[base])
        if base in _SCALARS and _SCALARS[base] is not None and base != "char":
            return ctypes.POINTER(_SCALARS[base])
        return ctypes.c_void_p  # void *, FILE *, opaque handles (qkv_ctx, qkv_model, ...)
    if stars == 2 and base == "qkv_tensor":
        return ctypes.POINTER(ctypes.POINTER(TensorStruct))
    return ctypes.c_void_p  # const char *const * and the like: arrays of pointers, read with casts
