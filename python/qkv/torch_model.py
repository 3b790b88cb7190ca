"""qkv's model (include/qkv/model.h) as a functional PyTorch forward: the one PyTorch definition of the
architecture, used by qkv.torch (the nn.Module bridge) and by the golden-file script
tests/tools/make_model_twin.py. It needs torch, and imports nothing of qkv, so the script can load this file
alone (without the package, which loads libqkv).

A configuration c is a dict of qkv_model_config's fields under their metadata names (qkv.model.<field>); P maps
each parameter's name (TransformerLens's, as qkv_model_params lists them) to a tensor in qkv's layout (every
weight [d_in, d_out], so y = x @ W).

The architecture:
    x = W_E[ids] (+ W_pos[:n] | + sinusoidal[:n])
    per block: h = norm(x); q, k, v = h @ W_Q, h @ W_K, h @ W_V split into heads;
               q, k = qk_norm(q), qk_norm(k); q, k = rope(q), rope(k);
               s = scale q k^T (cap tanh(s / cap) if capped), causal mask, A = softmax(s) (or the weights of
               attn_variant: softmax1, sink, sigmoid, ssmax, softpick, as include/qkv/attention.h), z = A v
               attn_diff: z = rms_norm((A1 - lambda A2) v) (1 - lambda_init), A_i of the halves of q and k
               z = z * sigmoid(h W_G + b_G) (attn_gate head: one gate per head; element: per element)
               x = x + merge(z) @ W_O;  x = x + act(norm(x) @ W_in + b_in) @ W_out + b_out
    logits = norm(x) @ W_U  (or @ W_E^T when tied)
"""
import math

import torch
import torch.nn.functional as F


