/*
 * fused_cases.h — what tests/test_fused.c and tests/test_avx512_emulated.c share to compare attention paths:
 * a seeded uniform generator independent of the library's RNG, the mask kinds and their masks, a
 * configuration (shapes, mask, causal, scale, spread of q and k), a run's tensors, and the norm-wise
 * relative differences of out, dq, dk and dv. Each file has its own do_run (which attention it calls).
 */
#ifndef QKV_TESTS_FUSED_CASES_H
#define QKV_TESTS_FUSED_CASES_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"

static uint64_t lcg_state = 0x853c49e6748fea9bull;
static inline double urand(void) { /* [0, 1), independent of the library's RNG */
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}

enum {
    M_NONE,       /* no mask                                                            */
    M_2D,         /* [n_q, n_k] random, row 1 fully masked                              */
    M_PAD,        /* [B, 1, n_k]: batch b pads its last b * n_k / 3 keys; batch 3 all   */
    M_FULL,       /* [B, n_q, n_k] random, every third row fully masked                 */
    M_BM1,        /* [1, n_q, n_k] broadcast over the batch                             */
    M_PAD_BM1,    /* [1, 1, n_k] broadcast padding                                      */
    M_LATE,       /* [n_q, n_k]: odd rows keep only keys >= n_k / 2 (early tiles empty) */
    M_KINDS
};

typedef struct cfg {
    int batch, n_q, n_k, d_k, d_v;
    int mask;
    bool causal;
    double scale; /* QKV_SCALE_DEFAULT: 1/sqrt(d_k) */
    double spread; /* std of q and k */
} cfg;

static qkv_tensor *make_mask(qkv_ctx *ctx, const cfg *c) {
    int64_t B = c->batch, q = c->n_q, k = c->n_k;
    qkv_tensor *m = NULL;
    switch (c->mask) {
    case M_2D: case M_LATE: m = qkv_zeros(ctx, QKV_U8, 2, (int64_t[]){q, k}); break;
    case M_PAD: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){B, 1, k}); break;
    case M_FULL: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){B, q, k}); break;
    case M_BM1: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){1, q, k}); break;
    case M_PAD_BM1: m = qkv_zeros(ctx, QKV_U8, 3, (int64_t[]){1, 1, k}); break;
    default: return NULL;
    }
    uint8_t *bits = qkv_u8(m);
    int64_t rows = m->numel / k;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k; j++) {
            uint8_t keep = 1;
            switch (c->mask) {
            case M_2D: keep = r != 1 && urand() < 0.75; break;
            case M_PAD: keep = r == 2 ? 0 : j < k - r * k / 3; break;
            case M_FULL: keep = r % 3 != 1 && urand() < 0.7; break;
            case M_BM1: keep = urand() < 0.6 || j == r % k; break;
            case M_PAD_BM1: keep = j < k - k / 4 || k == 1; break;
            case M_LATE: keep = r % 2 == 0 || j >= k / 2; break;
            default: break;
            }
            bits[r * k + j] = keep;
        }
    return m;
}

typedef struct run {
    qkv_ctx *ctx;
    qkv_tensor *q, *k, *v, *out, *mask;
} run;

static inline double val(const qkv_tensor *t, int64_t i) {
    return t->dtype == QKV_F64 ? qkv_f64(t)[i] : (double)qkv_f32(t)[i];
}

static inline double norm(const qkv_tensor *t) {
    double s = 0;
    for (int64_t i = 0; i < t->numel; i++) s += val(t, i) * val(t, i);
    return sqrt(s);
}

/* |a - b| / max(|b|, floor) norm-wise. */
static inline double rel_diff(const qkv_tensor *a, const qkv_tensor *b, double floor) {
    double num = 0;
    for (int64_t i = 0; i < a->numel; i++) num += (val(a, i) - val(b, i)) * (val(a, i) - val(b, i));
    double den = norm(b);
    return sqrt(num) / fmax(fmax(den, floor), 1e-300);
}

/* The worst norm-wise relative difference of out, dq, dk, dv between two runs. A gradient that is zero by
 * the mathematics (n_k = 1: softmax is constant, dq = dk = 0) holds only rounding noise; it is measured
 * against the largest gradient's norm instead of its own. */
static inline double worst_diff(const run *a, const run *b) {
    const qkv_tensor *ga[3] = {a->q->grad, a->k->grad, a->v->grad}, *gb[3] = {b->q->grad, b->k->grad, b->v->grad};
    double largest = 0, worst = rel_diff(a->out, b->out, 0);
    for (int i = 0; i < 3; i++) largest = fmax(largest, norm(gb[i]));
    for (int i = 0; i < 3; i++)
        worst = fmax(worst, rel_diff(ga[i], gb[i], norm(gb[i]) < 1e-3 * largest ? largest : 0));
    return worst;
}

static inline void describe(const cfg *c, char *buf, size_t size) {
    snprintf(buf, size, "B %d n_q %d n_k %d d_k %d d_v %d mask %d%s scale %g", c->batch, c->n_q, c->n_k, c->d_k,
             c->d_v, c->mask, c->causal ? " causal" : "", c->scale);
}

static inline bool same_bits(const qkv_tensor *a, const qkv_tensor *b) {
    return a->numel == b->numel && !memcmp(a->data, b->data, (size_t)a->numel * qkv_dtype_size(a->dtype));
}

#endif
