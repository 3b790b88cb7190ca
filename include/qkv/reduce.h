/*
 * qkv/reduce.h — reductions along one axis (included by qkv.h), with PyTorch's keepdim. f32 and f64; each result
 * is a step tensor; gradients flow to x.
 *
 * axis counts from 0, or from the end when negative (-1 is the last), as PyTorch's dim: in [-ndim, ndim), else
 * QKV_ERR_ARG naming it and the range; a scalar (ndim 0) has no axis (QKV_ERR_RANK). The result has x's shape
 * without the axis, or with it as 1 when keepdim (so it broadcasts back against x: qkv_div(x, qkv_sum_dim(ctx,
 * x, -1, true)) normalises rows). Sums are taken in double, in a fixed order (the same bits every run and on
 * every machine; f32 rounded once at the end): along the last axis in 8 interleaved lanes (element j in lane
 * j mod 8, the lanes then added pairwise), along another axis in index order. f32 logsumexp, softmax and log_softmax
 * along the last axis take their exps in float (SLEEF's 1-ulp exp on AVX2 and AVX-512), the sums in double:
 * within 2^-21 max(1, |y|) of the f64 result, and so does logsumexp's gradient (e^(x - y), x - y rounded to
 * float); along other axes, and every other f32 result, are the f64 result rounded once. tests/test_reduce.c
 * checks each against PyTorch 1.13 (tests/data/reduce/).
 */
#ifndef QKV_REDUCE_H
#define QKV_REDUCE_H

#include "../qkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = sum_j x[.., j, ..] along axis; dx = dy broadcast back. An empty axis sums to 0. */
QKV_API qkv_tensor *qkv_sum_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim);
/* y = the mean along axis; dx = dy / n. An empty axis gives NaN (0 / 0, as PyTorch). */
QKV_API qkv_tensor *qkv_mean_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim);
/* y = the largest element along axis. The gradient goes whole to one element: the first largest (lowest index)
 * on ties, the first NaN if any (y is then NaN), the element torch.max(x, dim) picks in PyTorch 1.13. An empty
 * axis is QKV_ERR_SHAPE (unless the result is empty too). */
QKV_API qkv_tensor *qkv_max_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim);
/* y = log sum_j e^x[j] along axis, as m + log sum_j e^(x[j] - m) with m the largest (no overflow); dx = dy
 * e^(x - y), the softmax along the axis. An empty axis or one of only -inf gives -inf with a zero gradient
 * (PyTorch 1.13's gradient is NaN there); +inf gives +inf, with NaN gradients on the +inf elements (as PyTorch). */
QKV_API qkv_tensor *qkv_logsumexp_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim);

/* y = e^(x - logsumexp(x)) along axis (any rank, no mask; qkv_softmax is the masked one over the last axis of
 * attention scores); dx = y (dy - sum_j dy[j] y[j]). y has x's shape. A line of only -inf gives zeros with a zero
 * gradient (as qkv_softmax's fully masked row; PyTorch 1.13 gives NaN); a +inf or NaN makes its whole line NaN
 * (as PyTorch). */
QKV_API qkv_tensor *qkv_softmax_dim(qkv_ctx *ctx, qkv_tensor *x, int axis);
/* y = x - logsumexp(x) along axis, exact where log(softmax) would round a tiny probability to log 0 = -inf;
 * dx = dy - e^y sum_j dy[j]. A line of only -inf gives -inf with a zero gradient (PyTorch 1.13 gives NaN); a
 * +inf or NaN makes its whole line NaN (as PyTorch). */
QKV_API qkv_tensor *qkv_log_softmax(qkv_ctx *ctx, qkv_tensor *x, int axis);

#ifdef __cplusplus
}
#endif

#endif /* QKV_REDUCE_H */
