/*
 * projection.c — the Q, K, V projections: Y = X W (+ b).
 *   X [..., n, d_in] (1 to 4 dimensions; every leading dimension and n flatten into rows = numel / d_in)
 *   W [d_in, d_out], b [d_out] or NULL  ->  Y [..., n, d_out]
 * The forward and the two matrix gradients are single GEMMs on the native dtype over all rows at once
 * (the transposes are GEMM flags, nothing is copied out); the bias and its gradient are summed in double.
 * f32: the bias is added over rows split between the context's threads, and its gradient's column sums over
 * columns split between them (each column summed over the rows in order by one thread): the same bits with
 * any count (ops/parallel.h).
 */
#include "qkv_internal.h"

#include "parallel.h"

/* The f32 bias: Y[r, j] += b[j] over a range of rows. */
typedef struct bias_job {
    float *y;
    const float *b;
    int64_t d_out;
} bias_job;

static void bias_add_range(void *arg, int64_t r0, int64_t r1) {
    const bias_job *j = arg;
    float *restrict y = j->y;
    const float *restrict b = j->b;
    int64_t d_out = j->d_out;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = 0; c < d_out; c++) y[r * d_out + c] += b[c]; // Y[r, j] += b[j]
}

/* C[m,p] += op(A) op(B) (= when not accumulate) on the native dtype of the operands (all of the same dtype);
 * f32 on the context's threads (rows of C split between them: the same bits with any count). */
static void gemm_acc(qkv_ctx *ctx, qkv_dtype dtype, const void *a, const void *b, void *c, int64_t m, int64_t k,
                     int64_t p, bool trans_a, bool trans_b, bool accumulate) {
    if (dtype == QKV_F64) qkv_gemm_f64_(a, b, c, m, k, p, trans_a, trans_b, accumulate);
    else qkv_gemm_f32_threads_(qkv_threads(ctx), a, b, c, m, k, p, trans_a, trans_b, accumulate);
}

// dX += dY W^T;  dW += X^T dY;  db += colsum(dY)
static void projection_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0], *w = node->in[1], *b = node->n_in > 2 ? node->in[2] : NULL;
    const qkv_tensor *dy = node->out->grad;
    int64_t d_in = w->shape[0], d_out = w->shape[1], rows = qkv_dims_product_(x, 0, x->ndim - 1);
    if (qkv_wants_grad_(x)) {
        bool fresh;
        qkv_tensor *dx = qkv_grad_to_write_(ctx, x, &fresh);
        if (!dx) return;
        // dX [rows, d_in] += dY [rows, d_out] W^T [d_out, d_in]   (= when dX is new: no zero fill first)
        gemm_acc(ctx, x->dtype, dy->data, w->data, dx->data, rows, d_out, d_in, false, true, !fresh);
    }
    if (qkv_wants_grad_(w)) {
        qkv_tensor *dw = qkv_grad_of_(ctx, w);
        if (!dw) return;
        // dW [d_in, d_out] += X^T [d_in, rows] dY [rows, d_out]
        gemm_acc(ctx, w->dtype, x->data, dy->data, dw->data, d_in, rows, d_out, true, false, true);
    }
    if (qkv_wants_grad_(b)) {
        qkv_tensor *db = qkv_grad_of_(ctx, b);
        double *sums = qkv_arena_array_(ctx, node->op, (size_t)d_out, sizeof(double));
        if (!db || !sums) return;
        // db[j] += sum_r dY[r, j]
        if (dy->dtype == QKV_F32) { /* parallel.h: columns over threads, rows in order */
            qkv_column_sums_f32_(qkv_threads(ctx), dy->data, rows, d_out, sums);
            qkv_accumulate_f64_(db, sums);
            return;
        }
        for (int64_t j = 0; j < d_out; j++) sums[j] = 0.0;
        for (int64_t r = 0; d_out > 0 && r < rows; r++) /* d_out 0: no walk over rows of nothing */
            for (int64_t j = 0; j < d_out; j++)
                sums[j] += dy->dtype == QKV_F64 ? ((const double *)dy->data)[r * d_out + j]
                                                : ((const float *)dy->data)[r * d_out + j];
        qkv_accumulate_f64_(db, sums);
    }
}

qkv_tensor *qkv_projection(qkv_ctx *ctx, qkv_tensor *x, qkv_tensor *w, qkv_tensor *b) {
    const char *fn = "qkv_projection";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x) || !qkv_check_float_(ctx, fn, "w", w) ||
        (b && !qkv_check_float_(ctx, fn, "b", b)) || !qkv_check_same_dtype_(ctx, fn, x, "x", w, "w") ||
        (b && !qkv_check_same_dtype_(ctx, fn, x, "x", b, "b")))
        return NULL;
    if (x->ndim < 1)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s, w is %s: x must have 1 to %d dimensions", fn,
                         QKV_SHAPE(x), QKV_SHAPE(w), QKV_MAX_DIMS);
    if (w->ndim != 2)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s, w is %s: w must be 2-D [d_in, d_out], not %d-D",
                         fn, QKV_SHAPE(x), QKV_SHAPE(w), w->ndim);
    int64_t d_in = x->shape[x->ndim - 1], d_out = w->shape[1];
    if (w->shape[0] != d_in)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s, w is %s: inner dimensions %lld and %lld differ",
                         fn, QKV_SHAPE(x), QKV_SHAPE(w), (long long)d_in, (long long)w->shape[0]);
    if (b && (b->ndim != 1 || b->shape[0] != d_out))
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s, w is %s, b is %s: b must be [%lld] (d_out)", fn,
                         QKV_SHAPE(x), QKV_SHAPE(w), QKV_SHAPE(b), (long long)d_out);

    int64_t shape[QKV_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = d_out;
    qkv_tensor *y = qkv_new_tensor_(ctx, fn, x->dtype, x->ndim, shape);
    if (!y) return NULL;
    int64_t rows = qkv_dims_product_(x, 0, x->ndim - 1);

    // Y [rows, d_out] = X [rows, d_in] W [d_in, d_out]
    if (x->dtype == QKV_F64) qkv_gemm_f64_(x->data, w->data, y->data, rows, d_in, d_out, false, false, false);
    else qkv_gemm_f32_threads_(qkv_threads(ctx), x->data, w->data, y->data, rows, d_in, d_out, false, false, false);
    if (b && y->numel > 0) { /* an empty Y has no row to add to, however many rows it counts */
        // Y[r, j] += b[j]
        if (y->dtype == QKV_F64) {
            double *yv = y->data;
            const double *bv = b->data;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < d_out; j++) yv[r * d_out + j] += bv[j];
        } else {
            bias_job job = {.y = y->data, .b = b->data, .d_out = d_out};
            qkv_parallel_ranges_(qkv_threads(ctx), rows, 1, (double)rows * (double)d_out, QKV_GRAIN_ELEMENTS_,
                                 bias_add_range, &job);
        }
    }

    qkv_tensor *in[3] = {x, w, b};
    int n_in = b ? 3 : 2;
    if (qkv_needs_grad_(ctx, in, n_in) && !qkv_record_(ctx, fn, projection_backward, y, in, n_in))
        return NULL;
    return y;
}
