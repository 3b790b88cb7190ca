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

The architecture, in PyTorch (every qkv weight is [d_in, d_out], so y = x @ W):
    x = W_E[ids] (+ W_pos[:n] | + sinusoidal[:n])
    per block: h = norm(x); q, k, v = h @ W_Q, h @ W_K, h @ W_V split into heads;
               q, k = qk_norm(q), qk_norm(k); q, k = rope(q), rope(k);
               s = scale q k^T (cap tanh(s / cap) if capped), causal mask, softmax, z = A v
               x = x + merge(z) @ W_O;  x = x + act(norm(x) @ W_in + b_in) @ W_out + b_out
    logits = norm(x) @ W_U  (or @ W_E^T when tied)
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "model_twin")

BASE = dict(vocab=13, n_ctx=10, d_model=12, n_layer=2, n_head=3, d_mlp=20, norm="layer", positions="learned",
            qk_norm="none", attn_scale="default", attn_softcap=0.0, tied_embeddings=False, dropout=0.0,
            activation="gelu", norm_eps=1e-5, rope_base=10000.0, dtype="f64", seed=0, attn_bias=False, n_kv_head=0)

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
}
BATCH, N = 2, 7
# The cases whose hook values are written: layer norm with a plain MLP and learned positions; grouped-query
# attention with rms norms, rope, qk-norm and a gated MLP; soft-capped scores with sinusoidal positions.
HOOK_CASES = ("mlp_layer_learned", "gqa_swiglu_rms_rope_bias", "three_layers_softcap_sinusoidal")


def norm_scale(kind, x, eps):
    """TransformerLens's hook_scale: sqrt(mean((x - mean x)^2) + eps) (layer) or sqrt(mean(x^2) + eps) (rms)."""
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def param_shapes(c):
    """(name, shape, kind) in qkv's order; kind is 'w' (normal), 'gain' (1 + noise) or 'bias' (noise)."""
    d, dh = c["d_model"], c["d_model"] // c["n_head"]
    dkv = (c["n_kv_head"] or c["n_head"]) * dh
    out = [("embed.W_E", (c["vocab"], d), "w")]
    if c["positions"] == "learned":
        out.append(("pos_embed.W_pos", (c["n_ctx"], d), "w"))

    def norm(prefix, width, bias=True):
        if c["norm" if bias else "qk_norm"] == "none":
            return []
        kind = c["norm"] if bias else c["qk_norm"]
        r = [(prefix + ".w", (width,), "gain")]
        if bias and kind == "layer":
            r.append((prefix + ".b", (width,), "bias"))
        return r

    for l in range(c["n_layer"]):
        p = "blocks.%d." % l
        out += norm(p + "ln1", d)
        out += [(p + "attn.W_Q", (d, d), "w"), (p + "attn.W_K", (d, dkv), "w"), (p + "attn.W_V", (d, dkv), "w"),
                (p + "attn.W_O", (d, d), "w")]
        if c["attn_bias"]:
            out += [(p + "attn.b_Q", (d,), "bias"), (p + "attn.b_K", (dkv,), "bias"),
                    (p + "attn.b_V", (dkv,), "bias"), (p + "attn.b_O", (d,), "bias")]
        if c["qk_norm"] != "none":
            out += norm(p + "attn.q_ln", dh, bias=False) + norm(p + "attn.k_ln", dh, bias=False)
        if c["d_mlp"] > 0:
            out += norm(p + "ln2", d)
            if c["activation"] in ("swiglu", "geglu"):
                out.append((p + "mlp.W_gate", (d, c["d_mlp"]), "w"))
            out += [(p + "mlp.W_in", (d, c["d_mlp"]), "w"), (p + "mlp.b_in", (c["d_mlp"],), "bias"),
                    (p + "mlp.W_out", (c["d_mlp"], d), "w"), (p + "mlp.b_out", (d,), "bias")]
    out += norm("ln_final", d)
    if not c["tied_embeddings"]:
        out.append(("unembed.W_U", (d, c["vocab"]), "w"))
    return out


def norm_fn(kind, x, w, b, eps):
    if kind == "layer":
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)
    if kind == "rms":  # PyTorch 1.13 has no RMS norm: x / sqrt(mean(x^2) + eps) * w
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return x


