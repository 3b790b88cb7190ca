"""Every public function of include/qkv.h and include/qkv/*.h has a ctypes binding with the header's
argument count and types, and the by-value structs Python mirrors have the header's fields in order."""
import ctypes
import os
import re
import sys

import pytest

import qkv
from qkv import _capi, _ctypes_map

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python", "tools"))
import gen_capi  # noqa: E402

HAVE_HEADERS = os.path.exists(os.path.join(ROOT, "include", "qkv.h"))
pytestmark = pytest.mark.skipif(not HAVE_HEADERS, reason="no include/ next to python/ (an installed copy)")


def test_headers_parse_to_many_functions():
    funcs = gen_capi.parse()
    # every line of the headers that starts with QKV_API declares one function
    text = "".join(open(h, encoding="utf-8").read() for h in gen_capi.headers())
    declared = len(re.findall(r"^\s*QKV_API\b", text, re.M))
    assert len(funcs) == declared > 150


def test_table_is_what_the_headers_declare():
    funcs = gen_capi.parse()
    header = {name: (ret, args) for name, ret, args in funcs}
    assert sorted(set(header) - set(_capi.SIGNATURES)) == [], "functions with no binding"
    assert sorted(set(_capi.SIGNATURES) - set(header)) == [], "bindings of functions the headers lost"
    for name, sig in header.items():
        assert _capi.SIGNATURES[name] == sig, f"{name}: header {sig}, binding {_capi.SIGNATURES[name]}"


def test_every_function_declared_on_the_library_with_the_header_types():
    for name, ret, args in gen_capi.parse():
        fn = getattr(qkv.lib, name)
        fixed = [a for a in args if a != "..."]
        assert fn.argtypes is not None and len(fn.argtypes) == len(fixed), name
        for i, (c, t) in enumerate(zip(fixed, fn.argtypes)):
            assert t is _ctypes_map.ctype(c), f"{name} argument {i}: {c} bound as {t}"
        assert fn.restype is _ctypes_map.ctype(ret), f"{name} returns {ret}, bound as {fn.restype}"


def test_ctype_sizes_of_c_types():
    assert ctypes.sizeof(_ctypes_map.ctype("int64_t")) == 8
    assert _ctypes_map.ctype("const qkv_tensor *") is ctypes.POINTER(_ctypes_map.TensorStruct)
    assert _ctypes_map.ctype("qkv_status") is ctypes.c_int
    assert _ctypes_map.ctype("qkv_options") is _ctypes_map.Options
    with pytest.raises(KeyError):
        _ctypes_map.ctype("qkv_unknown_struct")


def _struct_fields(header, struct):
    text = open(os.path.join(ROOT, "include", header), encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    body = re.search(r"typedef struct " + struct + r"\s*\{(.*?)\}\s*" + struct + ";", text, re.S).group(1)
    body = body.split("---- private ----")[0]
    names = []
    for decl in body.split(";"):
        decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
        if "(*" in decl:  # a function pointer field
            names.append(re.search(r"\(\s*\*\s*(\w+)\s*\)", decl).group(1))
        elif decl:
            names += [re.search(r"(\w+)\s*$", part).group(1) for part in decl.split(",")]
    return names


@pytest.mark.parametrize("header,struct,cls", [
    ("qkv.h", "qkv_options", _ctypes_map.Options),
    ("qkv.h", "qkv_allocator", _ctypes_map.Allocator),
    ("qkv/optim.h", "qkv_optim_options", _ctypes_map.OptimOptions),
    ("qkv/model.h", "qkv_model_config", _ctypes_map.ModelConfig),
    ("qkv/model.h", "qkv_sample_options", qkv._SampleOptions),
    ("qkv.h", "qkv_gradcheck_options", qkv._GradcheckOptions),
    ("qkv.h", "qkv_gradcheck_result", qkv._GradcheckResult),
])
def test_struct_fields_match_header(header, struct, cls):
    assert [f[0] for f in cls._fields_] == _struct_fields(header, struct)


def test_tensor_head_matches_header_public_fields():
    text = open(os.path.join(ROOT, "include", "qkv.h"), encoding="utf-8").read()
    body = re.search(r"typedef struct qkv_tensor \{(.*?)/\* ---- private", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", " ", body, flags=re.S)
    names = [re.search(r"(\w+)\s*(\[\w+\])?\s*$", d).group(1) for d in body.split(";") if d.strip()]
    assert [f[0] for f in _ctypes_map.TensorStruct._fields_] == names


def test_by_value_structs_round_trip_through_c():
    opts = qkv.lib.qkv_default_options()
    assert opts.seed == 0 and opts.threads >= 0 and opts.release_grads is False
    cfg = qkv.lib.qkv_model_default_config()
    assert (cfg.vocab, cfg.n_ctx, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.d_mlp) == (256, 128, 128, 2, 4, 512)
    assert cfg.norm_eps == 1e-5 and cfg.rope_base == 10000.0 and cfg.tied_embeddings is False
    adam = qkv.lib.qkv_optim_defaults(1)
    assert (adam.beta1, adam.beta2, adam.eps) == (0.9, 0.999, 1e-8)
    # and a config passed back by pointer is accepted by the C check
    ctx = qkv.Context()
    assert qkv.lib.qkv_model_config_check(ctx._ptr, ctypes.byref(cfg)) == 0


def test_generated_table_is_current():
    assert gen_capi.render(gen_capi.parse()) == open(os.path.join(ROOT, "python", "qkv", "_capi.py")).read()
