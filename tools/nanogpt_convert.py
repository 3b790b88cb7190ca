#!/usr/bin/env python3
"""nanogpt_convert.py — nanoGPT checkpoints to qkv checkpoints and back.

    python3 tools/nanogpt_convert.py to-qkv ckpt.pt model.safetensors [--dtype f32|f64]
    python3 tools/nanogpt_convert.py to-nanogpt model.safetensors ckpt.pt

nanoGPT (github.com/karpathy/nanoGPT) saves `torch.save({"model": state_dict, "model_args": {...}, ...})`
from train.py; its GPT is the model qkv builds with learned positions, pre-norm layer norm (eps 1e-5), the
exact GELU, d_mlp = 4 d_model, tied embeddings and, when model_args["bias"] is true, biases on every linear
layer and layer norm. The mapping (qkv stores weights [d_in, d_out], nn.Linear [d_out, d_in]):

    transformer.wte.weight             embed.W_E                  (lm_head.weight is the same tensor: tied)
    transformer.wpe.weight             pos_embed.W_pos
    transformer.h.L.ln_1.weight, bias  blocks.L.ln1.w, b          (bias false: b = 0)
    transformer.h.L.attn.c_attn        W_Q, W_K, W_V = the three column blocks of weight.T; b_Q, b_K, b_V of bias
    transformer.h.L.attn.c_proj        W_O = weight.T, b_O = bias
    transformer.h.L.ln_2               blocks.L.ln2.w, b
    transformer.h.L.mlp.c_fc           W_in = weight.T, b_in = bias (bias false: 0)
    transformer.h.L.mlp.c_proj         W_out = weight.T, b_out = bias (bias false: 0)
    transformer.ln_f                   ln_final.w, b

The attention's causal-mask buffer (transformer.h.L.attn.bias, present without flash attention) and the
"_orig_mod." prefix of a torch.compile'd model are dropped. A model with dropout converts (qkv's checkpoint
records dropout 0: dropout is a training choice; pass it to the training program). Back to nanoGPT: a qkv
model of that shape only (anything else is refused naming the field); zero biases become bias=False only if
every bias is zero and the layer-norm biases too. Files are written with the standard library (safetensors'
format, qkv's "qkv.model.*" metadata); needs torch for the .pt side.
"""
import argparse
import json
import struct
import sys

import numpy as np

FORMAT = "qkv-model-1"


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    meta = header.pop("__metadata__", {})
    types = {"F32": np.float32, "F64": np.float64, "I32": np.int32}
    tensors = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        tensors[name] = np.frombuffer(raw[8 + size + a:8 + size + b], dtype=np.dtype(types[h["dtype"]]).newbyteorder("<"))
        tensors[name] = tensors[name].reshape(h["shape"]).astype(types[h["dtype"]])
    return tensors, meta


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, numpy array), written in order; an atomic replace of path."""
    import os
    header, offset, blobs = {}, 0, []
    for name, a in tensors:
        a = np.ascontiguousarray(a)
        dt = {np.dtype("float64"): "F64", np.dtype("float32"): "F32"}[a.dtype]
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def to_qkv(state, model_args, dtype="f32"):
    """nanoGPT's state dict (name -> tensor or array) and model_args -> (qkv tensors in order, metadata)."""
    state = {k[len("_orig_mod."):] if k.startswith("_orig_mod.") else k: np.asarray(v.detach().cpu().numpy()
             if hasattr(v, "detach") else v, dtype=np.float64) for k, v in state.items()}
    L, H, d = int(model_args["n_layer"]), int(model_args["n_head"]), int(model_args["n_embd"])
    V, n_ctx, bias = int(model_args["vocab_size"]), int(model_args["block_size"]), bool(model_args.get("bias", True))
    if d % H:
        raise ValueError("n_embd %d is not divisible by n_head %d" % (d, H))
    np_dt = np.float32 if dtype == "f32" else np.float64

    def get(name, shape=None, zero_if_no_bias=False):
        if name not in state:
            if zero_if_no_bias and not bias:
                return np.zeros(shape)
            raise KeyError("the nanoGPT state dict has no %s" % name)
        return state[name]

    out = [("embed.W_E", get("transformer.wte.weight")), ("pos_embed.W_pos", get("transformer.wpe.weight"))]
    for layer in range(L):
        p, q = "transformer.h.%d." % layer, "blocks.%d." % layer
        w = get(p + "attn.c_attn.weight")  # [3d, d]
        b = get(p + "attn.c_attn.bias", (3 * d,), True)
        out += [(q + "ln1.w", get(p + "ln_1.weight")), (q + "ln1.b", get(p + "ln_1.bias", (d,), True)),
                (q + "attn.W_Q", w[:d].T), (q + "attn.W_K", w[d:2 * d].T), (q + "attn.W_V", w[2 * d:].T),
                (q + "attn.W_O", get(p + "attn.c_proj.weight").T)]
        if bias:
            out += [(q + "attn.b_Q", b[:d]), (q + "attn.b_K", b[d:2 * d]), (q + "attn.b_V", b[2 * d:]),
                    (q + "attn.b_O", get(p + "attn.c_proj.bias"))]
        out += [(q + "ln2.w", get(p + "ln_2.weight")), (q + "ln2.b", get(p + "ln_2.bias", (d,), True)),
                (q + "mlp.W_in", get(p + "mlp.c_fc.weight").T), (q + "mlp.b_in", get(p + "mlp.c_fc.bias", (4 * d,), True)),
                (q + "mlp.W_out", get(p + "mlp.c_proj.weight").T),
                (q + "mlp.b_out", get(p + "mlp.c_proj.bias", (d,), True))]
    out += [("ln_final.w", get("transformer.ln_f.weight")), ("ln_final.b", get("transformer.ln_f.bias", (d,), True))]
    if "lm_head.weight" in state and not np.array_equal(state["lm_head.weight"], state["transformer.wte.weight"]):
        raise ValueError("lm_head.weight differs from transformer.wte.weight: nanoGPT ties them, and qkv's conversion "
                         "needs them tied")
    config = dict(vocab=V, n_ctx=n_ctx, d_model=d, n_layer=L, n_head=H, d_mlp=4 * d, norm="layer", positions="learned",
                  qk_norm="none", attn_scale="default", attn_softcap="0", tied_embeddings="true", dropout="0",
                  activation="gelu", norm_eps="1.0000000000000001e-05", rope_base="10000", dtype=dtype, seed="0",
                  attn_weights="softmax", attn_bias="true" if bias else "false")
    meta = {"qkv.format": FORMAT}
    meta.update({"qkv.model." + k: str(v) for k, v in config.items()})
    return [(name, np.ascontiguousarray(a, dtype=np_dt)) for name, a in out], meta