def rope(x, base):
    """Rotate-half RoPE over the last dimension of x [.., n, d], position = row index."""
    n, d = x.shape[-2], x.shape[-1]
    half = d // 2
    theta = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * theta[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def sinusoidal(n, d):
    p = torch.zeros(n, d, dtype=torch.float64)
    for pos in range(n):
        for i in range(d):
            freq = 10000.0 ** (-(2 * (i // 2)) / d)
            p[pos, i] = math.sin(pos * freq) if i % 2 == 0 else math.cos(pos * freq)
    return p


def forward(c, P, ids, causal=True, hooks=None):
    """The logits; hooks (a dict) receives every hook point's value in qkv's layout when given."""
    hooks = {} if hooks is None else hooks

    def heads(t):  # [B, H, n, dh] -> qkv's [B*H, n, dh]
        return t.reshape(-1, t.shape[2], t.shape[3])

    B, n = ids.shape
    d, H = c["d_model"], c["n_head"]
    dh = d // H
    scale = 1.0 / math.sqrt(dh) if c["attn_scale"] == "default" else c["attn_scale"]
    eps = c["norm_eps"]
    x = P["embed.W_E"][ids]
    hooks["hook_embed"] = x
    pos = None
    if c["positions"] == "learned":
        pos = P["pos_embed.W_pos"][:n]
    if c["positions"] == "sinusoidal":
        pos = sinusoidal(c["n_ctx"], d)[:n]
    if pos is not None:
        hooks["hook_pos_embed"] = pos.expand(B, n, d)
        x = x + pos
    for l in range(c["n_layer"]):
        p = "blocks.%d." % l
        hooks[p + "hook_resid_pre"] = x
        h = norm_fn(c["norm"], x, P.get(p + "ln1.w"), P.get(p + "ln1.b"), eps)
        if c["norm"] != "none":
            hooks[p + "ln1.hook_scale"] = norm_scale(c["norm"], x, eps)
            hooks[p + "ln1.hook_normalized"] = h
        bias = (lambda name: P[p + "attn." + name]) if c["attn_bias"] else (lambda name: 0.0)
        q = (h @ P[p + "attn.W_Q"] + bias("b_Q")).view(B, n, H, dh).transpose(1, 2)  # [B, H, n, dh]
        Hkv = c["n_kv_head"] or H  # grouped-query: head h reads key/value head h // (H // Hkv)
        k = (h @ P[p + "attn.W_K"] + bias("b_K")).view(B, n, Hkv, dh).transpose(1, 2)
        v = (h @ P[p + "attn.W_V"] + bias("b_V")).view(B, n, Hkv, dh).transpose(1, 2)
        hooks[p + "attn.hook_q"], hooks[p + "attn.hook_k"], hooks[p + "attn.hook_v"] = heads(q), heads(k), heads(v)
        if c["qk_norm"] != "none":
            q = norm_fn(c["qk_norm"], q, P[p + "attn.q_ln.w"], None, eps)
            k = norm_fn(c["qk_norm"], k, P[p + "attn.k_ln.w"], None, eps)
        if c["positions"] == "rope":
            q, k = rope(q, c["rope_base"]), rope(k, c["rope_base"])
            hooks[p + "attn.hook_rot_q"], hooks[p + "attn.hook_rot_k"] = heads(q), heads(k)
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        s = scale * (q @ k.transpose(-2, -1))
        if c["attn_softcap"] > 0:
            s = c["attn_softcap"] * torch.tanh(s / c["attn_softcap"])
        if causal:
            s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        a = torch.softmax(s, -1)
        z = a @ v
        hooks[p + "attn.hook_attn_scores"], hooks[p + "attn.hook_pattern"], hooks[p + "attn.hook_z"] = \
            heads(s), heads(a), heads(z)
        attn_out = z.transpose(1, 2).reshape(B, n, d) @ P[p + "attn.W_O"] + bias("b_O")
        hooks[p + "hook_attn_out"] = attn_out
        x = x + attn_out
        hooks[p + "hook_resid_mid"] = x
        if c["d_mlp"] > 0:
            h = norm_fn(c["norm"], x, P.get(p + "ln2.w"), P.get(p + "ln2.b"), eps)
            if c["norm"] != "none":
                hooks[p + "ln2.hook_scale"] = norm_scale(c["norm"], x, eps)
                hooks[p + "ln2.hook_normalized"] = h
            if c["activation"] in ("swiglu", "geglu"):  # TransformerLens's gated MLP: act(h W_gate) (h W_in) + b_in
                g = h @ P[p + "mlp.W_gate"]
                linear = h @ P[p + "mlp.W_in"]
                hooks[p + "mlp.hook_pre"], hooks[p + "mlp.hook_pre_linear"] = g, linear
                g = F.silu(g) if c["activation"] == "swiglu" else F.gelu(g)
                u = g * linear + P[p + "mlp.b_in"]
            else:
                u = h @ P[p + "mlp.W_in"] + P[p + "mlp.b_in"]
                hooks[p + "mlp.hook_pre"] = u
                if c["activation"] == "gelu":
                    u = F.gelu(u)
                elif c["activation"] == "gelu_tanh":
                    u = F.gelu(u, approximate="tanh")
                else:
                    u = F.relu(u)
            hooks[p + "mlp.hook_post"] = u
            mlp_out = u @ P[p + "mlp.W_out"] + P[p + "mlp.b_out"]
            hooks[p + "hook_mlp_out"] = mlp_out
            x = x + mlp_out
        hooks[p + "hook_resid_post"] = x
    if c["norm"] != "none":
        hooks["ln_final.hook_scale"] = norm_scale(c["norm"], x, eps)
    x = norm_fn(c["norm"], x, P.get("ln_final.w"), P.get("ln_final.b"), eps)
    if c["norm"] != "none":
        hooks["ln_final.hook_normalized"] = x
    return x @ P["embed.W_E"].t() if c["tied_embeddings"] else x @ P["unembed.W_U"]


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
