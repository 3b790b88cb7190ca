"""Train a small byte-level model on a text with qkv from Python, sample from it, and plot the loss.

    QKV_LIBRARY=build/libqkv.so PYTHONPATH=python python3 python/examples/train_sample_plot.py \
        [--text FILE] [--steps N] [--plot loss.png] [--quick]

The text defaults to the repository's README.md; the vocabulary is the 256 byte values. The model is 2 layers
of RMS norm, rotary positions and a SwiGLU MLP (f32, AdamW with a cosine learning rate). Every --log steps it
prints the training loss and the loss on the held-out last tenth of the text; at the end it samples from a
prompt and, when matplotlib is installed, plots both losses to --plot (without matplotlib it says so and
skips the plot). --quick is a short run (the test's).
"""
import argparse
import math
import os
import sys
import time

import numpy as np

import qkv

HERE = os.path.dirname(os.path.abspath(__file__))


def windows(data, rng, batch, n):
    """batch windows of n + 1 bytes at random offsets: ids are the first n, the targets are the ids shifted."""
    starts = rng.integers(0, len(data) - n - 1, batch)
    return np.stack([data[s:s + n] for s in starts]).astype(np.int32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default=os.path.join(HERE, "..", "..", "README.md"), help="a text file to learn")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--log", type=int, default=50, help="print (and plot) the losses every this many steps")
    ap.add_argument("--plot", default="loss.png", help="where the loss plot goes (needs matplotlib)")
    ap.add_argument("--prompt", default="qkv is ")
    ap.add_argument("--quick", action="store_true", help="30 steps, batch 4 (a check that it all runs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.log = 30, 4, 10

    data = np.frombuffer(open(args.text, "rb").read(), np.uint8)
    split = len(data) * 9 // 10
    train, held_out = data[:split], data[split:]
    n_ctx = 64
    if len(held_out) < n_ctx + 2:
        sys.exit(f"train_sample_plot: {args.text} is too short ({len(data)} bytes; at least {10 * (n_ctx + 2)})")

    ctx = qkv.Context(seed=0)
    model = qkv.Model(ctx, vocab=256, n_ctx=n_ctx, d_model=64, n_layer=2, n_head=4, d_mlp=128, norm="rms",
                      positions="rope", activation="swiglu", dtype="f32", seed=0)
    opt = qkv.Optimizer(model.params.values(), "adamw", lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(0)
    eval_ids = windows(held_out, np.random.default_rng(1), 8, n_ctx)
    history = []  # (step, train loss, held-out loss)
    started = time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.log == 0 or step == args.steps:
            with ctx.no_grad():  # evaluation: nothing recorded
                held = model.loss(model.forward(eval_ids), qkv.next_token_targets(ctx.tensor(eval_ids))).item()
            ctx.step_end()
        ids = windows(train, rng, args.batch, n_ctx)
        loss = model.loss(model.forward(ids), qkv.next_token_targets(ctx.tensor(ids)))
        if step % args.log == 0 or step == args.steps:
            history.append((step, loss.item(), held))
            print(f"step {step:4d}  train {loss.item():.3f}  held-out {held:.3f}  ({time.perf_counter() - started:.1f} s)")
        if step == args.steps:
            break
        loss.backward()
        opt.lr = 3e-3 * 0.5 * (1 + math.cos(math.pi * step / args.steps))  # cosine decay
        opt.step()
        opt.zero_grad()
        ctx.step_end()
    ctx.step_end()

    prompt = np.frombuffer(args.prompt.encode(), np.uint8)
    out = model.sample(prompt, 120, temperature=0.8, top_k=20)
    text = (args.prompt.encode() + bytes(out.astype(np.uint8).tolist())).decode("utf-8", errors="replace")
    print("sample:", repr(text))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib, or apt-get install python3-matplotlib)")
        return 0
    steps, tr, ho = zip(*history)
    plt.figure(figsize=(6, 4))
    plt.plot(steps, tr, label="train")
    plt.plot(steps, ho, label="held-out")
    plt.xlabel("step")
    plt.ylabel("loss (nats per byte)")
    plt.legend()
    plt.tight_layout()
    plt.savefig(args.plot)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
