/*
 * qkv/shape.h — shape operators (included by qkv.h): transpose, permute, concat, narrow, index_select, gather
 * and expand. qkv has no views: each one copies into a new step tensor, contiguous and row-major.
 *
 * Any dtype is copied (f32, f64, i32 ids, u8 masks), bit for bit; the result has x's dtype. The gradient flows to
 * an f32/f64 input that requires grad, through a backward that adds (+=) into it, in double, in a fixed order (the
 * same bits every run). An i32 index is never differentiated; a node that needs it in its backward keeps its own
 * copy, so the caller may change or free it afterwards.
 *
 * Axes count as PyTorch's: 0 .. ndim-1 from the front, or -ndim .. -1 from the end; anything else is QKV_ERR_ARG
 * naming the function, the axis, the shape and the range. A 0-D tensor has no axis (unlike PyTorch, which lets
 * a scalar's axis be 0 or -1): of these operators only qkv_permute (with no dims) and qkv_expand accept a 0-D x.
 * Indices are checked before anything is written: one outside [0, size) is QKV_ERR_ARG naming its value, its
 * position and the size (negative indices are refused, as torch.index_select and torch.gather refuse them). A
 * NULL tensor is QKV_ERR_NULL, an index that is not i32 QKV_ERR_DTYPE, an index of the wrong rank QKV_ERR_RANK,
 * and shapes that do not fit QKV_ERR_SHAPE naming both. A zero-size dimension is fine and gives an empty result
 * (and an empty or zero gradient). tests/test_shape.c checks values and gradients against PyTorch 1.13
 * (tests/data/shape/, made by tests/tools/make_shape_golden.py).
 */
#ifndef QKV_SHAPE_H
#define QKV_SHAPE_H

#include "../qkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Axis order                                                                                        */
/* ------------------------------------------------------------------------------------------------ */

/* y = x with its axes in the order dims: x [d0, d1, d2], dims {2, 0, 1} -> y [d2, d0, d1], y[i0, i1, i2] =
 * x[j] with j[dims[k]] = i_k (torch.permute). dims holds x->ndim axes, each from either end, naming every axis
 * once (else QKV_ERR_ARG naming the repeat); NULL is allowed only for a 0-D x (a copy). Gradient: dx = dy
 * permuted by the inverse permutation. */
QKV_API qkv_tensor *qkv_permute(qkv_ctx *ctx, qkv_tensor *x, const int *dims);
/* y = x with axes dim0 and dim1 swapped: x [..., a, ..., b, ...] -> y [..., b, ..., a, ...] (torch.transpose);
 * dim0 == dim1 is a copy. Gradient: dx = dy with the same two axes swapped back. */
QKV_API qkv_tensor *qkv_transpose(qkv_ctx *ctx, qkv_tensor *x, int dim0, int dim1);

/* ------------------------------------------------------------------------------------------------ */
/* Joining and slicing                                                                               */
/* ------------------------------------------------------------------------------------------------ */

/* y = the n tensors xs[0], ..., xs[n-1] joined along axis (torch.cat): each [..., a_k, ...] with the same dtype,
 * the same number of dimensions and the same sizes on every other axis -> y [..., a_0 + ... + a_{n-1}, ...];
 * y[o, off_k + j, i] = xs[k][o, j, i], off_k = a_0 + ... + a_{k-1}. An input with a_k = 0 adds nothing. n >= 1
 * (else QKV_ERR_ARG); the axis is counted against xs[0]. Gradient: each input gets its own slice of dy,
 * dxs[k][o, j, i] += dy[o, off_k + j, i] (a tensor given twice gets both). With gradients on and more than 8
 * inputs the join is recorded in groups of at most 8 (the same values and gradients). */
QKV_API qkv_tensor *qkv_concat(qkv_ctx *ctx, qkv_tensor *const *xs, int n, int axis);
/* y = length consecutive entries of x along axis from start (torch.narrow; x[..., start:start+length, ...]):
 * x [..., a, ...] -> y [..., length, ...], y[o, j, i] = x[o, start + j, i]. start may be negative, counting from
 * the end (start + a); it must be in [-a, a], and 0 <= length <= a - start (start after counting), else
 * QKV_ERR_ARG naming them and the size. length 0 gives an empty y. Gradient: dx[o, start + j, i] += dy[o, j, i];
 * the entries of x outside the slice get nothing (0). */
QKV_API qkv_tensor *qkv_narrow(qkv_ctx *ctx, qkv_tensor *x, int axis, int64_t start, int64_t length);

/* ------------------------------------------------------------------------------------------------ */
/* Picking entries by index                                                                          */
/* ------------------------------------------------------------------------------------------------ */

/* y = the entries of x along axis that the i32 index [m] names, in its order (torch.index_select):
 * x [..., a, ...] -> y [..., m, ...], y[o, j, i] = x[o, index[j], i]. Every index in [0, a) (else QKV_ERR_ARG
 * naming the index, its position and a); an index may repeat; m = 0 gives an empty y. index must be i32
 * (QKV_ERR_DTYPE) and 1-D (QKV_ERR_RANK). Gradient: a scatter-add, dx[o, index[j], i] += dy[o, j, i] for
 * j = 0, 1, ... in order, so a repeated index gets the sum of its rows. */
QKV_API qkv_tensor *qkv_index_select(qkv_ctx *ctx, qkv_tensor *x, int axis, const qkv_tensor *index);
/* y = along axis, the entry of x each position of index names (torch.gather): index is i32 with x's number of
 * dimensions (else QKV_ERR_RANK) and no larger than x on the other axes (index.shape[d] <= x.shape[d] for
 * d != axis, else QKV_ERR_SHAPE naming both shapes); y has index's shape. For axis 1 of 3-D tensors:
 * y[i, j, k] = x[i, index[i, j, k], k]. Every index in [0, x.shape[axis]) (else QKV_ERR_ARG naming it, its
 * position [i,j,k] and the size). Gradient: a scatter-add, dx[i, index[i, j, k], k] += dy[i, j, k], over the
 * positions of index in row-major order, so repeated indices add up in the same order every run. */
QKV_API qkv_tensor *qkv_gather(qkv_ctx *ctx, qkv_tensor *x, int axis, const qkv_tensor *index);

/* ------------------------------------------------------------------------------------------------ */
/* Broadcasting                                                                                      */
/* ------------------------------------------------------------------------------------------------ */

/* y = x broadcast to shape (ndim sizes, NumPy's rules; torch.expand, copied): shapes are aligned at their last
 * axis; an axis of x keeps its size, or stretches to any size (0 included) if it is 1; -1 in shape keeps x's
 * size; shape may add new leading axes (any size >= 0, not -1). x [3, 1] to {2, 3, 4} -> y [2, 3, 4]. A size of
 * x that is neither 1 nor the one asked for, or fewer axes than x has, is QKV_ERR_SHAPE naming both shapes; a
 * size below -1, or -1 on a new axis, QKV_ERR_ARG; ndim outside 0 .. QKV_MAX_DIMS QKV_ERR_RANK; an element count
 * above QKV_MAX_NUMEL QKV_ERR_OVERFLOW. Gradient: dx = dy summed over the stretched and new axes, added in y's
 * row-major order. */
QKV_API qkv_tensor *qkv_expand(qkv_ctx *ctx, qkv_tensor *x, int ndim, const int64_t *shape);

#ifdef __cplusplus
}
#endif

#endif /* QKV_SHAPE_H */
