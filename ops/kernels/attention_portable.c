/*
 * attention_portable.c — the f32 softmax and fused-attention row kernels in plain C (libm expf), for any
 * CPU; the reference the SIMD sets are tested against. Shapes and the keep rule: attention_kernels.h.
 */
#include "attention_kernels.h"

#include <float.h>
#include <math.h>

/* exp(x), exactly 0 where the result would be subnormal (x < QKV_EXP_FLUSH_F32); NaN stays NaN. */
static inline float exp_flushed(float x) { return x < QKV_EXP_FLUSH_F32 ? 0.0f : expf(x); }

static inline bool kept(const uint8_t *mrow, int64_t len, int64_t j) { return j < len && (!mrow || mrow[j]); }

// a[j] = exp(s[j] - m) / sum_{kept l} exp(s[l] - m),  m = max_{kept l} s[l];  0 where dropped
static void softmax_row(const float *s, float *a, int64_t n, const uint8_t *mrow, int64_t len) {
    float m = -INFINITY;
    bool any = false;
    for (int64_t j = 0; j < len; j++)
        if (kept(mrow, len, j)) {
            if (!any || s[j] > m) m = s[j];
            any = true;
        }
    if (!any) {
        for (int64_t j = 0; j < n; j++) a[j] = 0.0f;
        return;
    }
    double total = 0.0;
    for (int64_t j = 0; j < n; j++) {
        a[j] = kept(mrow, len, j) ? exp_flushed(s[j] - m) : 0.0f;
        total += a[j];
    }
    float tot = (float)total;
    for (int64_t j = 0; j < n; j++) a[j] = a[j] < FLT_MIN * tot ? 0.0f : a[j] / tot; /* never subnormal */
}

// m' = max(m, max_c scale S[r,c]);  P = exp(scale S - m');  l' = exp(m - m') l + rowsum(P);  O *= exp(m - m')
static void fwd_tile(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o, int64_t ldo,
                     int64_t d_v) {
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        float tmax = -INFINITY;
        for (int64_t c = 0; c < len; c++) {
            if (!kept(mrow, len, c)) continue;
            float x = srow[c] * scale;
            if (x > tmax || isnan(x)) tmax = x; /* a kept NaN sticks */
        }
        if (tmax == -INFINITY) { /* nothing kept in this tile (or only -inf scores): P = 0, no change */
            for (int64_t c = 0; c < t->cols; c++) srow[c] = 0.0f;
            continue;
        }
        float m_new = isnan(tmax) ? tmax : fmaxf(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        float alpha = m[r] == -INFINITY ? 0.0f : exp_flushed(m[r] - m_new);
        float sum = 0.0f;
        for (int64_t c = 0; c < t->cols; c++) {
            float p = kept(mrow, len, c) ? exp_flushed(srow[c] * scale - m_new) : 0.0f;
            srow[c] = p;
            sum += p;
        }
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
        if (alpha != 1.0f)
            for (int64_t c = 0; c < d_v; c++) o[r * ldo + c] *= alpha;
    }
}

// P = exp(scale S - lse) over kept keys, 0 elsewhere
static void bwd_p(float *s, const qkv_attn_tile_ *t, float scale, const float *lse) {
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = lse[r] == -INFINITY ? 0 : qkv_tile_row_len_(t, r);
        for (int64_t c = 0; c < t->cols; c++)
            srow[c] = kept(mrow, len, c) ? exp_flushed(srow[c] * scale - lse[r]) : 0.0f;
    }
}

// dS = scale * P * (dP - dsum), 0 where P = 0
static void bwd_ds(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                   float *ds) {
    for (int64_t r = 0; r < t->rows; r++)
        for (int64_t c = 0; c < t->cols; c++) {
            int64_t i = r * t->cols + c;
            ds[i] = p[i] != 0.0f ? (scale * p[i]) * (dp[i] - dsum[r]) : 0.0f;
        }
}

/* ---- attention variants (include/qkv/attention.h) ---- */