def to_nanogpt(tensors, meta):
    """qkv tensors and metadata -> (nanoGPT state dict of numpy arrays, model_args)."""
    c = {k[len("qkv.model."):]: v for k, v in meta.items() if k.startswith("qkv.model.")}
    want = dict(norm="layer", positions="learned", qk_norm="none", attn_scale="default", tied_embeddings="true",
                activation="gelu", attn_weights="softmax")
    for k, v in want.items():
        if c.get(k, "softmax" if k == "attn_weights" else None) != v:
            raise ValueError("qkv.model.%s is %r: nanoGPT's GPT needs %r" % (k, c.get(k), v))
    if float(c["attn_softcap"]) != 0 or abs(float(c["norm_eps"]) - 1e-5) > 1e-12 or int(c["d_mlp"]) != 4 * int(c["d_model"]):
        raise ValueError("nanoGPT's GPT has no soft-cap, eps 1e-5 and d_mlp = 4 d_model; this model has %s, %s, %s"
                         % (c["attn_softcap"], c["norm_eps"], c["d_mlp"]))
    L, d = int(c["n_layer"]), int(c["d_model"])
    has_attn_bias = c.get("attn_bias", "false") == "true"
    bias_names = [n for n in tensors if n.endswith((".b", ".b_in", ".b_out", ".b_Q", ".b_K", ".b_V", ".b_O"))]
    bias = has_attn_bias or any(np.any(tensors[n] != 0) for n in bias_names)
    if bias and not has_attn_bias:
        raise ValueError("the model has nonzero layer-norm or MLP biases but no attention biases: nanoGPT's bias "
                         "switch covers all of them")
    s = {"transformer.wte.weight": tensors["embed.W_E"], "transformer.wpe.weight": tensors["pos_embed.W_pos"]}
    for layer in range(L):
        p, q = "transformer.h.%d." % layer, "blocks.%d." % layer
        s[p + "ln_1.weight"] = tensors[q + "ln1.w"]
        s[p + "attn.c_attn.weight"] = np.concatenate([tensors[q + "attn.W_Q"].T, tensors[q + "attn.W_K"].T,
                                                      tensors[q + "attn.W_V"].T])
        s[p + "attn.c_proj.weight"] = tensors[q + "attn.W_O"].T
        s[p + "ln_2.weight"] = tensors[q + "ln2.w"]
        s[p + "mlp.c_fc.weight"] = tensors[q + "mlp.W_in"].T
        s[p + "mlp.c_proj.weight"] = tensors[q + "mlp.W_out"].T
        if bias:
            s[p + "ln_1.bias"] = tensors[q + "ln1.b"]
            s[p + "attn.c_attn.bias"] = np.concatenate([tensors[q + "attn.b_Q"], tensors[q + "attn.b_K"],
                                                        tensors[q + "attn.b_V"]])
            s[p + "attn.c_proj.bias"] = tensors[q + "attn.b_O"]
            s[p + "ln_2.bias"] = tensors[q + "ln2.b"]
            s[p + "mlp.c_fc.bias"] = tensors[q + "mlp.b_in"]
            s[p + "mlp.c_proj.bias"] = tensors[q + "mlp.b_out"]
    s["transformer.ln_f.weight"] = tensors["ln_final.w"]
    if bias:
        s["transformer.ln_f.bias"] = tensors["ln_final.b"]
    s["lm_head.weight"] = tensors["embed.W_E"]
    args = dict(n_layer=L, n_head=int(c["n_head"]), n_embd=d, block_size=int(c["n_ctx"]), bias=bias,
                vocab_size=int(c["vocab"]), dropout=0.0)
    return {k: np.ascontiguousarray(v) for k, v in s.items()}, args


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("to-qkv")
    a.add_argument("ckpt")
    a.add_argument("out")
    a.add_argument("--dtype", choices=["f32", "f64"], default="f32")
    b = sub.add_parser("to-nanogpt")
    b.add_argument("qkv")
    b.add_argument("out")
    args = ap.parse_args()
    import torch
    if args.cmd == "to-qkv":
        ck = torch.load(args.ckpt, map_location="cpu")
        tensors, meta = to_qkv(ck["model"], ck["model_args"], args.dtype)
        write_safetensors(args.out, tensors, meta)
    else:
        tensors, meta = read_safetensors(args.qkv)
        state, model_args = to_nanogpt(tensors, meta)
        torch.save({"model": {k: torch.from_numpy(v.copy()) for k, v in state.items()}, "model_args": model_args},
                   args.out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (KeyError, ValueError) as e:
        print("nanogpt_convert.py: %s" % e, file=sys.stderr)
        sys.exit(1)
