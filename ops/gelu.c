/*
 * gelu.c — the GELU activation, elementwise (torch.nn.functional.gelu).   x [...] -> y [...] (same shape)
 *   QKV_GELU_ERF:  y = x Phi(x),  Phi(x) = erfc(-x / sqrt 2) / 2                 (approximate='none')
 *                  dy/dx = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 *   QKV_GELU_TANH: y = x (1 + t) / 2,  t = tanh(u),  u = sqrt(2/pi) (x + 0.044715 x^3)  (approximate='tanh')
 *                  dy/dx = (1 + t) / 2 + (x / 2) (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2)
 * Phi is computed through erfc, not 1 + erf, so that it keeps its relative accuracy for x << 0. Any other
 * approx value is QKV_ERR_ARG. The backward reads x (node->in[0]).
 * Where exp(-x^2 / 2) or s (1 - s) is 0, the x in the derivative's second term is not multiplied in (it
 * could be inf, or overflow in x^2): dy/dx is 1 at +inf and 0 at -inf, as the limits are.
 * QKV_GELU_TANH is computed as x / (1 + exp(-2u)), the same function without the cancellation of 1 + t
 * for x << 0. f64: libm in double. f32, every element in f32:
 *   erf:  the kernels of ops/kernels/gelu_*.c (AVX2+FMA or portable, the same bits; their methods and
 *         error bounds: gelu_kernels.h): for x > -3, Phi(x) and dy/dx are piecewise polynomials (no exp, no
 *         division); below, erfc and exp. The backward recomputes dy/dx from x, which costs less than
 *         storing it in the forward and reading it back, and stores dx when x's gradient is fresh (a step
 *         tensor's first gradient: qkv_grad_to_write_) instead of zeroing it and adding.
 *   tanh: vectorised loops here (exp_f32); the forward also keeps e = exp(-2u) per element (one buffer of
 *         x's size in the step arena), which saves the backward all of its exps.
 * The f32 loops split the elements over qkv_threads(ctx) threads (ops/parallel.h), in ranges of whole
 * blocks of GELU_ALIGN elements, so every element takes the vector lane it takes on one thread: the same bits.
 */
#include "qkv_internal.h"

#include "kernels/gelu_kernels.h"
#include "parallel.h"

#include <math.h>

#define GELU_K0 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_K1 0.044715
#define GELU_INV_SQRT2 0.7071067811865476
#define GELU_INV_SQRT2PI 0.3989422804014327 /* 1 / sqrt(2 pi) */

/* ---- f64 ----------------------------------------------------------------------------------------- */

static void gelu_f64(const double *x, double *y, int64_t n, qkv_gelu_approx approx) {
    if (approx == QKV_GELU_ERF)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * 0.5 * erfc(-x[i] * GELU_INV_SQRT2); // y = x Phi(x)
    else
        for (int64_t i = 0; i < n; i++) {
            double u = GELU_K0 * (x[i] + GELU_K1 * x[i] * x[i] * x[i]);
            y[i] = x[i] / (1.0 + exp(-2.0 * u)); // y = x (1 + tanh u) / 2 = x / (1 + e^(-2u))
        }
}

static void gelu_backward_f64(const double *x, const double *dy, double *dx, int64_t n, qkv_gelu_approx approx) {
    if (approx == QKV_GELU_ERF)
        for (int64_t i = 0; i < n; i++) {
            double v = x[i];
            double e = exp(-0.5 * v * v) * GELU_INV_SQRT2PI, xphi = e == 0.0 ? 0.0 : v * e; /* 0, not inf 0 */
            dx[i] += dy[i] * (0.5 * erfc(-v * GELU_INV_SQRT2) + xphi); // dx += dy (Phi(x) + x phi(x))
        }
    else
        for (int64_t i = 0; i < n; i++) {
            double v = x[i], e = exp(-2.0 * GELU_K0 * (v + GELU_K1 * v * v * v));
            double s = 1.0 / (1.0 + e), oms = e < 1.0 ? e * s : 1.0 - s; // s = (1 + t) / 2, oms = 1 - s
            double s1s = s * oms, k = s1s == 0.0 ? 0.0 : v * s1s * (2.0 * GELU_K0) * (1.0 + 3.0 * GELU_K1 * v * v);
            dx[i] += dy[i] * (s + k); // dx += dy (s + 2 x s (1 - s) k0 (1 + 3 k1 x^2)),  (1 - t^2) / 2 = 2 s (1 - s)
        }
}

