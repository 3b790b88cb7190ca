/*
 * binary.c — what add, sub and mul share: operand checks with trailing-dimension broadcasting, the
 * f64 working buffers, recording, and reducing a per-element gradient onto a broadcast bias.
 */
#include "qkv_internal.h"

#include <string.h>

qkv_tensor *qkv_binary_(qkv_ctx *ctx, const char *fn, qkv_tensor *a, qkv_tensor *b,
                        qkv_binary_kernel_ kernel, qkv_binary_kernel_f32_ kernel_f32, qkv_backward_fn_ backward) {
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "a", a) || !qkv_check_float_(ctx, fn, "b", b) ||
        !qkv_check_same_dtype_(ctx, fn, a, "a", b, "b") || !qkv_check_broadcast_(ctx, fn, a, b))
        return NULL;
    qkv_tensor *y = qkv_new_like_(ctx, fn, a);
    if (!y) return NULL;
    qkv_tensor *in[2] = {a, b};
    if (a->dtype == QKV_F32 && kernel_f32) {
        kernel_f32(a->data, b->data, y->data, a->numel, b->numel);
        if (qkv_needs_grad_(ctx, in, 2) && !qkv_record_(ctx, fn, backward, y, in, 2)) return NULL;
        return y;
    }
    const double *av = qkv_as_f64_(ctx, fn, a), *bv = qkv_as_f64_(ctx, fn, b);
    double *yv = qkv_out_f64_(ctx, fn, y);
    if (!av || !bv || !yv) return NULL;
    kernel(av, bv, yv, a->numel, b->numel);
    qkv_store_f64_(y, yv);
    if (qkv_needs_grad_(ctx, in, 2) && !qkv_record_(ctx, fn, backward, y, in, 2)) return NULL;
    return y;
}

bool qkv_binary_operands_(qkv_ctx *ctx, const qkv_node_ *node, const double **dy, const double **a,
                          const double **b) {
    *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    *a = qkv_as_f64_(ctx, node->op, node->in[0]);
    *b = qkv_as_f64_(ctx, node->op, node->in[1]);
    return *dy && *a && *b;
}

bool qkv_accumulate_bias_grad_(qkv_ctx *ctx, qkv_tensor *b, const double *per_element, int64_t n,
                               double sign) {
    qkv_tensor *db = qkv_grad_of_(ctx, b);
    double *sums = qkv_arena_array_(ctx, "qkv_backward", (size_t)b->numel, sizeof(double));
    if (!db || !sums) return false;
    /* hardening fix (fuzz_graph): an empty b (then a is empty too) has nothing to sum, and n / 0 was UB */
    if (b->numel == 0) return true;
    qkv_sum_rows_f64_(per_element, n / b->numel, b->numel, sums);
    for (int64_t j = 0; j < b->numel; j++) sums[j] *= sign;
    qkv_accumulate_f64_(db, sums);
    return true;
}

/* The f32 backward of y = a + sign * b: da += dy in float; db += sign * dy when b has a's shape, else
 * sign * (the column sums of dy, in double) -- the bits of the f64 path, without its working copies. */
static void linear_binary_backward_f32(qkv_ctx *ctx, qkv_node_ *node, double sign) {
    qkv_tensor *a = node->in[0], *b = node->in[1];
    const float *dy = node->out->grad->data;
    int64_t n = a->numel;
    bool fresh;
    if (qkv_wants_grad_(a)) {
        qkv_tensor *da = qkv_grad_to_write_(ctx, a, &fresh);
        if (!da) return;
        float *dav = da->data;
        if (fresh) memcpy(dav, dy, (size_t)n * sizeof(float)); // da = dy (a new gradient)
        else
            for (int64_t i = 0; i < n; i++) dav[i] += dy[i]; // da += dy
    }
    if (!qkv_wants_grad_(b)) return;
    int64_t nb = b->numel;
    if (nb == n) {
        qkv_tensor *db = qkv_grad_to_write_(ctx, b, &fresh);
        if (!db) return;
        float *dbv = db->data;
        if (fresh && sign > 0) memcpy(dbv, dy, (size_t)n * sizeof(float)); // db = dy
        else if (fresh) // db = -dy
            for (int64_t i = 0; i < n; i++) dbv[i] = 0.0f - dy[i];
        else if (sign > 0) // db += dy
            for (int64_t i = 0; i < n; i++) dbv[i] += dy[i];
        else // db -= dy
            for (int64_t i = 0; i < n; i++) dbv[i] -= dy[i];
        return;
    }
    qkv_tensor *db = qkv_grad_of_(ctx, b);
    if (!db) return;
    float *dbv = db->data;
    double *sums = qkv_arena_array_(ctx, "qkv_backward", (size_t)(nb > 0 ? nb : 1), sizeof(double));
    if (!sums || nb == 0) return;
    // db[j] += sign * sum_r dy[r, j]
    for (int64_t j = 0; j < nb; j++) sums[j] = 0.0;
    for (int64_t r = 0; r < n / nb; r++)
        for (int64_t j = 0; j < nb; j++) sums[j] += dy[r * nb + j];
    for (int64_t j = 0; j < nb; j++) dbv[j] = (float)((double)dbv[j] + sign * sums[j]);
}

void qkv_linear_binary_backward_(qkv_ctx *ctx, qkv_node_ *node, double sign) {
    qkv_tensor *a = node->in[0], *b = node->in[1];
    if (a->dtype == QKV_F32) {
        linear_binary_backward_f32(ctx, node, sign);
        return;
    }
    const double *dy = qkv_as_f64_(ctx, node->op, node->out->grad);
    if (!dy) return;
    if (qkv_wants_grad_(a)) {
        qkv_tensor *da = qkv_grad_of_(ctx, a);
        if (!da) return;
        qkv_accumulate_f64_(da, dy);
    }
    if (qkv_wants_grad_(b)) qkv_accumulate_bias_grad_(ctx, b, dy, a->numel, sign);
}
