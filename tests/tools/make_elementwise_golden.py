#!/usr/bin/env python3
"""Write tests/data/elementwise/*.npy: PyTorch 1.13's values and gradients of the elementwise operators of
include/qkv/elementwise.h, in float64, for tests/test_elementwise.c (which needs no PyTorch).

    /usr/bin/python3 tests/tools/make_elementwise_golden.py     (Debian's python3-torch)

Unary operator OP: OP.npy is [3, n]: x, y = OP(x), and dx for the upstream gradient dy of dy.npy.
Binary operator OP: OP_a.npy, OP_b.npy, OP_dz.npy (inputs and upstream gradient), OP_z.npy, OP_da.npy, OP_db.npy.
where: where_mask.npy (uint8) with the same six.
"""
import os
import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "elementwise")
os.makedirs(OUT, exist_ok=True)
f64 = torch.float64

# the points: both signs, small and large, 0, and the edges some operators have
x = np.array([-30.0, -7.25, -3.5, -1.0, -0.25, -1e-3, 0.0, 1e-3, 0.25, 0.5, 1.0, 2.0, 3.5, 7.25, 21.0, 30.0])
rng = np.random.default_rng(7)
dy = rng.normal(size=x.size)
np.save(os.path.join(OUT, "dy.npy"), dy)

unary = {
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "softplus": lambda t: torch.nn.functional.softplus(t, beta=1, threshold=1e300),
    "abs": torch.abs, "neg": torch.neg, "square": torch.square,
    "pow_2": lambda t: torch.pow(t, 2.0), "pow_0.5": lambda t: torch.pow(t, 0.5), "pow_-1.5": lambda t: torch.pow(t, -1.5),
    "pow_3": lambda t: torch.pow(t, 3.0), "pow_0": lambda t: torch.pow(t, 0.0),
    "clamp_-1_0.5": lambda t: torch.clamp(t, -1.0, 0.5), "clamp_-inf_0": lambda t: torch.clamp(t, max=0.0),
    "clamp_0.25_inf": lambda t: torch.clamp(t, min=0.25),
    "add_scalar_2.5": lambda t: t + 2.5, "mul_scalar_-1.5": lambda t: t * -1.5,
}
for name, op in unary.items():
    t = torch.tensor(x, dtype=f64, requires_grad=True)
    y = op(t)
    y.backward(torch.tensor(dy, dtype=f64))
    np.save(os.path.join(OUT, name + ".npy"), np.stack([x, y.detach().numpy(), t.grad.numpy()]))

# binary: a [2, 3, 1] and b [3, 4] broadcast to [2, 3, 4]; integer-valued halves so that maximum has ties
a = np.round(rng.normal(size=(2, 3, 1)) * 2) / 2
b = np.round(rng.normal(size=(3, 4)) * 2) / 2
b[b == 0] = 0.5  # no division by zero in the golden values
b[0, 0] = a[0, 0, 0]  # a tie
dz = rng.normal(size=(2, 3, 4))
for name, op in {"div": torch.div, "maximum": torch.maximum, "minimum": torch.minimum}.items():
    ta = torch.tensor(a, dtype=f64, requires_grad=True)
    tb = torch.tensor(b, dtype=f64, requires_grad=True)
    z = op(ta, tb)
    z.backward(torch.tensor(dz, dtype=f64))
    for part, v in {"a": a, "b": b, "dz": dz, "z": z.detach().numpy(), "da": ta.grad.numpy(), "db": tb.grad.numpy()}.items():
        np.save(os.path.join(OUT, "%s_%s.npy" % (name, part)), v)

# where: mask [2, 1, 4], a [2, 3, 4], b [4]
mask = (rng.random(size=(2, 1, 4)) < 0.5).astype(np.uint8)
wa = rng.normal(size=(2, 3, 4))
wb = rng.normal(size=4)
ta = torch.tensor(wa, dtype=f64, requires_grad=True)
tb = torch.tensor(wb, dtype=f64, requires_grad=True)
z = torch.where(torch.tensor(mask).bool(), ta, tb)
z.backward(torch.tensor(dz, dtype=f64))
for part, v in {"mask": mask, "a": wa, "b": wb, "dz": dz, "z": z.detach().numpy(), "da": ta.grad.numpy(),
                "db": tb.grad.numpy()}.items():
    np.save(os.path.join(OUT, "where_%s.npy" % part), v)
print("wrote", len(os.listdir(OUT)), "files to", os.path.normpath(OUT), "with torch", torch.__version__)
