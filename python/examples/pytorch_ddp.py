"""Train a small model in qkv, continue in PyTorch with DistributedDataParallel (two CPU processes, gloo), load
the result back into qkv and sample from it. docs/pytorch.md walks through this file.

    QKV_LIBRARY=build/libqkv.so PYTHONPATH=python /usr/bin/python3 python/examples/pytorch_ddp.py [DIR]

DIR receives stage1.safetensors (qkv's) and stage2.safetensors (PyTorch's); a temporary directory without it.
"""
import os
import socket
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import qkv
import qkv.torch

TEXT = ("the cat sat on the mat. the dog sat on the log. the cat saw the dog and the dog saw the cat. "
        "a cat and a dog sat on a mat and a log. ") * 4
CHARS = sorted(set(TEXT))
DATA = np.array([CHARS.index(ch) for ch in TEXT], np.int64)
CONFIG = dict(vocab=len(CHARS), n_ctx=32, d_model=32, n_layer=2, n_head=4, d_mlp=64, dtype="f64", seed=1)
BATCH = 8


def batch(rng):
    """BATCH windows of n_ctx characters of the text, at random offsets."""
    starts = rng.integers(0, len(DATA) - CONFIG["n_ctx"], BATCH)
    return np.stack([DATA[s:s + CONFIG["n_ctx"]] for s in starts])


# ---- 1. train in qkv ------------------------------------------------------------------------------------------
def train_in_qkv(path, steps=150):
    ctx = qkv.Context(seed=0)
    model = qkv.Model(ctx, **CONFIG)
    opt = qkv.Optimizer(model.params.values(), "adamw", lr=3e-3)
    rng = np.random.default_rng(0)
    for step in range(steps):
        ids = batch(rng)
        loss = model.loss(model.forward(ids), qkv.next_token_targets(ctx.tensor(ids)))
        if step % 50 == 0 or step == steps - 1:
            print(f"qkv    step {step:3d}  loss {loss.item():.4f}")
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.step_end()
    model.save(path)
    ctx.close()


# ---- 2. continue in PyTorch: DistributedDataParallel over two processes ---------------------------------------
def worker(rank, world, port, stage1, stage2, steps):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    module = qkv.torch.to_module(stage1)              # the same model, TransformerLens's parameter names
    ddp = DistributedDataParallel(module)             # gradients are averaged over the processes
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    rng = np.random.default_rng(100 + rank)           # each process its own batches
    for step in range(steps):
        ids = torch.from_numpy(batch(rng))
        _, loss = ddp(ids, qkv.torch.next_token_targets(ids))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)                         # the loss over both processes' batches, for the log
        if rank == 0 and (step % 20 == 0 or step == steps - 1):
            print(f"torch  step {step:3d}  loss {mean.item() / world:.4f}  ({world} processes)", flush=True)
    mine = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)                      # DDP kept the copies equal: check it
    if rank == 0:
        print(f"torch  the {world} processes hold the same parameters: {all(torch.equal(mine, e) for e in every)}")
        qkv.torch.save_checkpoint(ddp, stage2)        # written by qkv_model_save
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- 3. back in qkv: evaluate and sample ----------------------------------------------------------------------
def sample_in_qkv(stage1, stage2):
    ctx = qkv.Context(seed=0)
    ids = batch(np.random.default_rng(7))             # windows neither stage drew in this order
    for name, path in (("qkv", stage1), ("torch", stage2)):
        model = qkv.Model.load(ctx, path)
        loss = model.loss(model.forward(ids), qkv.next_token_targets(ctx.tensor(ids)))
        print(f"trained in {name:5s}: loss {loss.item():.4f} on 8 other windows")
        ctx.step_end()
    prompt = [CHARS.index(ch) for ch in "the dog "]
    out = model.sample(prompt, 24, temperature=0)     # greedy
    print("sample: " + repr("the dog " + "".join(CHARS[i] for i in out)))


def main(directory):
    stage1, stage2 = os.path.join(directory, "stage1.safetensors"), os.path.join(directory, "stage2.safetensors")
    train_in_qkv(stage1)
    sys.stdout.flush()
    mp.spawn(worker, args=(2, free_port(), stage1, stage2, 60), nprocs=2, join=True)
    sample_in_qkv(stage1, stage2)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
