#!/usr/bin/python3
"""The model layer's PyTorch twin: the same decoder as qkv/model.h, written in PyTorch 1.13, run on qkv-format
checkpoints, to make the golden files tests/test_model_twin.c compares qkv with (run by hand; needs Debian's
python3-torch and python3-numpy; the test itself needs neither).

For each configuration below the script draws parameters (numpy, seeded), writes them as a qkv checkpoint
(safetensors written with the standard library, the configuration in the "qkv.model.*" metadata exactly as
qkv_model_save writes it), runs the PyTorch model in float64 on a fixed batch and writes
    tests/data/model_twin/<case>.safetensors          the checkpoint qkv loads with qkv_model_load
    tests/data/model_twin/<case>_golden.safetensors   ids, targets, logits, loss and grad.<name> for every
                                                      parameter, of L = mean next-token cross-entropy
    tests/data/model_twin/<case>_hooks.safetensors    (the cases in HOOK_CASES) every hook point of
                                                      include/qkv/hooks.h under its name, in qkv's layout
                                                      (heads [B*H, n, d_head]), of the same forward

    /usr/bin/python3 tests/tools/make_model_twin.py

The architecture is python/qkv/torch_model.py's forward (the same file qkv.torch builds its nn.Module on).
"""
import json
import os
import struct

import importlib.util

import numpy as np
import torch
import torch.nn.functional as F

# The architecture lives in the Python package (python/qkv/torch_model.py), loaded as a file so that this script
# needs neither the package nor libqkv.
_spec = importlib.util.spec_from_file_location(
    "qkv_torch_model", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "qkv",
                                    "torch_model.py"))
torch_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_model)
forward, param_shapes = torch_model.forward, torch_model.param_shapes

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "model_twin")

BASE = dict(vocab=13, n_ctx=10, d_model=12, n_layer=2, n_head=3, d_mlp=20, norm="layer", positions="learned",
            qk_norm="none", attn_scale="default", attn_softcap=0.0, tied_embeddings=False, dropout=0.0,
            activation="gelu", norm_eps=1e-5, rope_base=10000.0, dtype="f64", seed=0, attn_bias=False, n_kv_head=0,
            init_std=0.02, init_embed_std=0.02, init_resid_std=-1.0, attn_variant="softmax", attn_gate="none",
            attn_diff=False)

CASES = {
    "attn_only_nonorm_learned": dict(d_mlp=0, norm="none"),
    "mlp_layer_learned": dict(),
    "rms_sinusoidal_gelu_tanh": dict(norm="rms", positions="sinusoidal", activation="gelu_tanh"),
    "rope_qk_layer": dict(positions="rope", qk_norm="layer"),
    "rope_qk_rms_softcap_relu": dict(positions="rope", qk_norm="rms", attn_softcap=1.5, activation="relu"),
    "tied_nopos_scale1": dict(tied_embeddings=True, positions="none", attn_scale=1.0),
    "three_layers_softcap_sinusoidal": dict(n_layer=3, attn_softcap=4.0, positions="sinusoidal", norm_eps=1e-3),
    "attn_only_rope_one_head": dict(d_mlp=0, n_head=1, positions="rope", n_layer=1),
    "swiglu_rms_rope_bias": dict(activation="swiglu", norm="rms", positions="rope", attn_bias=True),
    "geglu_layer_learned_bias": dict(activation="geglu", attn_bias=True, attn_softcap=2.0),
    "gqa_swiglu_rms_rope_bias": dict(d_model=16, n_head=4, n_kv_head=2, activation="swiglu", norm="rms",
                                     positions="rope", attn_bias=True, qk_norm="rms"),
    "mqa_learned_layer": dict(d_model=16, n_head=4, n_kv_head=1),
    # attn_variant (include/qkv/attention.h), each with other parts of the block
    "softmax1_rope_gqa": dict(attn_variant="softmax1", positions="rope", d_model=16, n_head=4, n_kv_head=2),
    "sink_layer_learned_bias": dict(attn_variant="sink", attn_bias=True),
    "sigmoid_rms_sinusoidal_relu": dict(attn_variant="sigmoid", norm="rms", positions="sinusoidal", activation="relu"),
    "ssmax_rope_qk_rms_gqa": dict(attn_variant="ssmax", positions="rope", qk_norm="rms", d_model=16, n_head=4,
                                  n_kv_head=2),
    "softpick_swiglu_bias_tied": dict(attn_variant="softpick", activation="swiglu", attn_bias=True,
                                      tied_embeddings=True, n_layer=3),
    # attn_gate (gated attention output), with variants, grouped-query attention, rope, biases, a soft-cap
    "gate_head_gqa_rope_bias": dict(attn_gate="head", d_model=16, n_head=4, n_kv_head=2, positions="rope",
                                    attn_bias=True),
    "gate_element_sink_rms": dict(attn_gate="element", attn_variant="sink", norm="rms", activation="swiglu"),
    "gate_head_softcap_nonorm": dict(attn_gate="head", attn_softcap=2.0, norm="none", d_mlp=0),
    "gate_element_softpick_bias_gqa": dict(attn_gate="element", attn_variant="softpick", attn_bias=True,
                                           d_model=16, n_head=4, n_kv_head=1, qk_norm="layer"),
    # attn_diff (differential attention), with rope (each half rotated), grouped-query attention, a gate
    "diff_layer_learned": dict(attn_diff=True, n_layer=3),
    "diff_rope_gqa_rms_bias": dict(attn_diff=True, positions="rope", d_model=16, n_head=2, n_kv_head=1, norm="rms",
                                   attn_bias=True, qk_norm="rms"),
    "diff_gate_head_scale_swiglu": dict(attn_diff=True, attn_gate="head", attn_scale=0.75, activation="swiglu",
                                        positions="sinusoidal"),
}
BATCH, N = 2, 7
# The cases whose hook values are written: layer norm with a plain MLP and learned positions; grouped-query
# attention with rms norms, rope, qk-norm and a gated MLP; soft-capped scores with sinusoidal positions; the sink
# and SSMax variants (their hook_pattern the variant's weights, hook_attn_scores the plain scale q k^T); both gates
# (hook_gate, and hook_z the gated z); differential attention (hook_pattern A1 - lambda A2, no hook_attn_scores).
HOOK_CASES = ("mlp_layer_learned", "gqa_swiglu_rms_rope_bias", "three_layers_softcap_sinusoidal",
              "sink_layer_learned_bias", "ssmax_rope_qk_rms_gqa", "gate_head_gqa_rope_bias", "gate_element_sink_rms",
              "diff_rope_gqa_rms_bias")


