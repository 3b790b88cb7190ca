#!/usr/bin/env python3
"""check_nanogpt.py — nanoGPT checkpoints through tools/nanogpt_convert.py, checked against nanoGPT's forward.

    check_nanogpt.py --tool LOGITS_TOOL     TAP. LOGITS_TOOL is tests/tools/logits_tool.c (qkv_model_load, then
                                            the causal forward's logits written to a .npy)

No pretrained weights can be fetched here, so each case builds a random model of nanoGPT's GPT (model.py's
modules, written out below as its forward does them: LayerNorm with or without bias, c_attn split into q, k, v,
the causal mask buffer, the exact GELU, tied lm_head) in PyTorch, saves it the way nanoGPT's train.py does
(torch.save of {"model": state_dict, "model_args": ...}), converts it with the script's command line, runs qkv on
it and compares the logits with nanoGPT's forward: 1e-10 in f64, 1e-4 in f32 (norm-wise relative). Then back:
the qkv checkpoint converted to a nanoGPT state dict equals the original tensor for tensor, and a qkv model
nanoGPT cannot hold is refused. Skips (one "ok # SKIP") without torch.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CONVERT = os.path.join(ROOT, "tools", "nanogpt_convert.py")


def import_torch_or_skip():
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if (os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system)
            and not os.environ.get("QKV_TORCH_RETRY")):
        os.environ["QKV_TORCH_RETRY"] = "1"
        sys.stdout.flush()
        os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
    print("1..1")
    print("ok 1 - nanoGPT checkpoints # SKIP torch not installed")
    sys.exit(0)


def nanogpt_state(args, seed, dtype):
    """A random state dict of nanoGPT's GPT with these model_args, keys and shapes as model.py makes them."""
    import torch
    g = torch.Generator().manual_seed(seed)
    d, L, V, T = args["n_embd"], args["n_layer"], args["vocab_size"], args["block_size"]

    def r(*shape, s=0.3):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s).to(dtype)

    sd = {"transformer.wte.weight": r(V, d), "transformer.wpe.weight": r(T, d)}
    for layer in range(L):
        p = "transformer.h.%d." % layer
        sd[p + "ln_1.weight"] = 1 + r(d, s=0.2)
        sd[p + "attn.c_attn.weight"] = r(3 * d, d)
        sd[p + "attn.c_proj.weight"] = r(d, d)
        sd[p + "attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)  # the mask buffer (no flash)
        sd[p + "ln_2.weight"] = 1 + r(d, s=0.2)
        sd[p + "mlp.c_fc.weight"] = r(4 * d, d)
        sd[p + "mlp.c_proj.weight"] = r(d, 4 * d)
        if args["bias"]:
            for name, n in (("ln_1.bias", d), ("attn.c_attn.bias", 3 * d), ("attn.c_proj.bias", d), ("ln_2.bias", d),
                            ("mlp.c_fc.bias", 4 * d), ("mlp.c_proj.bias", d)):
                sd[p + name] = r(n, s=0.1)
    sd["transformer.ln_f.weight"] = 1 + r(d, s=0.2)
    if args["bias"]:
        sd["transformer.ln_f.bias"] = r(d, s=0.1)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied, as GPT.__init__ does
    return sd


def nanogpt_forward(sd, args, idx):
    """GPT.forward(idx) of nanoGPT's model.py (eval: no dropout; the logits of every position)."""
    import torch
    import torch.nn.functional as F
    d, H = args["n_embd"], args["n_head"]
    B, T = idx.shape

    def ln(x, name):
        return F.layer_norm(x, (d,), sd[name + ".weight"], sd.get(name + ".bias"), 1e-5)

    def lin(x, name):
        return F.linear(x, sd[name + ".weight"], sd.get(name + ".bias"))

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][torch.arange(T)]
    for layer in range(args["n_layer"]):
        p = "transformer.h.%d." % layer
        h = ln(x, p + "ln_1")
        q, k, v = lin(h, p + "attn.c_attn").split(d, dim=2)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(sd[p + "attn.bias"][:, :, :T, :T] == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, d)
        x = x + lin(y, p + "attn.c_proj")
        h = ln(x, p + "ln_2")
        x = x + lin(F.gelu(lin(h, p + "mlp.c_fc")), p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return F.linear(x, sd["lm_head.weight"])


def rel_err(a, b):
    import numpy as np
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    a = ap.parse_args()
    import_torch_or_skip()
    import numpy as np
    import torch
    cases = [
        ("bias, f64", dict(n_layer=2, n_head=3, n_embd=12, block_size=16, bias=True, vocab_size=37, dropout=0.0),
         "f64", 1e-10, False),
        ("no bias, f64, a compiled model's _orig_mod. prefix",
         dict(n_layer=3, n_head=2, n_embd=8, block_size=10, bias=False, vocab_size=19, dropout=0.1), "f64", 1e-10,
         True),
        ("bias, f32", dict(n_layer=2, n_head=4, n_embd=16, block_size=12, bias=True, vocab_size=29, dropout=0.0),
         "f32", 1e-4, False),
    ]
    print("1..%d" % (2 * len(cases) + 1))
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, args, dtype, tol, compiled) in enumerate(cases):
            torch_dtype = torch.float64 if dtype == "f64" else torch.float32
            sd = nanogpt_state(args, 100 + k, torch_dtype)
            ckpt, st, ids_path, out = (os.path.join(tmp, "%d_%s" % (k, s)) for s in ("ckpt.pt", "m.safetensors",
                                                                                    "ids.npy", "logits.npy"))
            saved = {("_orig_mod." + key if compiled else key): v for key, v in sd.items()}
            torch.save({"model": saved, "model_args": args, "iter_num": 5, "best_val_loss": 1.0}, ckpt)
            idx = torch.randint(0, args["vocab_size"], (2, args["block_size"] - 1),
                                generator=torch.Generator().manual_seed(k))
            want = nanogpt_forward({key: v.to(torch.float64) for key, v in sd.items()}, args, idx).detach().numpy()
            np.save(ids_path, idx.numpy().astype(np.int32))
            conv = subprocess.run([sys.executable, CONVERT, "to-qkv", ckpt, st, "--dtype", dtype], capture_output=True,
                                  text=True)
            tool = subprocess.run([a.tool, st, ids_path, out], capture_output=True, text=True) if not conv.returncode \
                else conv
            n += 1
            if tool.returncode:
                print("not ok %d - %s: qkv's logits equal nanoGPT's forward # %s" % (n, name, tool.stderr.strip()))
            else:
                err = rel_err(np.load(out).astype(np.float64), want)
                print("%s %d - %s: qkv's logits equal nanoGPT's forward within %g (%.2g)" % (
                    "ok" if err < tol else "not ok", n, name, tol, err))
            # back: qkv -> nanoGPT equals the original (the mask buffer aside), bias=False kept
            back_path = os.path.join(tmp, "back%d.pt" % k)
            conv = subprocess.run([sys.executable, CONVERT, "to-nanogpt", st, back_path], capture_output=True, text=True)
            n += 1
            if conv.returncode:
                print("not ok %d - %s: back to nanoGPT # %s" % (n, name, conv.stderr.strip()))
                continue
            back = torch.load(back_path)
            orig = {key: v for key, v in sd.items() if not key.endswith(".attn.bias")}  # the mask buffer
            same = set(back["model"]) == set(orig) and all(
                torch.equal(back["model"][key].to(torch_dtype), orig[key]) for key in orig)
            same = same and back["model_args"]["bias"] == args["bias"]
            print("%s %d - %s: back to a nanoGPT state dict, every tensor and the bias switch as they were" % (
                "ok" if same else "not ok", n, name))
        # a qkv model nanoGPT cannot hold (rope positions) is refused naming the field
        rope = os.path.join(tmp, "rope.st")
        from importlib import util
        spec = util.spec_from_file_location("nanogpt_convert", CONVERT)
        mod = util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        tensors, meta = mod.read_safetensors(os.path.join(tmp, "0_m.safetensors"))
        meta["qkv.model.positions"] = "rope"
        mod.write_safetensors(rope, list(tensors.items()), meta)
        conv = subprocess.run([sys.executable, CONVERT, "to-nanogpt", rope, os.path.join(tmp, "x.pt")],
                              capture_output=True, text=True)
        n += 1
        ok = conv.returncode == 1 and "qkv.model.positions is 'rope'" in conv.stderr
        print("%s %d - a rope model is refused naming qkv.model.positions # %s" % (
            "ok" if ok else "not ok", n, conv.stderr.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
