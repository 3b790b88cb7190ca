/*
 * gelu.c — the GELU activation, elementwise (torch.nn.functional.gelu).   x [...] -> y [...] (same shape)
 *   QKV_GELU_ERF:  y = x Phi(x),  Phi(x) = erfc(-x / sqrt 2) / 2                 (approximate='none')
 *                  dy/dx = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 *   QKV_GELU_TANH: y = x (1 + t) / 2,  t = tanh(u),  u = sqrt(2/pi) (x + 0.044715 x^3)  (approximate='tanh')
 *                  dy/dx = (1 + t) / 2 + (x / 2) (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2)
 * Phi is computed through erfc, not 1 + erf, so that it keeps its relative accuracy for x << 0. Any other
 * approx value is QKV_ERR_ARG. The backward reads x (node->in[0]); it saves nothing.
 * f64: libm in double. f32: every element in f32 (see gelu_f32).
 */
#include "qkv_internal.h"

#include <math.h>

#define GELU_K0 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_K1 0.044715
#define GELU_INV_SQRT2 0.7071067811865476
#define GELU_INV_SQRT2PI 0.3989422804014327 /* 1 / sqrt(2 pi) */

/* ---- f64 ---------------------------------------------------------------------------------------- */

static void gelu_f64(const double *x, double *y, int64_t n, qkv_gelu_approx approx) {
    if (approx == QKV_GELU_ERF)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * 0.5 * erfc(-x[i] * GELU_INV_SQRT2); // y = x Phi(x)
    else
        for (int64_t i = 0; i < n; i++) {
            double u = GELU_K0 * (x[i] + GELU_K1 * x[i] * x[i] * x[i]);
            y[i] = 0.5 * x[i] * (1.0 + tanh(u)); // y = x (1 + tanh u) / 2
        }
}

static void gelu_backward_f64(const double *x, const double *dy, double *dx, int64_t n, qkv_gelu_approx approx) {
    if (approx == QKV_GELU_ERF)
        for (int64_t i = 0; i < n; i++) {
            double v = x[i];
            // dx += dy (Phi(x) + x phi(x))
            dx[i] += dy[i] * (0.5 * erfc(-v * GELU_INV_SQRT2) + v * (exp(-0.5 * v * v) * GELU_INV_SQRT2PI));
        }
    else
        for (int64_t i = 0; i < n; i++) {
            double v = x[i], t = tanh(GELU_K0 * (v + GELU_K1 * v * v * v));
            // dx += dy ((1 + t) / 2 + (x / 2)(1 - t^2) k0 (1 + 3 k1 x^2)); 0.5 x (1 - t^2) first: 0 for |x| >> 1
            dx[i] += dy[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_K0 * (1.0 + 3.0 * GELU_K1 * v * v));
        }
}

/* ---- f32 ---------------------------------------------------------------------------------------- */

static void gelu_f32(const float *restrict x, float *restrict y, int64_t n, qkv_gelu_approx approx) {
    if (approx == QKV_GELU_ERF)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * 0.5f * erfcf(-x[i] * (float)GELU_INV_SQRT2);
    else
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], u = (float)GELU_K0 * (v + (float)GELU_K1 * v * v * v);
            y[i] = 0.5f * v * (1.0f + tanhf(u));
        }
}

static void gelu_backward_f32(const float *restrict x, const float *restrict dy, float *restrict dx, int64_t n,
                              qkv_gelu_approx approx) {
    if (approx == QKV_GELU_ERF)
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            dx[i] += dy[i] * (0.5f * erfcf(-v * (float)GELU_INV_SQRT2) +
                              v * (expf(-0.5f * v * v) * (float)GELU_INV_SQRT2PI));
        }
    else
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], t = tanhf((float)GELU_K0 * (v + (float)GELU_K1 * v * v * v));
            dx[i] += dy[i] * (0.5f * (1.0f + t) +
                              0.5f * v * (1.0f - t * t) * (float)GELU_K0 * (1.0f + 3.0f * (float)GELU_K1 * v * v));
        }
}

/* ---- the operator ------------------------------------------------------------------------------- */

static void gelu_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    if (!qkv_wants_grad_(x)) return;
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    if (!dx) return;
    const qkv_tensor *dy = node->out->grad;
    qkv_gelu_approx approx = (qkv_gelu_approx)node->flags;
    if (x->dtype == QKV_F64)
        gelu_backward_f64(x->data, dy->data, dx->data, x->numel, approx);
    else
        gelu_backward_f32(x->data, dy->data, dx->data, x->numel, approx);
}

qkv_tensor *qkv_gelu(qkv_ctx *ctx, qkv_tensor *x, qkv_gelu_approx approx) {
    const char *fn = "qkv_gelu";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    if (approx != QKV_GELU_ERF && approx != QKV_GELU_TANH)
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: x is %s, approx is %d: it must be QKV_GELU_ERF (0) or QKV_GELU_TANH (1)", fn,
                         QKV_SHAPE(x), (int)approx);
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    if (!y) return NULL;
    if (x->dtype == QKV_F64)
        gelu_f64(x->data, y->data, x->numel, approx);
    else
        gelu_f32(x->data, y->data, x->numel, approx);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        qkv_node_ *node = qkv_record_(ctx, fn, gelu_backward, y, in, 1);
        if (!node) return NULL;
        node->flags = (int)approx;
    }
    return y;
}
