#!/usr/bin/env python3
"""Write tests/data/reduce/*.npy: PyTorch 1.13's values and gradients of the reductions of include/qkv/reduce.h, in
float64, for tests/test_reduce.c (which needs no PyTorch).

    /usr/bin/python3 tests/tools/make_reduce_golden.py     (Debian's python3-torch)

x.npy [2, 3, 4] (with ties and a repeated maximum); for OP in sum, mean, max, logsumexp, softmax,
log_softmax and axis A in 0, 1, 2:
OP_A_dy.npy (the upstream gradient), OP_A_y.npy, OP_A_dx.npy.
"""
import os
import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "reduce")
os.makedirs(OUT, exist_ok=True)
rng = np.random.default_rng(11)
x = np.round(rng.normal(size=(2, 3, 4)) * 4) / 4  # quarters: ties along every axis
x[1, 2, :] = [2.0, 3.5, 3.5, 1.0]  # a repeated maximum along the last axis
x[0, :, 1] = 30.0  # a column of large values for logsumexp
np.save(os.path.join(OUT, "x.npy"), x)
ops = {"sum": lambda t, a: t.sum(dim=a), "mean": lambda t, a: t.mean(dim=a), "max": lambda t, a: t.max(dim=a)[0],
       "logsumexp": lambda t, a: torch.logsumexp(t, dim=a), "softmax": lambda t, a: torch.softmax(t, dim=a),
       "log_softmax": lambda t, a: torch.log_softmax(t, dim=a)}
for name, op in ops.items():
    for axis in range(3):
        t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        y = op(t, axis)
        dy = rng.normal(size=tuple(y.shape))
        y.backward(torch.tensor(dy, dtype=torch.float64))
        for part, v in {"dy": dy, "y": y.detach().numpy(), "dx": t.grad.numpy()}.items():
            np.save(os.path.join(OUT, "%s_%d_%s.npy" % (name, axis, part)), v)
print("wrote", len(os.listdir(OUT)), "files to", os.path.normpath(OUT), "with torch", torch.__version__)
