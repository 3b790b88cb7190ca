/*
 * mul.c — y = a * b elementwise, b of a's shape, a trailing-dimension bias, or one element.
 *   a [..., d], b [d] -> y [..., d]
 */
#include "qkv_internal.h"

// y[i] = a[i] * b[i % nb]
static void mul_forward(const double *a, const double *b, double *y, int64_t n, int64_t nb) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i % nb];
}

// the same in float, a row of nb at a time (nb divides n)
static void mul_forward_f32(const float *a, const float *b, float *y, int64_t n, int64_t nb) {
    for (int64_t r = 0; nb > 0 && r < n; r += nb)
        for (int64_t j = 0; j < nb; j++) y[r + j] = a[r + j] * b[j];
}

/* grad (+)= dy * other for f32 operands of one shape (grad new: = 0.0 + dy * other, as the sum into a zero gradient
 * gives): the product of two floats is exact in double, so this is the f64 path's arithmetic and bits, without
 * its three double copies of the operands. */
QKV_VECTOR_LOOP
static void mul_grad_f32(float *restrict grad, const float *restrict dy, const float *restrict other, int64_t n,
                         bool fresh) {
    if (fresh)
        for (int64_t i = 0; i < n; i++) grad[i] = (float)(0.0 + (double)dy[i] * (double)other[i]);
    else
        for (int64_t i = 0; i < n; i++) grad[i] = (float)((double)grad[i] + (double)dy[i] * (double)other[i]);
}

// da[i] += dy[i] * b[i % nb];  db[j] += sum over rows of dy * a
static void mul_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *a = node->in[0], *b = node->in[1];
    if (a->dtype == QKV_F32 && b->dtype == QKV_F32 && a->numel == b->numel) { // f32, one shape
        const float *dy = node->out->grad->data;
        bool fresh;
        if (qkv_wants_grad_(a)) { // da += dy * b
            qkv_tensor *da = qkv_grad_to_write_(ctx, a, &fresh);
            if (!da) return;
            mul_grad_f32(da->data, dy, b->data, a->numel, fresh);
        }
        if (qkv_wants_grad_(b)) { // db += dy * a
            qkv_tensor *db = qkv_grad_to_write_(ctx, b, &fresh);
            if (!db) return;
            mul_grad_f32(db->data, dy, a->data, a->numel, fresh);
        }
        return;
    }
    const double *dy, *av, *bv;
    if (!qkv_binary_operands_(ctx, node, &dy, &av, &bv)) return;
    double *work = qkv_arena_array_(ctx, node->op, (size_t)a->numel, sizeof(double));
    if (!work) return;
    if (qkv_wants_grad_(a)) {
        qkv_tensor *da = qkv_grad_of_(ctx, a);
        if (!da) return;
        mul_forward(dy, bv, work, a->numel, b->numel); /* dy * b, broadcast as in the forward */
        qkv_accumulate_f64_(da, work);
    }
    if (qkv_wants_grad_(b)) {
        for (int64_t i = 0; i < a->numel; i++) work[i] = dy[i] * av[i];
        qkv_accumulate_bias_grad_(ctx, b, work, a->numel, 1.0);
    }
}

qkv_tensor *qkv_mul(qkv_ctx *ctx, qkv_tensor *a, qkv_tensor *b) {
    return qkv_binary_(ctx, "qkv_mul", a, b, mul_forward, mul_forward_f32, mul_backward);
}
