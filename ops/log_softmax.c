/*
 * log_softmax.c — qkv_log_softmax: y = log softmax(x) along one axis, without a mask.
 *   x [outer, n, inner] -> y [outer, n, inner]
 * y = x - lse, lse = log sum_j e^x[j] along the axis (logsumexp_dim.c), exact where log(softmax) would round
 * tiny probabilities to log 0. A line of only -inf gives -inf with a zero gradient (PyTorch 1.13 gives NaN);
 * a +inf or NaN makes its whole line NaN (as PyTorch). The backward reads only y.
 */
#include "qkv_internal.h"

#include "kernels/unary_kernels.h"
#include "exp_sums.h"
#include "row_sums.h"

#include <math.h>

/* f32 along the last axis, two rows at a time while they are in cache (x read once, y written once): m = the
 * largest (NaN if any is) and s = sum_j e^(x[j] - m) in double by exp_sums.h (one pass over both rows, or e into
 * y's row, then row_sums.h's sum), then y = (x - m) - log s in double over the same row
 * (one rounding); a row of -inf stays -inf, one with +inf or NaN is NaN. The same m, e and s as
 * softmax_dim.c's f32 softmax, so the same bits. */
QKV_VECTOR_LOOP static void log_softmax_last_f32(const float *x, int64_t rows, int64_t n, float *y) {
    for (int64_t r = 0; r < rows; r += 2) {
        int64_t count = rows - r >= 2 ? 2 : 1;
        double m[2], s[2];
        // m and s of the two rows (y's row as the scratch: written over below)
        exp_sums_f32(qkv_unary_kernels_(), x + r * n, count, n, m, s, y + r * n);
        for (int64_t c = 0; c < count; c++) {
            const float *xr = x + (r + c) * n;
            float *yr = y + (r + c) * n;
            if (!isfinite(m[c])) {
                for (int64_t j = 0; j < n; j++) yr[j] = m[c] == -INFINITY ? -INFINITY : NAN;
                continue;
            }
            double log_s = log(s[c]);
            for (int64_t j = 0; j < n; j++) yr[j] = (float)(((double)xr[j] - m[c]) - log_s);
        }
    }
}

/* f32 along the last axis, one row at a time while it is in cache: dx += dy - e^y sum_k dy[k] (e^y by the float
 * exp map into the row scratch e of n floats); 0 for a row of -inf. A new gradient (fresh) is stored as
 * 0 + (...), the bits of adding into zeros, without reading them. */
QKV_VECTOR_LOOP static void log_softmax_last_backward_f32(const float *y, const float *dy, float *dx, int64_t rows, int64_t n,
                                                          float *e, bool fresh) {
    const qkv_unary_kernel_set_ *k = qkv_unary_kernels_();
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * n, *gr = dy + r * n;
        float *dr = dx + r * n;
        bool dead = n > 0;
        for (int64_t j = 0; j < n && dead; j++) dead = yr[j] == -INFINITY;
        if (dead) { // no gradient: a new one is 0
            for (int64_t j = 0; fresh && j < n; j++) dr[j] = 0.0f;
            continue;
        }
        k->map(QKV_VF_EXP_, yr, e, n, 0.0f);
        double total = sum8_f32(gr, n);
        if (fresh)
            for (int64_t j = 0; j < n; j++) dr[j] = (float)(0.0 + ((double)gr[j] - (double)e[j] * total));
        else
            for (int64_t j = 0; j < n; j++) dr[j] = (float)((double)dr[j] + ((double)gr[j] - (double)e[j] * total));
    }
}

// dx[o, j, i] += dy[o, j, i] - e^y[o, j, i] sum_k dy[o, k, i]
static void log_softmax_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const qkv_axis_ *p = node->saved;
    qkv_tensor *x = node->in[0];
    if (x->dtype == QKV_F32 && p->inner == 1) {
        float *e = qkv_arena_array_(ctx, node->op, (size_t)p->n + 1, sizeof(float));
        bool fresh;
        qkv_tensor *dx = e ? qkv_grad_to_write_(ctx, x, &fresh) : NULL;
        if (dx) log_softmax_last_backward_f32(node->out->data, node->out->grad->data, dx->data, p->outer, p->n, e, fresh);
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
            // total = sum_k dy[k]; a line of -inf (y all -inf) passes no gradient
            double total = 0.0;
            bool dead = p->n > 0;
            for (int64_t k = 0; k < p->n; k++) {
                total += dy[base + k * p->inner];
                dead = dead && yv[base + k * p->inner] == -INFINITY;
            }
            for (int64_t j = 0; j < p->n; j++) {
                int64_t at = base + j * p->inner;
                work[at] = dead ? 0.0 : dy[at] - exp(yv[at]) * total;
            }
        }
    qkv_accumulate_f64_(dx, work);
}

qkv_tensor *qkv_log_softmax(qkv_ctx *ctx, qkv_tensor *x, int axis) {
    const char *fn = "qkv_log_softmax";
    if (!ctx || ctx->status) return NULL;
    qkv_axis_ plan;
    if (!qkv_axis_plan_(ctx, fn, x, axis, true, &plan)) return NULL;
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    if (y && x->dtype == QKV_F32 && plan.inner == 1) {
        log_softmax_last_f32(x->data, plan.outer, plan.n, y->data);
        return qkv_axis_record_(ctx, fn, log_softmax_backward, x, y, &plan);
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
                // y = x - lse; a line of -inf stays -inf; one with +inf or NaN: NaN
                yv[at] = l == -INFINITY ? -INFINITY : isfinite(l) ? xv[at] - l : NAN;
            }
    qkv_store_f64_(y, yv);
    return qkv_axis_record_(ctx, fn, log_softmax_backward, x, y, &plan);
}
