/*
 * rope.c — rotary position embedding, "rotate half" convention (GPT-NeoX; LLaMA in Hugging Face).
 *   x [n, d] or [B, n, d] -> y of the same shape; d even (>= 2); row i of every batch is at position p = offset + i.
 * Pairs (j, j + d/2), j < d/2, are rotated by the angle p theta_j, theta_j = base^(-2j/d):
 *   y[j]       = x[j] cos - x[j + d/2] sin
 *   y[j + d/2] = x[j + d/2] cos + x[j] sin
 * The backward is the inverse (transposed) rotation of dy; it never reads x, so it saves only the cos/sin
 * table the forward computed (2 n d/2 doubles in the arena).
 *
 * Precision: the angles p theta_j are computed in double from the integer position (exact up to 2^53), so
 * the angle carries a relative error of a few 1e-16 (an absolute 1e-10 rad at p = 1e6), and cos/sin and the
 * rotation are evaluated in double for both dtypes. The f32 path rounds x to double exactly and y to f32
 * once at the end: each f32 output is within about one f32 rounding (2^-24 relative, of the pair's norm) of
 * the exact rotation of its f32 input, at any offset. (An angle p * theta rounded to f32 would be off by up
 * to half its spacing: 5e-4 rad at p ~ 1e4, 0.03 rad at p ~ 1e6.)
 * base must be finite and > 1, offset >= 0 and offset + n must fit in int64 (QKV_ERR_ARG otherwise).
 */
#include "qkv_internal.h"

#include <math.h>

typedef struct rope_saved {
    const double *cs, *sn; /* the forward's table, [n, d/2] each */
} rope_saved;

// cs[i, j] = cos((offset + i) theta_j), sn[i, j] = sin(...), theta_j = base^(-2j/d); [n, d/2] each
static bool rope_table(qkv_ctx *ctx, const char *fn, int64_t n, int64_t d, double base, int64_t offset,
                       double **cs, double **sn) {
    int64_t h = d / 2;
    *cs = qkv_arena_array_(ctx, fn, (size_t)(n * h), sizeof(double));
    *sn = qkv_arena_array_(ctx, fn, (size_t)(n * h), sizeof(double));
    if (!*cs || !*sn) return false;
    for (int64_t j = 0; j < h; j++) {
        double theta = pow(base, -(double)(2 * j) / (double)d);
        for (int64_t i = 0; i < n; i++) {
            double angle = (double)(offset + i) * theta;
            (*cs)[i * h + j] = cos(angle);
            (*sn)[i * h + j] = sin(angle);
        }
    }
    return true;
}

// rotate every row of src [rows, d] (position row % n) by +angle (sign = 1) or -angle (sign = -1), in double:
//   out[j] = src[j] cos - sign src[j + h] sin,  out[j + h] = src[j + h] cos + sign src[j] sin
// (accumulate: out += the rotation, for a backward adding into an existing gradient.)
QKV_VECTOR_LOOP
static void rope_rotate_f64(const double *src, double *out, int64_t rows, int64_t n, int64_t d, const double *cs,
                            const double *sn, double sign, bool accumulate) {
    int64_t h = d / 2;
    for (int64_t r = 0, pos = 0; r < rows; r++, pos = pos + 1 == n ? 0 : pos + 1) { /* pos = r % n */
        const double *a = src + r * d, *c = cs + pos * h, *s = sn + pos * h;
        double *o = out + r * d;
        for (int64_t j = 0; j < h; j++) {
            double x1 = a[j], x2 = a[j + h], sj = sign * s[j];
            double y1 = x1 * c[j] - x2 * sj, y2 = x2 * c[j] + x1 * sj;
            o[j] = accumulate ? o[j] + y1 : y1;
            o[j + h] = accumulate ? o[j + h] + y2 : y2;
        }
    }
}

