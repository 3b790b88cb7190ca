/*
 * softmax_dim.c — qkv_softmax_dim: y = the softmax of x along one axis, without a mask.
 *   x [outer, n, inner] -> y [outer, n, inner]
 * y = e^(x - lse), lse = log sum_j e^x[j] along the axis (logsumexp_dim.c: no overflow). A line of only -inf
 * gives zeros with a zero gradient (as qkv_softmax's fully masked row; PyTorch 1.13 gives NaN); a +inf or NaN
 * makes its whole line NaN (as PyTorch). The backward reads only y.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"
#include "row_sums.h"

#include <math.h>

/* f32 along the last axis, on the float arrays, one row at a time: m = the largest (NaN if any is), e = e^(x - m)
 * into y (x - m rounded once in float; unary_kernels.h's map: SLEEF's float exp on AVX2 and AVX-512), s = sum_j e
 * in double in 8 lanes (row_sums.h), then y = e / s (one rounding of a double quotient); a row of -inf gives 0,
 * one with +inf or NaN NaN. exp_sums.h gives the same m and s without e (logsumexp_dim.c, log_softmax.c). */
QKV_VECTOR_LOOP static void softmax_last_f32(const float *x, int64_t rows, int64_t n, float *y) {
    const qkv_unary_kernel_set_ *k = qkv_unary_kernels_();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        bool nan;
        float top = max8_f32(xr, n, &nan);
        double m = nan ? NAN : (double)top;
        if (!isfinite(m)) {
            for (int64_t j = 0; j < n; j++) yr[j] = m == -INFINITY ? 0.0f : NAN;
            continue;
        }
        for (int64_t j = 0; j < n; j++) yr[j] = xr[j] - top; // x - m in float, rounded once
        k->map(QKV_VF_EXP_, yr, yr, n, 0.0f);                 // e = e^(x - m)
        double s = sum8_f32(yr, n);                           // s = sum_j e[j]
        for (int64_t j = 0; j < n; j++) yr[j] = (float)((double)yr[j] / s);
    }
}

// f32 along the last axis: dx (+)= y (dy - sum_k dy[k] y[k]); a new gradient (fresh) is stored as 0 + (...), the
// bits of adding into zeros, without reading them
QKV_VECTOR_LOOP static void softmax_last_backward_f32(const float *y, const float *dy, float *dx, int64_t rows,
                                                      int64_t n, bool fresh) {
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * n, *gr = dy + r * n;
        float *dr = dx + r * n;
        double dot = dot8_f32(gr, yr, n);
        if (fresh)
            for (int64_t j = 0; j < n; j++) dr[j] = (float)(0.0 + (double)yr[j] * ((double)gr[j] - dot));
        else
            for (int64_t j = 0; j < n; j++) dr[j] = (float)((double)dr[j] + (double)yr[j] * ((double)gr[j] - dot));
    }
}

// dx[o, j, i] += y[o, j, i] (dy[o, j, i] - sum_k dy[o, k, i] y[o, k, i])
static void softmax_dim_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const qkv_axis_ *p = node->saved;
    qkv_tensor *x = node->in[0];
    if (x->dtype == QKV_F32 && p->inner == 1) {
        bool fresh;
        qkv_tensor *dx = qkv_grad_to_write_(ctx, x, &fresh);
        if (dx) softmax_last_backward_f32(node->out->data, node->out->grad->data, dx->data, p->outer, p->n, fresh);
        return;
    }
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    const double *yv = qkv_as_f64_(ctx, node->op, node->out);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dx || !dy || !yv || !work) return;
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t i = 0; i < p->inner; i++) {
            int64_t base = o * p->n * p->inner + i;
            // dot = sum_k dy[k] y[k]
            double dot = 0.0;
            for (int64_t k = 0; k < p->n; k++) dot += dy[base + k * p->inner] * yv[base + k * p->inner];
            for (int64_t j = 0; j < p->n; j++) {
                int64_t at = base + j * p->inner;
                work[at] = yv[at] * (dy[at] - dot);
            }
        }
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_softmax_dim(qkv_ctx *ctx, qkv_tensor *x, int axis) {
    const char *fn = "qkv_softmax_dim";
    if (!ctx || ctx->status) return NULL;
    qkv_axis_ plan;
    if (!qkv_axis_plan_(ctx, fn, x, axis, true, &plan)) return NULL;
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    if (y && x->dtype == QKV_F32 && plan.inner == 1) {
        softmax_last_f32(x->data, plan.outer, plan.n, y->data);
        return qkv_axis_record_(ctx, fn, softmax_dim_backward, x, y, &plan);
    }
    const double *xv = y ? qkv_as_f64_(ctx, fn, x) : NULL;
    double *yv = y ? qkv_out_f64_(ctx, fn, y) : NULL;
    double *lse = qkv_arena_array_(ctx, fn, (size_t)(plan.outer * plan.inner) + 1, sizeof(double));
    if (!y || !xv || !yv || !lse) return NULL;
    qkv_logsumexp_lines_(xv, &plan, lse);
    for (int64_t o = 0; o < plan.outer; o++)
        for (int64_t j = 0; j < plan.n; j++)
            for (int64_t i = 0; i < plan.inner; i++) {
                int64_t at = (o * plan.n + j) * plan.inner + i;
                double l = lse[o * plan.inner + i];
                // y = e^(x - lse); a line of -inf: 0; one with +inf or NaN: NaN
                yv[at] = l == -INFINITY ? 0.0 : isfinite(l) ? exp(xv[at] - l) : NAN;
            }
    qkv_store_f64_(y, yv);
    return qkv_axis_record_(ctx, fn, softmax_dim_backward, x, y, &plan);
}
