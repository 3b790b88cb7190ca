/*
 * sum_dim.c — qkv_sum_dim: y = the sum of x along one axis.   x [outer, n, inner] -> y [outer, inner]
 * Summed in double (f32 too: one rounding at the end): along the last axis in 8 lanes (row_sums.h), along
 * another in index order; the same order in f32 and f64. An empty axis sums to 0.
 */
#include "qkv_internal.h"

#include "row_sums.h"

// y[o, i] = sum_j x[o, j, i]
static void sum_axis(const double *x, const qkv_axis_ *p, double factor, double *y) {
    if (p->inner == 1) { // the last axis: 8 lanes (row_sums.h), the order of the f32 path
        for (int64_t o = 0; o < p->outer; o++) y[o] = sum8_f64(x + o * p->n, p->n) * factor;
        return;
    }
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t i = 0; i < p->inner; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < p->n; j++) s += x[(o * p->n + j) * p->inner + i];
            y[o * p->inner + i] = s * factor;
        }
}

// f32: y[o, i] = factor * sum_j x[o, j, i], summed in double in index order (the i lanes side by side)
QKV_VECTOR_LOOP
static void sum_axis_f32(const float *x, const qkv_axis_ *p, double factor, float *y, double *acc) {
    if (p->inner == 1) { // the last axis: 8 lanes (row_sums.h)
        for (int64_t o = 0; o < p->outer; o++) y[o] = (float)(sum8_f32(x + o * p->n, p->n) * factor);
        return;
    }
    for (int64_t o = 0; o < p->outer; o++) {
        for (int64_t i = 0; i < p->inner; i++) acc[i] = 0.0;
        for (int64_t j = 0; j < p->n; j++) {
            const float *row = x + (o * p->n + j) * p->inner;
            for (int64_t i = 0; i < p->inner; i++) acc[i] += (double)row[i];
        }
        for (int64_t i = 0; i < p->inner; i++) y[o * p->inner + i] = (float)(acc[i] * factor);
    }
}

// f32: dx[o, j, i] += factor * dy[o, i], or = when dx is a fresh gradient (store: 0 + g, the bits of adding into zeros).
// With factor 1 the sum of two floats in double, rounded once to float, is the float sum itself: double's 53
// bits are at least 2 * 24 + 2, enough for a double rounding of one addition to give the correctly rounded
// float result (Figueroa 1995), so the float add gives the same bits as the double one.
QKV_VECTOR_LOOP
static void sum_backward_f32(const float *restrict dy, const qkv_axis_ *p, double factor, float *restrict dx, bool store) {
    if (p->inner == 1) { // the last axis: one gradient a row
        for (int64_t o = 0; o < p->outer; o++) {
            float *row = dx + o * p->n;
            double g = factor * (double)dy[o];
            if (store) {
                for (int64_t j = 0; j < p->n; j++) row[j] = (float)(0.0 + g);
            } else if (factor == 1.0) { // a sum: row + dy in float, the same bits (see below), twice the lanes
                float gf = dy[o];
                for (int64_t j = 0; j < p->n; j++) row[j] += gf;
            } else {
                for (int64_t j = 0; j < p->n; j++) row[j] = (float)((double)row[j] + g);
            }
        }
        return;
    }
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t j = 0; j < p->n; j++) {
            float *row = dx + (o * p->n + j) * p->inner;
            const float *g = dy + o * p->inner;
            for (int64_t i = 0; i < p->inner; i++) row[i] = (float)((store ? 0.0 : (double)row[i]) + factor * (double)g[i]);
        }
}

typedef struct sum_saved {
    qkv_axis_ plan;
    double factor;
} sum_saved;

// dx[o, j, i] += factor * dy[o, i]
static void sum_dim_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const sum_saved *s = node->saved;
    const qkv_axis_ *p = &s->plan;
    qkv_tensor *x = node->in[0];
    if (x->dtype == QKV_F32) {
        bool fresh;
        qkv_tensor *dx = qkv_grad_to_write_(ctx, x, &fresh);
        if (dx) sum_backward_f32(node->out->grad->data, p, s->factor, dx->data, fresh);
        return;
    }
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    double *work = qkv_arena_array_(ctx, node->op, (size_t)x->numel + 1, sizeof(double));
    if (!dx || !dy || !work) return;
    for (int64_t o = 0; o < p->outer; o++)
        for (int64_t j = 0; j < p->n; j++)
            for (int64_t i = 0; i < p->inner; i++) work[(o * p->n + j) * p->inner + i] = s->factor * dy[o * p->inner + i];
    qkv_accumulate_f64_(dx, work);
}

/* The sum times factor (1 for sum_dim, 1/n for mean_dim), under the name fn. */
qkv_tensor *qkv_sum_dim_scaled_(qkv_ctx *ctx, const char *fn, qkv_tensor *x, int axis, bool keepdim, bool mean) {
    if (!ctx || ctx->status) return NULL;
    qkv_axis_ plan;
    if (!qkv_axis_plan_(ctx, fn, x, axis, keepdim, &plan)) return NULL;
    double factor = mean ? 1.0 / (double)plan.n : 1.0; /* an empty axis: 0 * inf = NaN, as PyTorch's mean */
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, plan.ndim, plan.shape);
    if (!y) return NULL;
    if (x->dtype == QKV_F32) { // on the float arrays, the same sums
        double *acc = qkv_arena_array_(ctx, fn, (size_t)plan.inner + 1, sizeof(double));
        if (!acc) return NULL;
        sum_axis_f32(x->data, &plan, factor, y->data, acc);
    } else {
        const double *xv = qkv_as_f64_(ctx, fn, x);
        double *yv = qkv_out_f64_(ctx, fn, y);
        if (!xv || !yv) return NULL;
        sum_axis(xv, &plan, factor, yv);
        qkv_store_f64_(y, yv);
    }
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        sum_saved *s = qkv_arena_alloc_(ctx, fn, sizeof *s);
        if (!s) return NULL;
        *s = (sum_saved){plan, factor};
        qkv_node_ *node = qkv_record_(ctx, fn, sum_dim_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = s;
    }
    return y;
}

qkv_tensor *qkv_sum_dim(qkv_ctx *ctx, qkv_tensor *x, int axis, bool keepdim) {
    return qkv_sum_dim_scaled_(ctx, "qkv_sum_dim", x, axis, keepdim, false);
}