def norm_scale(kind, x, eps):
    """TransformerLens's hook_scale: sqrt(mean((x - mean x)^2) + eps) (layer) or sqrt(mean(x^2) + eps) (rms)."""
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def param_shapes(c):
    """(name, shape, kind) in qkv's order; kind is 'w' (normal), 'gain' (1 + noise), 'bias' (noise) or 'sink' (a
    logit, noise of about unit size)."""
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
        variant = c.get("attn_variant", "softmax")
        if variant == "sink":
            out.append((p + "attn.sink", (c["n_head"],), "sink"))
        if variant == "ssmax":
            out.append((p + "attn.ssmax_c", (c["n_head"],), "gain"))
        if c.get("attn_diff", False):  # differential attention: lambda's vectors, the per-head norm's gain
            out += [(p + "attn." + name, (dh // 2,), "bias") for name in ("lambda_q1", "lambda_k1", "lambda_q2",
                                                                           "lambda_k2")]
            out.append((p + "attn.sub_ln.w", (dh,), "gain"))
        gate = c.get("attn_gate", "none")
        if gate != "none":  # gated attention output: one gate per head or per element of merge(z)
            d_gate = c["n_head"] if gate == "head" else d
            out.append((p + "attn.W_G", (d, d_gate), "w"))
            if c["attn_bias"]:
                out.append((p + "attn.b_G", (d_gate,), "bias"))
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
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)  # (the angles in f64, as qkv's)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def sinusoidal(n, d):
    p = torch.zeros(n, d, dtype=torch.float64)
    for pos in range(n):
        for i in range(d):
            freq = 10000.0 ** (-(2 * (i // 2)) / d)
            p[pos, i] = math.sin(pos * freq) if i % 2 == 0 else math.cos(pos * freq)
    return p


# The attention variants weights() computes (include/qkv/attention.h's names); qkv.torch refuses any other.
ATTN_VARIANTS = ("softmax", "softmax1", "sink", "sigmoid", "ssmax", "softpick")


def weights(c, P, p, s, keep):
    """The attention weights w [B, H, n, n] of config attn_variant (include/qkv/attention.h) from the scaled
    scores s = scale q k^T [B, H, n, n] of block prefix p; keep [n, n] says which keys each query sees."""
    variant = c.get("attn_variant", "softmax")
    B, H, n = s.shape[0], s.shape[1], s.shape[2]
    masked = s.masked_fill(~keep, float("-inf"))
    if variant == "softmax":  # w_j = e^x_j / sum_k e^x_k
        return torch.softmax(masked, -1)
    if variant in ("softmax1", "sink"):  # w_j = e^x_j / (e^b + sum_k e^x_k): softmax of [x, b] less its last column
        b = torch.zeros(1, 1, 1, 1, dtype=s.dtype) if variant == "softmax1" else P[p + "attn.sink"].view(1, H, 1, 1)
        return torch.softmax(torch.cat([masked, b.expand(B, H, n, 1)], -1), -1)[..., :n]
    if variant == "sigmoid":  # w_j = sigma(x_j + b), b = -log(n_ctx) fixed per model
        return torch.where(keep, torch.sigmoid(s - math.log(c["n_ctx"])), torch.zeros((), dtype=s.dtype))
    if variant == "ssmax":  # w_j = softmax_j(c_h log(n_i) x_j), n_i the keys query i sees
        n_i = keep.sum(-1).to(s.dtype)
        factor = P[p + "attn.ssmax_c"].view(1, H, 1, 1) * torch.log(n_i).view(1, 1, n, 1)
        return torch.softmax((s * factor).masked_fill(~keep, float("-inf")), -1)
    if variant == "softpick":  # w_j = relu(e^x_j - 1) / (sum_k |e^x_k - 1| + eps) over the kept keys, eps 1e-6
        e = torch.where(keep, torch.exp(s) - 1.0, torch.zeros((), dtype=s.dtype))
        return F.relu(e) / (e.abs().sum(-1, keepdim=True) + 1e-6)
    raise ValueError("attn_variant %r is not one of %s" % (variant, ", ".join(ATTN_VARIANTS)))


def forward(c, P, ids, causal=True, hooks=None):
    """The logits; hooks (a dict) receives every hook point's value in qkv's layout when given."""
    hooks = {} if hooks is None else hooks

    def heads(t):  # [B, H, n, dh] -> qkv's [B*H, n, dh]
        return t.reshape(-1, t.shape[2], t.shape[3])

    B, n = ids.shape
    d, H = c["d_model"], c["n_head"]
    dh = d // H
    diff = c.get("attn_diff", False)
    d_score = dh // 2 if diff else dh  # differential attention: q1 . k1 over half a head
    scale = 1.0 / math.sqrt(d_score) if c["attn_scale"] == "default" else c["attn_scale"]
    eps = c["norm_eps"]
    x = P["embed.W_E"][ids]
    hooks["hook_embed"] = x
    pos = None
    if c["positions"] == "learned":
        pos = P["pos_embed.W_pos"][:n]
    if c["positions"] == "sinusoidal":
        pos = sinusoidal(c["n_ctx"], d)[:n].to(x.dtype)
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
        if c["positions"] == "rope" and diff:  # each half rotated on its own
            half = dh // 2
            q = torch.cat([rope(q[..., :half], c["rope_base"]), rope(q[..., half:], c["rope_base"])], -1)
            k = torch.cat([rope(k[..., :half], c["rope_base"]), rope(k[..., half:], c["rope_base"])], -1)
            hooks[p + "attn.hook_rot_q"], hooks[p + "attn.hook_rot_k"] = heads(q), heads(k)
        elif c["positions"] == "rope":
            q, k = rope(q, c["rope_base"]), rope(k, c["rope_base"])
            hooks[p + "attn.hook_rot_q"], hooks[p + "attn.hook_rot_k"] = heads(q), heads(k)
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        keep = torch.ones(n, n, dtype=torch.bool)
        if causal:
            keep = torch.tril(keep)
        if diff:  # differential attention (Ye et al. 2024): (A1 - lambda A2) v, RMS-normed per head
            half = dh // 2
            q1, q2, k1, k2 = q[..., :half], q[..., half:], k[..., :half], k[..., half:]
            a1 = torch.softmax((scale * (q1 @ k1.transpose(-2, -1))).masked_fill(~keep, -math.inf), -1)
            a2 = torch.softmax((scale * (q2 @ k2.transpose(-2, -1))).masked_fill(~keep, -math.inf), -1)
            lambda_init = 0.8 - 0.6 * math.exp(-0.3 * l)
            lam = (torch.exp((P[p + "attn.lambda_q1"] * P[p + "attn.lambda_k1"]).sum())
                   - torch.exp((P[p + "attn.lambda_q2"] * P[p + "attn.lambda_k2"]).sum()) + lambda_init)
            a = a1 - lam * a2
            z = norm_fn("rms", a @ v, P[p + "attn.sub_ln.w"], None, eps) * (1.0 - lambda_init)
            hooks[p + "attn.hook_pattern"] = heads(a)
        else:
            s = scale * (q @ k.transpose(-2, -1))
            if c["attn_softcap"] > 0:
                s = c["attn_softcap"] * torch.tanh(s / c["attn_softcap"])
            a = weights(c, P, p, s, keep)
            s = s.masked_fill(~keep, float("-inf"))  # hook_attn_scores: -inf where masked, as TransformerLens
            z = a @ v
            hooks[p + "attn.hook_attn_scores"], hooks[p + "attn.hook_pattern"] = heads(s), heads(a)
        gate = c.get("attn_gate", "none")
        if gate != "none":  # z * sigmoid(h W_G + b_G): per head (broadcast over d_head) or per element
            g = torch.sigmoid(h @ P[p + "attn.W_G"] + bias("b_G"))
            g = g.transpose(1, 2).unsqueeze(-1) if gate == "head" else g.view(B, n, H, dh).transpose(1, 2)
            hooks[p + "attn.hook_gate"] = heads(g)  # [B*H, n, 1] or [B*H, n, dh]
            z = z * g  # hook_z is the gated z, what W_O reads
        hooks[p + "attn.hook_z"] = heads(z)
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
