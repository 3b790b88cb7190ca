#!/usr/bin/python3
"""make_numpy_files.py - .npy files written by numpy itself, with its default dtypes, for tests/test_npy.c.

    /usr/bin/python3 tests/tools/make_numpy_files.py     (rewrites tests/data/numpy/*.npy)

NumPy's default integer is int64 ('<i8') and its comparisons give bool ('|b1'); qkv loads both where the
conversion is exact (i32, u8 0/1). test_npy.c repeats the values below:
  ids_int64.npy    [[0, 5, -7, 42], [2**31 - 1, -2**31, 3, 1]]   int64, every value fits in int32
  causal_bool.npy  np.tril(np.ones((3, 4))) > 0                  bool, a causal mask (j <= i)
  wide_int64.npy   [1, 2, 2**32]                                 int64, element 2 does not fit in int32
  half.npy         [1.5, -2.0] as float16                        refused, with the fix a.astype(np.float32)
"""
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "numpy")


def main():
    os.makedirs(OUT, exist_ok=True)
    ids = np.array([[0, 5, -7, 42], [2**31 - 1, -2**31, 3, 1]])
    causal = np.tril(np.ones((3, 4))) > 0
    wide = np.array([1, 2, 2**32])
    assert ids.dtype == np.int64 and wide.dtype == np.int64 and causal.dtype == np.bool_
    np.save(os.path.join(OUT, "ids_int64.npy"), ids)
    np.save(os.path.join(OUT, "causal_bool.npy"), causal)
    np.save(os.path.join(OUT, "wide_int64.npy"), wide)
    np.save(os.path.join(OUT, "half.npy"), np.array([1.5, -2.0], dtype=np.float16))
    for name in sorted(os.listdir(OUT)):
        a = np.load(os.path.join(OUT, name))
        print("%-16s %s %s %s" % (name, a.dtype.str, a.shape, a.ravel().tolist()))


if __name__ == "__main__":
    main()