/* ---- f32 ----------------------------------------------------------------------------------------- */
/* Every element in f32 through the two functions below, written so that GCC vectorises them inside the
 * QKV_VECTOR_LOOP kernels (no libm call in the loop: erfcf, expf and tanhf are scalar calls; every
 * choice is a select_f32). */

/* c ? a : b as a bitwise blend of values already computed. A plain ?: would let GCC sink the computation
 * of a or b under the condition, and an FP operation under a condition is not executed speculatively
 * (-ftrapping-math): without AVX-512's masked operations GCC would then not vectorise the loop. */
static inline float select_f32(int c, float a, float b) {
    uint32_t m = (uint32_t)-(int32_t)(c != 0), ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    uint32_t r = (ai & m) | (bi & ~m);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

/* exp(x) in f32: x = n ln2 + r (Cody-Waite, |r| <= ln2 / 2), exp(r) by Cephes' expf polynomial (about 1
 * ulp), times 2^(n/2) 2^(n - n/2), so that subnormal results come out right and results past FLT_MAX
 * overflow to inf by themselves. x is first clamped to [-110, 88.8]: below -110 the result rounds to 0
 * (exp(-110) < 2^-158), above 88.8 it is inf either way. n is rounded by adding 1.5 2^23 and read from
 * the float's low bits (no float-to-int conversion: a NaN x gives garbage bits, never undefined
 * behaviour, and then NaN through r). */
static inline float exp_f32(float x) {
    float xc = select_f32(x > 88.8f, 88.8f, x);
    xc = select_f32(xc < -110.0f, -110.0f, xc);
    float t = xc * 1.44269504088896341f + 12582912.0f; // 1.5 2^23 + round(x / ln2)
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    int32_t ni = (int32_t)(tb - 0x4B400000u); /* t's bits minus those of 1.5 2^23: n, for |n| < 2^22 */
    float n = t - 12582912.0f;
    float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f; // r = x - n ln2
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float e = (p * r) * r + r + 1.0f; // e = exp(r)
    int32_t h = ni >> 1;              /* floor(n / 2); n - h and h are in [-80, 64] */
    uint32_t b1 = (uint32_t)(h + 127) << 23, b2 = (uint32_t)(ni - h + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return (e * s1) * s2; // exp(x) = exp(r) 2^n
}

/* QKV_GELU_TANH's forward; when saved is not NULL (a backward will follow) it also keeps, per element,
 * e = exp(-2u), which the backward would otherwise recompute. */
QKV_VECTOR_LOOP
static void gelu_tanh_f32(const float *restrict x, float *restrict y, float *restrict saved, int64_t n) {
    if (saved)
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], u = (float)GELU_K0 * (v + ((float)GELU_K1 * v) * (v * v)), e = exp_f32(-2.0f * u);
            saved[i] = e;
            y[i] = v / (1.0f + e); // y = x / (1 + e^(-2u))
        }
    else
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], u = (float)GELU_K0 * (v + ((float)GELU_K1 * v) * (v * v));
            y[i] = v / (1.0f + exp_f32(-2.0f * u));
        }
}

/* QKV_GELU_TANH's backward; saved: what gelu_tanh_f32 kept, e = exp(-2u) */
QKV_VECTOR_LOOP
static void gelu_tanh_backward_f32(const float *restrict x, const float *restrict saved,
                                   const float *restrict dy, float *restrict dx, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], e = saved[i];
        float s = 1.0f / (1.0f + e), es = e * s, one_minus_s = 1.0f - s, oms = select_f32(e < 1.0f, es, one_minus_s);
        float s1s = s * oms, kv = v * s1s * (float)(2.0 * GELU_K0) * (1.0f + (float)(3.0 * GELU_K1) * v * v);
        float k = select_f32(s1s == 0.0f, 0.0f, kv);
        dx[i] += dy[i] * (s + k); // dx += dy (s + 2 x s (1 - s) k0 (1 + 3 k1 x^2))
    }
}