def meta_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if v != int(v) or abs(v) >= 1e16 else "%.17g" % v
    return str(v)


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, numpy array); written in order, data contiguous from offset 0."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors:
        a = np.ascontiguousarray(a)
        dt = {np.dtype("float64"): "F64", np.dtype("int32"): "I32"}[a.dtype]
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(tmp, path)


def main():
    os.makedirs(OUT, exist_ok=True)
    for index, (case, change) in enumerate(CASES.items()):
        c = dict(BASE, **change)
        rng = np.random.default_rng(1000 + index)
        P, order = {}, []
        for name, shape, kind in param_shapes(c):
            if kind == "w":
                a = rng.normal(0.0, 0.3, shape)
            elif kind == "gain":
                a = 1.0 + rng.normal(0.0, 0.2, shape)
            elif kind == "sink":
                a = rng.normal(0.0, 1.0, shape)
            else:
                a = rng.normal(0.0, 0.1, shape)
            P[name] = torch.tensor(a, dtype=torch.float64, requires_grad=True)
            order.append(name)
        ids = rng.integers(0, c["vocab"], size=(BATCH, N)).astype(np.int32)
        targets = np.concatenate([ids[:, 1:], -np.ones((BATCH, 1), np.int32)], axis=1).astype(np.int32)
        hooks = {}
        logits = forward(c, P, torch.tensor(ids, dtype=torch.long), hooks=hooks)
        loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), torch.tensor(targets, dtype=torch.long).reshape(-1),
                               ignore_index=-1)
        loss.backward()
        meta = {"qkv.format": "qkv-model-1"}
        for key, v in c.items():
            meta["qkv.model." + key] = meta_value(v)
        write_safetensors(os.path.join(OUT, case + ".safetensors"),
                          [(name, P[name].detach().numpy()) for name in order], meta)
        golden = [("ids", ids), ("targets", targets), ("logits", logits.detach().numpy()),
                  ("loss", np.array(loss.item(), dtype=np.float64))]
        golden += [("grad." + name, P[name].grad.numpy()) for name in order]
        write_safetensors(os.path.join(OUT, case + "_golden.safetensors"), golden, None)
        if case in HOOK_CASES:
            write_safetensors(os.path.join(OUT, case + "_hooks.safetensors"),
                              [(name, np.ascontiguousarray(t.detach().numpy())) for name, t in hooks.items()], None)
        print("%-36s loss %.6f  %d parameters%s" % (case, loss.item(), len(order),
                                                     ", %d hook points" % len(hooks) if case in HOOK_CASES else ""))


if __name__ == "__main__":
    main()
