#!/usr/bin/env python3
"""Write tests/data/shape/*.npy: PyTorch 1.13's values and gradients of the shape operators of include/qkv/shape.h,
in float64, for tests/test_shape.c (which needs no PyTorch).

    /usr/bin/python3 tests/tools/make_shape_golden.py     (Debian's python3-torch)

Case CASE (the arguments are in the CASES table here and in test_shape.c's, which must agree):
CASE_x.npy (or CASE_x0.npy, CASE_x1.npy, ... for concat), CASE_index.npy (int32, index_select and gather),
CASE_dy.npy (the upstream gradient), CASE_y.npy, and CASE_dx.npy (CASE_dx0.npy, ...): y = op(x) and dx for dy.
"""
import os
import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "shape")
os.makedirs(OUT, exist_ok=True)
f64 = torch.float64
rng = np.random.default_rng(28)


def normal(*shape):
    return rng.normal(size=shape)


# name: (op, input shapes, arguments); negative axes included, repeated indices for index_select and gather
CASES = {
    "transpose_0_m1": ("transpose", [(2, 3, 4)], (0, -1)),
    "transpose_1_2": ("transpose", [(3, 1, 5, 2)], (1, 2)),
    "permute_4d": ("permute", [(2, 3, 4, 5)], (2, 0, -1, 1)),
    "permute_3d": ("permute", [(3, 1, 4)], (-1, -3, 1)),
    "concat_m2": ("concat", [(2, 1, 4), (2, 3, 4), (2, 0, 4), (2, 2, 4)], -2),
    "concat_0": ("concat", [(1, 3), (4, 3)], 0),
    "narrow_neg_start": ("narrow", [(3, 5, 2)], (1, -4, 3)),
    "narrow_m1": ("narrow", [(2, 3, 6)], (-1, 2, 4)),
    "index_select_m2": ("index_select", [(3, 4, 2)], (-2, [3, 0, 3, 1, 3])),
    "index_select_0": ("index_select", [(3, 5)], (0, [2, 2, 0, 2])),
    "gather_1": ("gather", [(3, 4)], (1, [[3, 0, 3, 3, 1, 2], [1, 1, 0, 2, 3, 1]])),
    "gather_m3": ("gather", [(3, 2, 4)], (-3, [[[2, 0, 2], [1, 1, 1]], [[0, 2, 0], [2, 2, 1]],
                                               [[1, 0, 0], [0, 2, 2]], [[2, 2, 2], [0, 0, 1]]])),
    "expand_3_1": ("expand", [(3, 1)], (2, 3, 4)),
    "expand_keep": ("expand", [(1, 4, 1)], (2, -1, 4, 3)),
}


def run(op, xs, args):
    if op == "transpose":
        return xs[0].transpose(*args), None
    if op == "permute":
        return xs[0].permute(*args), None
    if op == "concat":
        return torch.cat(xs, dim=args), None
    if op == "narrow":
        return torch.narrow(xs[0], *args), None
    if op == "index_select":
        index = np.array(args[1], dtype=np.int32)
        return torch.index_select(xs[0], args[0], torch.tensor(index, dtype=torch.long)), index
    if op == "gather":
        index = np.array(args[1], dtype=np.int32)
        return torch.gather(xs[0], args[0], torch.tensor(index, dtype=torch.long)), index
    if op == "expand":
        return xs[0].expand(*args), None
    raise ValueError(op)


for name, (op, shapes, args) in CASES.items():
    values = [normal(*s) for s in shapes]
    xs = [torch.tensor(v, dtype=f64, requires_grad=True) for v in values]
    y, index = run(op, xs, args)
    dy = normal(*y.shape)
    y.backward(torch.tensor(dy, dtype=f64))
    parts = {"dy": dy, "y": y.detach().numpy().copy()}
    if index is not None:
        parts["index"] = index
    if len(xs) == 1:
        parts["x"], parts["dx"] = values[0], xs[0].grad.numpy()
    else:
        for k, (v, t) in enumerate(zip(values, xs)):
            parts["x%d" % k], parts["dx%d" % k] = v, t.grad.numpy()
    for part, v in parts.items():
        np.save(os.path.join(OUT, "%s_%s.npy" % (name, part)), np.ascontiguousarray(v))
print("wrote", len(os.listdir(OUT)), "files to", os.path.normpath(OUT), "with torch", torch.__version__)