/* ---- f32 over threads ---------------------------------------------------------------------------- */

#define GELU_ALIGN 64 /* elements: a whole number of vectors of every instruction set, and of cache lines */

typedef struct gelu_job {
    const float *x, *dy, *saved_in;
    float *y, *dx, *saved_out;
    bool add, tanh;
} gelu_job;

static void gelu_forward_range(void *arg, int64_t i0, int64_t i1) {
    const gelu_job *j = arg;
    if (j->tanh) gelu_tanh_f32(j->x + i0, j->y + i0, j->saved_out ? j->saved_out + i0 : NULL, i1 - i0);
    else qkv_gelu_kernels_()->erf_forward(j->x + i0, j->y + i0, i1 - i0);
}

static void gelu_backward_range(void *arg, int64_t i0, int64_t i1) {
    const gelu_job *j = arg;
    if (j->tanh) gelu_tanh_backward_f32(j->x + i0, j->saved_in + i0, j->dy + i0, j->dx + i0, i1 - i0);
    else qkv_gelu_kernels_()->erf_backward(j->x + i0, j->dy + i0, j->dx + i0, i1 - i0, j->add);
}

static void gelu_f32_threads(qkv_ctx *ctx, qkv_range_fn_ fn, gelu_job *job, int64_t n) {
    qkv_parallel_ranges_(qkv_threads(ctx), n, GELU_ALIGN, (double)n, QKV_GRAIN_ELEMENTS_, fn, job);
}

/* ---- the operator ------------------------------------------------------------------------------- */

static void gelu_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    if (!qkv_wants_grad_(x)) return;
    qkv_gelu_approx approx = (qkv_gelu_approx)node->flags;
    const qkv_tensor *dy = node->out->grad;
    if (x->dtype == QKV_F32 && approx == QKV_GELU_ERF) { /* a fresh dx is stored, not zeroed and added to */
        bool fresh;
        qkv_tensor *dx = qkv_grad_to_write_(ctx, x, &fresh);
        if (!dx) return;
        gelu_job job = {.x = x->data, .dy = dy->data, .dx = dx->data, .add = !fresh, .tanh = false};
        gelu_f32_threads(ctx, gelu_backward_range, &job, x->numel);
        return;
    }
    qkv_tensor *dx = qkv_grad_of_(ctx, x);
    if (!dx) return;
    if (x->dtype == QKV_F64)
        gelu_backward_f64(x->data, dy->data, dx->data, x->numel, approx);
    else {
        gelu_job job = {.x = x->data, .saved_in = node->saved, .dy = dy->data, .dx = dx->data, .tanh = true};
        gelu_f32_threads(ctx, gelu_backward_range, &job, x->numel);
    }
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
    qkv_tensor *in[1] = {x};
    bool record = qkv_needs_grad_(ctx, in, 1);
    float *saved = NULL; /* f32 tanh and recording: exp(-2u) per element, for the backward */
    if (record && x->dtype == QKV_F32 && approx == QKV_GELU_TANH) {
        saved = qkv_arena_array_(ctx, fn, (size_t)(x->numel > 0 ? x->numel : 1), sizeof(float));
        if (!saved) return NULL;
    }
    if (x->dtype == QKV_F64)
        gelu_f64(x->data, y->data, x->numel, approx);
    else {
        gelu_job job = {.x = x->data, .y = y->data, .saved_out = saved, .tanh = approx == QKV_GELU_TANH};
        gelu_f32_threads(ctx, gelu_forward_range, &job, x->numel);
    }
    if (record) {
        qkv_node_ *node = qkv_record_(ctx, fn, gelu_backward, y, in, 1);
        if (!node) return NULL;
        node->flags = (int)approx;
        node->saved = saved;
    }
    return y;
}