// The same on f32 rows: each element widened to double (exact), rotated in double, rounded to f32 once (the
// bits of widening the whole tensor, rotating and storing, without the two arena copies). With accumulate,
// out[j] = f32(out[j] + the rotation in double), as qkv_accumulate_f64_ does. The pair loop is written
// four lanes wide (one AVX2 register of doubles), so the d_head = 8 of small models runs as one vector step.
QKV_VECTOR_LOOP
static void rope_rotate_f32(const float *restrict src, float *restrict out, int64_t rows, int64_t n, int64_t d,
                            const double *cs, const double *sn, double sign, bool accumulate) {
    int64_t h = d / 2;
    for (int64_t r = 0, pos = 0; r < rows; r++, pos = pos + 1 == n ? 0 : pos + 1) { /* pos = r % n */
        const float *a = src + r * d;
        const double *c = cs + pos * h, *s = sn + pos * h;
        float *o = out + r * d;
        int64_t j = 0;
        for (; j + 4 <= h; j += 4) {
            double y1[4], y2[4];
            for (int k = 0; k < 4; k++) {
                double x1 = a[j + k], x2 = a[j + h + k], sj = sign * s[j + k];
                y1[k] = x1 * c[j + k] - x2 * sj;
                y2[k] = x2 * c[j + k] + x1 * sj;
            }
            if (accumulate)
                for (int k = 0; k < 4; k++) {
                    o[j + k] = (float)((double)o[j + k] + y1[k]);
                    o[j + h + k] = (float)((double)o[j + h + k] + y2[k]);
                }
            else
                for (int k = 0; k < 4; k++) {
                    o[j + k] = (float)y1[k];
                    o[j + h + k] = (float)y2[k];
                }
        }
        for (; j < h; j++) {
            double x1 = a[j], x2 = a[j + h], sj = sign * s[j];
            double y1 = x1 * c[j] - x2 * sj, y2 = x2 * c[j] + x1 * sj;
            o[j] = accumulate ? (float)((double)o[j] + y1) : (float)y1;
            o[j + h] = accumulate ? (float)((double)o[j + h] + y2) : (float)y2;
        }
    }
}

static void rope_rotate(const qkv_tensor *src, qkv_tensor *out, int64_t n, int64_t d, const double *cs,
                        const double *sn, double sign, bool accumulate) {
    int64_t rows = src->numel / d;
    if (src->dtype == QKV_F32)
        rope_rotate_f32(src->data, out->data, rows, n, d, cs, sn, sign, accumulate);
    else
        rope_rotate_f64(src->data, out->data, rows, n, d, cs, sn, sign, accumulate);
}

// dx += R(-angle) dy:  dx[j] = dy[j] cos + dy[j + h] sin,  dx[j + h] = dy[j + h] cos - dy[j] sin
static void rope_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *x = node->in[0];
    const rope_saved *sv = node->saved;
    int64_t d = x->shape[x->ndim - 1], n = x->shape[x->ndim - 2];
    bool fresh = false;
    qkv_tensor *dx = qkv_grad_to_write_(ctx, x, &fresh);
    if (!dx) return;
    rope_rotate(node->out->grad, dx, n, d, sv->cs, sv->sn, -1.0, !fresh);
}

qkv_tensor *qkv_rope(qkv_ctx *ctx, qkv_tensor *x, double base, int64_t offset) {
    const char *fn = "qkv_rope";
    if (!ctx || ctx->status) return NULL;
    if (!qkv_check_float_(ctx, fn, "x", x)) return NULL;
    if (x->ndim != 2 && x->ndim != 3)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: x is %s: x must be [n, d] or [B, n, d], not %d-dimensional",
                         fn, QKV_SHAPE(x), x->ndim);
    int64_t d = x->shape[x->ndim - 1], n = x->shape[x->ndim - 2];
    if (d % 2 != 0 || d < 2)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: x is %s: the last dimension d = %lld must be even and >= 2", fn,
                         QKV_SHAPE(x), (long long)d);
    if (!isfinite(base) || !(base > 1))
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, base is %g: the base must be finite and > 1", fn,
                         QKV_SHAPE(x), base);
    if (offset < 0 || offset > INT64_MAX - n)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: x is %s, offset is %lld: the offset must be >= 0 and offset + n "
                         "must fit in int64", fn, QKV_SHAPE(x), (long long)offset);
    qkv_tensor *y = qkv_new_like_(ctx, fn, x);
    double *cs = NULL, *sn = NULL;
    if (!y || !rope_table(ctx, fn, n, d, base, offset, &cs, &sn)) return NULL;
    rope_rotate(x, y, n, d, cs, sn, 1.0, false);
    qkv_tensor *in[1] = {x};
    if (qkv_needs_grad_(ctx, in, 1)) {
        rope_saved *sv = qkv_arena_alloc_(ctx, fn, sizeof *sv);
        if (!sv) return NULL;
        sv->cs = cs;
        sv->sn = sn;
        qkv_node_ *node = qkv_record_(ctx, fn, rope_backward, y, in, 1);
        if (!node) return NULL;
        node->saved = sv;
    }
    return y;
}