// P = sigma(scale S + bias) = 1 / (1 + exp(-(scale S + bias))) over kept keys, 0 elsewhere and below FLT_MIN
static void sigmoid_p(float *s, const qkv_attn_tile_ *t, float scale, float bias) {
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        for (int64_t c = 0; c < t->cols; c++) {
            float y = kept(mrow, len, c) ? srow[c] * scale + bias : -INFINITY;
            srow[c] = y < QKV_EXP_FLUSH_F32 ? 0.0f : 1.0f / (1.0f + expf(-y));
        }
    }
}

// dS = scale P (1 - P) dP, 0 where P = 0
static void sigmoid_ds(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, float *ds) {
    for (int64_t i = 0; i < t->rows * t->cols; i++)
        ds[i] = p[i] != 0.0f ? (scale * p[i]) * (1.0f - p[i]) * dp[i] : 0.0f;
}

// m' = max(m, max_c x);  e_c = exp(x - m') - exp(-m');  P = relu(e_c);  l' = exp(m - m') l + rowsum(|e_c|);
// O *= exp(m - m')
static void softpick_fwd_tile(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o,
                              int64_t ldo, int64_t d_v) {
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        float tmax = m[r];
        for (int64_t c = 0; c < len; c++) {
            if (!kept(mrow, len, c)) continue;
            float x = srow[c] * scale;
            if (x > tmax || isnan(x)) tmax = x; /* a kept NaN sticks */
        }
        float m_new = tmax, alpha = exp_flushed(m[r] - m_new), floor_e = exp_flushed(-m_new);
        float sum = 0.0f;
        for (int64_t c = 0; c < t->cols; c++) {
            float e = kept(mrow, len, c) ? exp_flushed(srow[c] * scale - m_new) - floor_e : 0.0f;
            srow[c] = e > 0.0f ? e : 0.0f;
            sum += fabsf(e);
        }
        if (isnan(m_new)) alpha = m_new;
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
        if (alpha != 1.0f)
            for (int64_t c = 0; c < d_v; c++) o[r * ldo + c] *= alpha;
    }
}

// E = exp(x - m) inv;  P = relu(E - exp(-m) inv);  e = sign(x) E
static void softpick_bwd_p(float *s, const qkv_attn_tile_ *t, float scale, const float *m, const float *inv,
                           float *e) {
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols, *erow = e + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        float floor_e = exp_flushed(-m[r]) * inv[r];
        for (int64_t c = 0; c < t->cols; c++) {
            float x = kept(mrow, len, c) ? srow[c] * scale : 0.0f;
            float big = x != 0.0f ? exp_flushed(x - m[r]) * inv[r] : 0.0f;
            srow[c] = x > 0.0f ? big - floor_e : 0.0f;
            erow[c] = x > 0.0f ? big : x < 0.0f ? -big : x; /* x NaN: NaN */
        }
    }
}

// dS = scale (e > 0 ? e (dP - D) : -e D)
static void softpick_ds(const float *e, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                        float *ds) {
    for (int64_t r = 0; r < t->rows; r++)
        for (int64_t c = 0; c < t->cols; c++) {
            int64_t i = r * t->cols + c;
            float ei = e[i];
            ds[i] = ei > 0.0f ? (scale * ei) * (dp[i] - dsum[r]) : ei != 0.0f ? (scale * -ei) * dsum[r] : 0.0f;
        }
}

const qkv_attn_kernel_set_ qkv_attn_kernels_portable_ = {
    .name = "portable",
    .available = true,
    .softmax_row = softmax_row,
    .fwd_tile = fwd_tile,
    .bwd_p = bwd_p,
    .bwd_ds = bwd_ds,
    .sigmoid_p = sigmoid_p,
    .sigmoid_ds = sigmoid_ds,
    .softpick_fwd_tile = softpick_fwd_tile,
    .softpick_bwd_p = softpick_bwd_p,
    .softpick_ds = softpick_ds,
};
