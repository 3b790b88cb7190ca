/*
 * attention_avx512.c — the f32 softmax and fused-attention row kernels on AVX-512F, 16 lanes, with SLEEF's
 * Sleef_expf16_u10avx512f (1-ulp exp; inline, expf_avx512.h). Compiled with -mavx512f; without SLEEF or the flag it compiles to
 * an entry point that reports itself unavailable. Shapes, the keep rule and the subnormal policy: attention_kernels.h.
 *
 * Every row is walked in vectors of 16 keys; a vector's kept lanes form a __mmask16 (below the row's
 * causal length, and with a nonzero mask byte), loads are masked (a dropped score is never read) and so
 * are the results (a dropped key gives exactly 0). Tails are the same masks.
 *
 * Short sequences (n_k <= 16, d_k and d_v <= 32, no mask): short_fwd / short_bwd take one batch element
 * whole, keys along the lanes: K^T and V^T are transposed once, and each query row is one vector of scores,
 * one exp, and a few FMAs per key and block of 16 columns; no GEMM call, no tile scratch. With 8 keys or
 * fewer two queries share a vector (fwd8_body, bwd8_body): 8-lane scores, one exp for the pair, and the sums
 * over keys as small GEMMs whose accumulators stay in registers. d_k, d_v <= 16, the common case, is
 * compiled apart with its column loops gone.
 */
#include "attention_kernels.h"

/* QKV_EMULATE_AVX512: the test-only build through SIMDe (tests/avx512_emulation.h), no -mavx512f */
#if (defined(__AVX512F__) || defined(QKV_EMULATE_AVX512)) && defined(QKV_HAVE_SLEEF)

#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <sleef.h>
#include <string.h>

#include "avx512_transpose.h"
#include "expf_avx512.h"

#define W 16

/* Lanes c .. c+15 of [0, n). */
static inline __mmask16 below(int64_t c, int64_t n) {
    int64_t left = n - c;
    return left >= W ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

/* Kept lanes c .. c+15 of a row: below len, and with a nonzero mask byte (bytes past len are not read). */
static inline __mmask16 keep_lanes(int64_t c, int64_t len, const uint8_t *mrow) {
    __mmask16 k = below(c, len);
    if (mrow && k) {
        __m128i bytes;
        if (len - c >= W) {
            bytes = _mm_loadu_si128((const __m128i *)(mrow + c));
        } else {
            uint8_t tmp[W] = {0};
            memcpy(tmp, mrow + c, (size_t)(len - c));
            bytes = _mm_loadu_si128((const __m128i *)tmp);
        }
        k &= _mm512_cmpneq_epi32_mask(_mm512_cvtepu8_epi32(bytes), _mm512_setzero_si512());
    }
    return k;
}

/* The sum of the 8 doubles of x in a fixed order, ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)) (the
 * order of GCC's _mm512_reduce_add_pd, spelled out so that half_sums_f64 can match it on every compiler). */
static inline double sum_pd(__m512d x) {
    __m256d a = _mm256_add_pd(_mm512_castpd512_pd256(x), _mm512_extractf64x4_pd(x, 1));
    __m128d b = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(b, _mm_unpackhi_pd(b, b)));
}

/* exp(x) on the lanes of k, 0 elsewhere and where x < QKV_EXP_FLUSH_F32 (NaN stays NaN). The argument is
 * clamped to the flush point before the call: SLEEF's exp is about 2x slower on lanes whose result is
 * subnormal, even ones thrown away. A vector with no lane left (saturated rows) skips the exp altogether. */
static inline __m512 exp_kept(__m512 x, __mmask16 k) {
    const __m512 flush = _mm512_set1_ps(QKV_EXP_FLUSH_F32);
    k &= _mm512_cmp_ps_mask(x, flush, _CMP_NLT_UQ);
    if (!k) return _mm512_setzero_ps();
    return _mm512_maskz_mov_ps(k, qkv_expf16_avx512_(_mm512_max_ps(flush, x))); /* max keeps a NaN x */
}

static inline float exp_flushed(float x) { return x < QKV_EXP_FLUSH_F32 ? 0.0f : expf(x); }

// a[j] = exp(s[j] - m) / sum_{kept l} exp(s[l] - m),  m = max_{kept l} s[l];  0 where dropped
static void softmax_row(const float *s, float *a, int64_t n, const uint8_t *mrow, int64_t len) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    bool any = false;
    for (int64_t c = 0; c < len; c += W) {
        __mmask16 k = keep_lanes(c, len, mrow);
        any |= k != 0;
        vmax = _mm512_mask_max_ps(vmax, k, vmax, _mm512_maskz_loadu_ps(k, s + c));
    }
    if (!any) {
        for (int64_t c = 0; c < n; c += W) _mm512_mask_storeu_ps(a + c, below(c, n), _mm512_setzero_ps());
        return;
    }
    __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512d total_lo = _mm512_setzero_pd(), total_hi = _mm512_setzero_pd();
    if (n <= W) { /* one vector: P stays in its register (reading back a masked store stalls) */
        __mmask16 k = keep_lanes(0, len, mrow), t = below(0, n);
        __m512 p = exp_kept(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s), vm), k);
        total_lo = _mm512_cvtps_pd(_mm512_castps512_ps256(p));
        total_hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1)));
        float total = (float)sum_pd(_mm512_add_pd(total_lo, total_hi));
        // a = p / total, exactly 0 where that would be subnormal
        __mmask16 normal = _mm512_cmp_ps_mask(p, _mm512_set1_ps(FLT_MIN * total), _CMP_NLT_UQ) & t;
        _mm512_mask_storeu_ps(a, t, _mm512_maskz_div_ps(normal, p, _mm512_set1_ps(total)));
        return;
    }
    for (int64_t c = 0; c < n; c += W) {
        __mmask16 k = keep_lanes(c, len, mrow);
        __m512 p = exp_kept(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + c), vm), k);
        _mm512_mask_storeu_ps(a + c, below(c, n), p);
        total_lo = _mm512_add_pd(total_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
        __m256 p_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
        total_hi = _mm512_add_pd(total_hi, _mm512_cvtps_pd(p_hi));
    }
    float total = (float)sum_pd(_mm512_add_pd(total_lo, total_hi));
    __m512 vt = _mm512_set1_ps(total), vmin = _mm512_set1_ps(FLT_MIN * total);
    for (int64_t c = 0; c < n; c += W) { /* a = p / total, exactly 0 where that would be subnormal */
        __mmask16 t = below(c, n);
        __m512 p = _mm512_maskz_loadu_ps(t, a + c);
        __mmask16 normal = _mm512_cmp_ps_mask(p, vmin, _CMP_NLT_UQ) & t;
        _mm512_mask_storeu_ps(a + c, t, _mm512_maskz_div_ps(normal, p, vt));
    }
}

// m' = max(m, max_c scale S[r,c]);  P = exp(scale S - m');  l' = exp(m - m') l + rowsum(P);  O *= exp(m - m')
static void fwd_tile(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o, int64_t ldo,
                     int64_t d_v) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        __mmask16 nan = 0; /* max_ps drops NaNs; a kept NaN score must make the row NaN */
        for (int64_t c = 0; c < len; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) & k;
            vmax = _mm512_mask_max_ps(vmax, k, vmax, x);
        }
        float tmax = nan ? NAN : _mm512_reduce_max_ps(vmax);
        if (tmax == -INFINITY) { /* nothing kept in this tile (or only -inf scores): P = 0, no change */
            for (int64_t c = 0; c < t->cols; c += W)
                _mm512_mask_storeu_ps(srow + c, below(c, t->cols), _mm512_setzero_ps());
            continue;
        }
        float m_new = isnan(tmax) ? tmax : fmaxf(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        float alpha = m[r] == -INFINITY ? 0.0f : exp_flushed(m[r] - m_new);
        __m512 vm = _mm512_set1_ps(m_new), vsum = _mm512_setzero_ps();
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale);
            __m512 p = exp_kept(_mm512_sub_ps(x, vm), k);
            _mm512_mask_storeu_ps(srow + c, below(c, t->cols), p);
            vsum = _mm512_add_ps(vsum, p);
        }
        l[r] = l[r] * alpha + _mm512_reduce_add_ps(vsum);
        m[r] = m_new;
        if (alpha != 1.0f) {
            __m512 va = _mm512_set1_ps(alpha);
            float *orow = o + r * ldo;
            for (int64_t c = 0; c < d_v; c += W) {
                __mmask16 tl = below(c, d_v);
                _mm512_mask_storeu_ps(orow + c, tl, _mm512_mul_ps(_mm512_maskz_loadu_ps(tl, orow + c), va));
            }
        }
    }
}

// P = exp(scale S - lse) over kept keys, 0 elsewhere
static void bwd_p(float *s, const qkv_attn_tile_ *t, float scale, const float *lse) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = lse[r] == -INFINITY ? 0 : qkv_tile_row_len_(t, r);
        __m512 vl = _mm512_set1_ps(lse[r]);
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale);
            _mm512_mask_storeu_ps(srow + c, below(c, t->cols), exp_kept(_mm512_sub_ps(x, vl), k));
        }
    }
}

// dS = scale * P * (dP - dsum), 0 where P = 0
static void bwd_ds(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                   float *ds) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        __m512 vd = _mm512_set1_ps(dsum[r]);
        int64_t row = r * t->cols;
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 tl = below(c, t->cols);
            __m512 vp = _mm512_maskz_loadu_ps(tl, p + row + c);
            __mmask16 nz = _mm512_cmp_ps_mask(vp, _mm512_setzero_ps(), _CMP_NEQ_UQ) & tl;
            __m512 vdp = _mm512_maskz_loadu_ps(nz, dp + row + c);
            __m512 v = _mm512_maskz_mul_ps(nz, _mm512_mul_ps(vscale, vp), _mm512_sub_ps(vdp, vd));
            _mm512_mask_storeu_ps(ds + row + c, tl, v);
        }
    }
}

/* ---- short sequences: one batch element, keys along the 16 lanes -------------------------------- */

/* The widest d_k and d_v of the short path: rows of up to DMAX floats, DMAX / W vectors each. Measured,
 * forward + backward, short against tiled: B 32, n 8: d 16 22 vs 39 us, d 32 41 vs 53 us, d 64 78 vs 85 us;
 * B 4, n 16, d 64: 24 vs 23 us. Past 32 the tiles' GEMMs catch up, so the short path stops there. */
#define DMAX 32

/* t[l] lane c = x[c*d + l] for c < n, l < d (lanes past n 0; vectors past d unset, never read): x [n, d]
 * transposed, n <= 16, d <= DMAX, one 16 x 16 block of columns at a time */
static inline void transposed(const float *x, int64_t n, int64_t d, __m512 t[DMAX]) {
    for (int64_t j0 = 0; j0 < d; j0 += W) {
        __mmask16 cols = below(j0, d);
        for (int c = 0; c < W; c++) /* rows past n: a load under an empty mask, zeros (no memset, no branch) */
            t[j0 + c] = _mm512_maskz_loadu_ps(c < n ? cols : 0, x + (c < n ? c : 0) * d + j0);
        qkv_transpose16_avx512_(t + j0);
    }
}

// s[c] = a . x_c for every key c at once: d FMAs against X^T, in four independent chains (one chain of 16
// dependent FMAs would wait out each one's latency)
static inline __m512 dot_keys(const float *a, const __m512 xt[DMAX], int64_t d) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t l = 0;
    for (; l + 4 <= d; l += 4) {
        s0 = _mm512_fmadd_ps(_mm512_set1_ps(a[l]), xt[l], s0);
        s1 = _mm512_fmadd_ps(_mm512_set1_ps(a[l + 1]), xt[l + 1], s1);
        s2 = _mm512_fmadd_ps(_mm512_set1_ps(a[l + 2]), xt[l + 2], s2);
        s3 = _mm512_fmadd_ps(_mm512_set1_ps(a[l + 3]), xt[l + 3], s3);
    }
    for (; l < d; l++) s0 = _mm512_fmadd_ps(_mm512_set1_ps(a[l]), xt[l], s0);
    return _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
}

/* Lane c of x in every lane. */
static inline __m512 lane(__m512 x, int64_t c) { return _mm512_permutexvar_ps(_mm512_set1_epi32((int)c), x); }

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Lanes 0-7 of a, then lanes 0-7 of b. */
static inline __m512 pair(__m512 a, __m512 b) { return _mm512_shuffle_f32x4(a, b, 0x44); }
/* Lanes 8-15 of x, moved to lanes 0-7. */
static inline __m512 upper(__m512 x) { return _mm512_shuffle_f32x4(x, x, 0xEE); }

/* The max (add: the sum) of each 8-lane half of x, in every lane of that half. */
static inline __m512 half_reduce(__m512 x, bool add) {
    __m512 t = _mm512_permute_ps(x, 0xB1); /* neighbours swapped */
    x = add ? _mm512_add_ps(x, t) : _mm512_max_ps(x, t);
    t = _mm512_permute_ps(x, 0x4E); /* pairs swapped within 128 bits */
    x = add ? _mm512_add_ps(x, t) : _mm512_max_ps(x, t);
    t = _mm512_shuffle_f32x4(x, x, 0xB1); /* 128-bit blocks swapped within each half */
    return add ? _mm512_add_ps(x, t) : _mm512_max_ps(x, t);
}

static inline __m256 low8(__m512 x) { return _mm512_castps512_ps256(x); }
static inline __m256 high8(__m512 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }
/* a in lanes 0-7, b in lanes 8-15 */
static inline __m512 join8(__m256 a, __m256 b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b), 1));
}

/* Row stores and loads of d floats (16 when d > 16; none when d <= 0): whole 256- or 512-bit ones when d is 8 or 16,
 * else masked. A masked store that a later masked load overlaps is not forwarded and stalls that load
 * (about 25 cycles, measured on Zen 4), and rows of 8 floats share a 64-byte line. */
static inline void store_row(float *row, __m512 x, int64_t d) {
    if (d >= W) _mm512_storeu_ps(row, x);
    else if (d == W / 2) _mm256_storeu_ps(row, low8(x));
    else _mm512_mask_storeu_ps(row, below(0, d), x);
}
static inline __m512 load_row(const float *row, int64_t d) {
    if (d >= W) return _mm512_loadu_ps(row);
    if (d == W / 2) return _mm512_zextps256_ps512(_mm256_loadu_ps(row));
    return _mm512_maskz_loadu_ps(below(0, d), row);
}
/* row[0 .. d) += x */
static inline void add_row(float *row, __m512 x, int64_t d) { store_row(row, _mm512_add_ps(load_row(row, d), x), d); }

// O_r = P V / l and, if a is not NULL, A_r = P / l   (P of query r in lanes 0 .. n_k-1; m = -inf: nothing
// kept, O_r = A_r = 0, as the tiled path)
static inline __attribute__((always_inline)) void fwd_row_out(int64_t r, __m512 p, float m, float l, const float *v,
                                                              float *out, float *a, int64_t n_k, int64_t d_v,
                                                              bool causal, const int64_t nb_v) {
    float *o_r = out + r * d_v;
    if (a) store_row(a + r * n_k, m == -INFINITY ? p : _mm512_div_ps(p, _mm512_set1_ps(l)), n_k);
    if (m == -INFINITY) {
        for (int64_t b = 0; b < nb_v; b++) store_row(o_r + b * W, _mm512_setzero_ps(), d_v - b * W);
        return;
    }
    int64_t n_kept = causal ? min64(n_k, r + 1) : n_k;
    for (int64_t b = 0; b < nb_v; b++) { /* 16 columns of O at a time */
        int64_t j0 = b * W;
        __mmask16 cols = below(j0, d_v);
        const float *v_j = v + j0;
        int64_t c = 0;
        __m512 o0 = _mm512_setzero_ps(), o1 = o0; /* two chains of FMAs, even and odd keys */
        for (; c + 2 <= n_kept; c += 2) { // O_r += P[c] V_c
            o0 = _mm512_fmadd_ps(lane(p, c), _mm512_maskz_loadu_ps(cols, v_j + c * d_v), o0);
            o1 = _mm512_fmadd_ps(lane(p, c + 1), _mm512_maskz_loadu_ps(cols, v_j + (c + 1) * d_v), o1);
        }
        if (c < n_kept) o0 = _mm512_fmadd_ps(lane(p, c), _mm512_maskz_loadu_ps(cols, v_j + c * d_v), o0);
        store_row(o_r + j0, _mm512_div_ps(_mm512_add_ps(o0, o1), _mm512_set1_ps(l)), d_v - j0);
    }
}

// per query r:  x = s q_r K^T,  m = max kept x,  P = exp(x - m),  l = rowsum(P),  O_r = P V / l
static inline __attribute__((always_inline)) void short_fwd_body(const float *q, const float *k, const float *v,
                                                                 float *out, float *a, int64_t n_q,
                                                                 int64_t n_k, int64_t d_k, int64_t d_v, float scale,
                                                                 bool causal, const int64_t nb_v) {
    __m512 kt[DMAX];
    transposed(k, n_k, d_k, kt); // K^T [d_k, n_k]
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < n_q; r++) {
        __mmask16 kept = below(0, causal ? min64(n_k, r + 1) : n_k);
        __m512 x = _mm512_mul_ps(dot_keys(q + r * d_k, kt, d_k), vscale);
        __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) & kept; /* a kept NaN makes the row NaN */
        float m = nan ? NAN : _mm512_mask_reduce_max_ps(kept, x);
        __m512 p = m == -INFINITY ? _mm512_setzero_ps() : exp_kept(_mm512_sub_ps(x, _mm512_set1_ps(m)), kept);
        fwd_row_out(r, p, m, _mm512_reduce_add_ps(p), v, out, a, n_k, d_v, causal, nb_v);
    }
}

// query r's sums, its A and dS in lanes 0 .. n_k-1:  dV_c += A[c] dO_r,  dK_c += dS[c] q_r,  dQ_r += sum_c dS[c] k_c
// (rows of d_k and d_v in nb_k and nb_v blocks of 16 columns; key c's block b at acc[c * nb + b])
#define DB (DMAX / W)
static inline __attribute__((always_inline)) void bwd_row_sums(int64_t r, __m512 p, __m512 ds, const float *q,
                                                               const float *k, const float *dout, float *dq,
                                                               __m512 *dk_acc, __m512 *dv_acc, int64_t n_k,
                                                               int64_t d_k, int64_t d_v, bool causal,
                                                               const int64_t nb_k, const int64_t nb_v) {
    int64_t n_kept = causal ? min64(n_k, r + 1) : n_k;
    for (int64_t b = 0; b < nb_v; b++) { // dV_c += A[c] dO_r
        __m512 do_r = _mm512_maskz_loadu_ps(below(b * W, d_v), dout + r * d_v + b * W);
        for (int64_t c = 0; c < n_kept; c++)
            dv_acc[c * nb_v + b] = _mm512_fmadd_ps(lane(p, c), do_r, dv_acc[c * nb_v + b]);
    }
    for (int64_t b = 0; b < nb_k; b++) { // dK_c += dS[c] q_r,  dQ_r += sum_c dS[c] k_c
        __mmask16 cols = below(b * W, d_k);
        __m512 q_r = _mm512_maskz_loadu_ps(cols, q + r * d_k + b * W), dq_r = _mm512_setzero_ps();
        for (int64_t c = 0; c < n_kept; c++) {
            __m512 ds_c = lane(ds, c);
            dk_acc[c * nb_k + b] = _mm512_fmadd_ps(ds_c, q_r, dk_acc[c * nb_k + b]);
            dq_r = _mm512_fmadd_ps(ds_c, _mm512_maskz_loadu_ps(cols, k + c * d_k + b * W), dq_r);
        }
        if (dq) add_row(dq + r * d_k + b * W, dq_r, d_k - b * W);
    }
}

/* Lanes 8-15 of x as 8 doubles. */
static inline __m512d high_as_f64(__m512 x) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
}

/* D = rowsum(dO_r * O_r) over the d_v lanes of vrow in double, as the tiled path's D (exact products; the
 * tiled path adds them in order, this in a tree), rounded to float. */
static inline __attribute__((always_inline)) float row_dot(const float *dout_r, const float *out_r, int64_t d_v,
                                                           const int64_t nb_v) {
    __m512d sum = _mm512_setzero_pd();
    for (int64_t b = 0; b < nb_v; b++) {
        int64_t j0 = b * W;
        __mmask16 cols = below(j0, d_v);
        __m512 x = _mm512_maskz_loadu_ps(cols, dout_r + j0), y = _mm512_maskz_loadu_ps(cols, out_r + j0);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x)), hi = high_as_f64(x);
        lo = _mm512_mul_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(y)));
        hi = _mm512_mul_pd(hi, high_as_f64(y));
        sum = _mm512_add_pd(sum, _mm512_add_pd(lo, hi));
    }
    return (float)_mm512_reduce_add_pd(sum);
}

// per query r, from the forward's A:  D = rowsum(dO_r * O_r),  dS = s A_r (dO_r V^T - D) (0 where A = 0),
// dK_c += dS[c] q_r,  dQ_r += sum_c dS[c] k_c
static inline __attribute__((always_inline)) void short_bwd_body(const float *q, const float *k, const float *v,
                                                                 const float *out, const float *dout, const float *a,
                                                                 float *dq, float *dk, float *dv, int64_t n_q,
                                                                 int64_t n_k, int64_t d_k, int64_t d_v, float scale,
                                                                 bool causal, const int64_t nb_k, const int64_t nb_v) {
    __m512 vt[DMAX], dk_acc[W * DB], dv_acc[W * DB];
    transposed(v, n_k, d_v, vt); // V^T [d_v, n_k]
    for (int64_t i = 0; i < n_k * nb_k; i++) dk_acc[i] = _mm512_setzero_ps(); /* keys c < n_k only */
    for (int64_t i = 0; i < n_k * nb_v; i++) dv_acc[i] = _mm512_setzero_ps();
    const __m512 vscale = _mm512_set1_ps(scale);
    const __mmask16 keys = below(0, n_k);
    /* Queries go in blocks of 16: first dS of the whole block (independent per vector), then the sums. */
    for (int64_t r0 = 0; r0 < n_q; r0 += W) {
        int64_t r_end = min64(n_q, r0 + W);
        __m512 pb[W], dsb[W]; /* vector i: A and dS of query r0 + i */
        for (int64_t r = r0, i = 0; r < r_end; r++, i++) {
            __m512 p = _mm512_maskz_loadu_ps(keys, a + r * n_k), dp = dot_keys(dout + r * d_v, vt, d_v);
            __m512 d = _mm512_set1_ps(row_dot(dout + r * d_v, out + r * d_v, d_v, nb_v)); // D = rowsum(dO * O)
            // dS = s A (dP - D), 0 where A = 0 (dropped keys, queries with no key)
            __mmask16 nz = _mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_UQ);
            pb[i] = p;
            dsb[i] = _mm512_maskz_mul_ps(nz, _mm512_mul_ps(vscale, p), _mm512_sub_ps(dp, d));
        }
        for (int64_t r = r0, i = 0; r < r_end; r++, i++)
            bwd_row_sums(r, pb[i], dsb[i], q, k, dout, dq, dk_acc, dv_acc, n_k, d_k, d_v, causal, nb_k, nb_v);
    }
    for (int64_t c = 0; c < n_k; c++) { // dK_c += sum_r dS[r,c] q_r,  dV_c += sum_r A[r,c] dO_r
        for (int64_t b = 0; dk && b < nb_k; b++) add_row(dk + c * d_k + b * W, dk_acc[c * nb_k + b], d_k - b * W);
        for (int64_t b = 0; dv && b < nb_v; b++) add_row(dv + c * d_v + b * W, dv_acc[c * nb_v + b], d_v - b * W);
    }
}

/* ---- 8 keys or fewer: two queries a vector ------------------------------------------------------- *
 * Query r in lanes 0-7 and r+1 in lanes 8-15: one exp, one max and one sum serve both. The scores are
 * 8-lane dot products against K^T (two 256-bit FMAs a cycle where a 512-bit one would leave half its
 * lanes empty); the sums over keys are small GEMMs with their accumulators in registers and A and dS
 * broadcast from memory, no lane permutes. nb_k, nb_v: blocks of 16 columns of d_k and d_v (1 or 2). */

/* t[l] = column l of x [n, d] in 8 lanes (lane c = x[c*d + l], 0 for c >= n), n <= 8, l < dmax (a constant,
 * d <= dmax <= DMAX; columns past d zero): 16 columns at a time, by unpacks and 128-bit block shuffles. */
static inline __attribute__((always_inline)) void transposed8(const float *x, int64_t n, int64_t d, __m256 t[DMAX],
                                                              const int64_t dmax) {
    for (int64_t j0 = 0; j0 < dmax; j0 += W) {
        __mmask16 cols = below(j0, d);
        __m512 r[8], t2[8], u[8];
        for (int c = 0; c < 8; c++) /* rows past n: a load under an empty mask, zeros */
            r[c] = _mm512_maskz_loadu_ps(c < n ? cols : 0, x + (c < n ? c : 0) * d + j0);
        for (int c = 0; c < 8; c += 2) { /* 128-bit block b: rows c, c+1 interleaved, columns 4b, 4b+1 | 4b+2, 4b+3 */
            t2[c] = _mm512_unpacklo_ps(r[c], r[c + 1]);
            t2[c + 1] = _mm512_unpackhi_ps(r[c], r[c + 1]);
        }
        for (int h = 0; h < 2; h++) { /* u[4h + i], block b: column 4b + i of rows 4h .. 4h+3 */
            u[4 * h] = _mm512_shuffle_ps(t2[4 * h], t2[4 * h + 2], 0x44);
            u[4 * h + 1] = _mm512_shuffle_ps(t2[4 * h], t2[4 * h + 2], 0xEE);
            u[4 * h + 2] = _mm512_shuffle_ps(t2[4 * h + 1], t2[4 * h + 3], 0x44);
            u[4 * h + 3] = _mm512_shuffle_ps(t2[4 * h + 1], t2[4 * h + 3], 0xEE);
        }
        for (int i = 0; i < 4; i++) { /* blocks (b of rows 0-3, b of rows 4-7): columns i, 4+i, 8+i, 12+i whole */
            __m512 lo = _mm512_shuffle_f32x4(u[i], u[i + 4], 0x44), hi = _mm512_shuffle_f32x4(u[i], u[i + 4], 0xEE);
            lo = _mm512_shuffle_f32x4(lo, lo, 0xD8);
            hi = _mm512_shuffle_f32x4(hi, hi, 0xD8);
            t[j0 + i] = low8(lo), t[j0 + 4 + i] = high8(lo), t[j0 + 8 + i] = low8(hi), t[j0 + 12 + i] = high8(hi);
        }
    }
}

// s[c] = a . x_c for the 8 keys at once: d FMAs against X^T in four chains (dmax: d's bound, a constant)
static inline __attribute__((always_inline)) __m256 dot8(const float *a, const __m256 xt[DMAX], int64_t d,
                                                         const int64_t dmax) {
    __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
#pragma GCC unroll 32
    for (int64_t l = 0; l < dmax; l++)
        if (l < d) s[l % 4] = _mm256_fmadd_ps(_mm256_set1_ps(a[l]), xt[l], s[l % 4]);
    return _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
}

/* Lanes of the query pair (r, r+1) that are kept: keys below n_k, and below r+1 (r+2) when causal. */
static inline __mmask16 kept_pair(int64_t r, bool two, int64_t n_k, bool causal) {
    __mmask16 lo = below(0, causal ? min64(n_k, r + 1) : n_k);
    __mmask16 hi = two ? below(0, causal ? min64(n_k, r + 2) : n_k) : 0;
    return (__mmask16)(lo | hi << W / 2);
}

// per query pair:  x = s q K^T,  m = max kept x,  P = exp(x - m),  l = rowsum(P),  A = P / l,  O = P V / l
static inline __attribute__((always_inline)) void fwd8_body(const float *q, const float *k, const float *v,
                                                            float *out, float *a, int64_t n_q,
                                                            int64_t n_k, int64_t d_k, int64_t d_v, float scale,
                                                            bool causal, const int64_t nb_k, const int64_t nb_v) {
    __m256 kt[DMAX];
    transposed8(k, n_k, d_k, kt, W * nb_k); // K^T [d_k, n_k]
    __m512 vr[W / 2][DB];         // V's rows, 16 columns a block, zero past n_k
    for (int64_t c = 0; c < W / 2; c++)
        for (int64_t b = 0; b < nb_v; b++)
            vr[c][b] = _mm512_maskz_loadu_ps(c < n_k ? below(b * W, d_v) : 0, v + (c < n_k ? c : 0) * d_v + b * W);
    const __m512 vscale = _mm512_set1_ps(scale), neg_inf = _mm512_set1_ps(-INFINITY), one = _mm512_set1_ps(1.0f);
    const __mmask16 key_row = below(0, n_k);
    /* Queries in blocks of 16, pairs (r0 + 2i, r0 + 2i + 1) in vector i, each step for every pair of the block
     * before the next step (independent chains for the out-of-order core to overlap) */
    for (int64_t r0 = 0; r0 < n_q; r0 += W) {
        int64_t r_end = min64(n_q, r0 + W), n_pairs = (r_end - r0 + 1) / 2;
        __m512 x[W / 2], p[W / 2], m[W / 2];
        __mmask16 kept[W / 2] = {0}, empty[W / 2] = {0};
        for (int64_t i = 0; i < W / 2; i++) x[i] = p[i] = m[i] = _mm512_setzero_ps(); /* past n_pairs: unread */
#pragma GCC unroll 8
        for (int64_t i = 0; i < W / 2; i++) { // x = s q K^T
            if (i >= n_pairs) continue; /* not break: a loop with an exit is not unrolled by clang */
            int64_t r = r0 + 2 * i;
            bool two = r + 1 < r_end;
            __m256 s1 = two ? dot8(q + (r + 1) * d_k, kt, d_k, W * nb_k) : _mm256_setzero_ps();
            x[i] = _mm512_mul_ps(join8(dot8(q + r * d_k, kt, d_k, W * nb_k), s1), vscale);
            kept[i] = kept_pair(r, two, n_k, causal);
        }
#pragma GCC unroll 8
        for (int64_t i = 0; i < W / 2; i++) { // m = max over each half's kept lanes, P = exp(x - m)
            if (i >= n_pairs) continue;
            __mmask16 nan = _mm512_cmp_ps_mask(x[i], x[i], _CMP_UNORD_Q) & kept[i];
            __m512 mi = half_reduce(_mm512_mask_mov_ps(neg_inf, kept[i] & ~nan, x[i]), false);
            empty[i] = _mm512_cmp_ps_mask(mi, neg_inf, _CMP_EQ_OQ);
            if (!(nan | empty[i])) { /* the common case, a finite max in each half: no fix-up on the way to exp */
                m[i] = mi;
                p[i] = exp_kept(_mm512_sub_ps(x[i], mi), kept[i]);
                continue;
            }
            // a half with a kept NaN gets m = NaN (its whole row NaN)
            m[i] = _mm512_mask_mov_ps(mi, (__mmask16)((nan & 0x00FF ? 0x00FF : 0) | (nan & 0xFF00 ? 0xFF00 : 0)),
                                      _mm512_set1_ps(NAN));
            // a half with nothing kept (m = -inf) gets P = 0 and l = 1: O = A = 0
            empty[i] = _mm512_cmp_ps_mask(m[i], neg_inf, _CMP_EQ_OQ);
            p[i] = exp_kept(_mm512_sub_ps(x[i], _mm512_mask_mov_ps(m[i], empty[i], _mm512_setzero_ps())),
                            kept[i] & ~empty[i]);
        }
        float pm[W * W / 2], il[W * W / 2]; /* P and 1/l of query r0 + j at 8j (1/l in every lane of its half) */
#pragma GCC unroll 8
        for (int64_t i = 0; i < W / 2; i++) { // l = rowsum(P),  A = P / l
            if (i >= n_pairs) continue;
            int64_t r = r0 + 2 * i;
            bool two = r + 1 < r_end;
            __m512 l = _mm512_mask_mov_ps(half_reduce(p[i], true), empty[i], one);
            __m512 inv_l = _mm512_div_ps(one, l);
            _mm512_storeu_ps(pm + W * i, p[i]);
            _mm512_storeu_ps(il + W * i, inv_l);
            __m512 ar = _mm512_mul_ps(p[i], inv_l);
            if (a && n_k == W / 2 && two) {
                _mm512_storeu_ps(a + r * n_k, ar); /* the two rows are adjacent */
            } else if (a) {
                _mm512_mask_storeu_ps(a + r * n_k, key_row, ar);
                if (two) _mm512_mask_storeu_ps(a + (r + 1) * n_k, key_row, upper(ar));
            }
        }
        for (int64_t r = r0; r < r_end; r++) { // O_r = sum_{kept c} P[r,c] V_c / l_r
            int64_t j = r - r0;
            bool none = empty[j / 2] >> (W / 2 * (j % 2)) & 1;
            int64_t n_kept = none ? 0 : causal ? min64(n_k, r + 1) : n_k; /* a dropped key: nothing, not 0 * inf */
            const float *p_r = pm + W / 2 * j;
            for (int64_t b = 0; b < nb_v; b++) {
                __m512 o0 = _mm512_setzero_ps(), o1 = o0;
#pragma GCC unroll 8
                for (int64_t c = 0; c < W / 2; c += 2) {
                    if (c < n_kept) o0 = _mm512_fmadd_ps(_mm512_set1_ps(p_r[c]), vr[c][b], o0);
                    if (c + 1 < n_kept) o1 = _mm512_fmadd_ps(_mm512_set1_ps(p_r[c + 1]), vr[c + 1][b], o1);
                }
                store_row(out + r * d_v + b * W, _mm512_mul_ps(_mm512_add_ps(o0, o1), _mm512_set1_ps(il[W / 2 * j])),
                          d_v - b * W);
            }
        }
    }
}

/* D = rowsum(dO_r * O_r) of query r, folded: lanes 0-7 hold the partial sums over columns j and j + 8 of
 * every block (the caller pairs two queries and finishes with half_reduce). In f32, where the wider rows'
 * row_dot sums in double: for two queries a vector that stays one vector, and test_fused holds both paths
 * to the same accuracy against f64. */
static inline __attribute__((always_inline)) __m512 row_products8(const float *dout_r, const float *out_r,
                                                                  int64_t d_v, const int64_t nb_v) {
    __m512 sum = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb_v; b++) {
        __mmask16 cols = below(b * W, d_v);
        __m512 x = _mm512_maskz_loadu_ps(cols, dout_r + b * W), y = _mm512_maskz_loadu_ps(cols, out_r + b * W);
        sum = _mm512_fmadd_ps(x, y, sum);
    }
    return _mm512_add_ps(sum, upper(sum));
}

/* The sums of queries r0 .. r_end-1 when d_k, d_v <= 16 (a row in one vector): the 16 running dK and dV
 * sums of the 8 keys held in named registers over the block (from and back to acc_k, acc_v), A and dS
 * broadcast from pm, dsm (query r0 + j's at 8j), K's rows read where they lie. Arrays of vectors indexed
 * in loops would be kept on the stack, each FMA a load and a store. */
#define KEY_SUMS(c, dq_chain)                                                                              \
    if (c < n_kept) {                                                                                      \
        __m512 ds_c = _mm512_set1_ps(ds_r[c]);                                                             \
        dv##c = _mm512_fmadd_ps(_mm512_set1_ps(p_r[c]), do_r, dv##c);                 /* dV_c += A dO_r */ \
        dk##c = _mm512_fmadd_ps(ds_c, q_r, dk##c);                                    /* dK_c += dS q_r */ \
        dq_chain = _mm512_fmadd_ps(ds_c, _mm512_maskz_loadu_ps(cols_k, k + c * d_k), dq_chain); /* dQ_r */ \
    }
static inline __attribute__((always_inline)) void bwd8_sums16(int64_t r0, int64_t r_end, const float *pm,
                                                              const float *dsm, const float *q, const float *k,
                                                              const float *dout, float *dq, __m512 acc_k[W / 2],
                                                              __m512 acc_v[W / 2], int64_t n_k, int64_t d_k,
                                                              int64_t d_v, bool causal) {
    const __mmask16 cols_k = below(0, d_k), cols_v = below(0, d_v);
    __m512 dk0 = acc_k[0], dk1 = acc_k[1], dk2 = acc_k[2], dk3 = acc_k[3], dk4 = acc_k[4], dk5 = acc_k[5],
           dk6 = acc_k[6], dk7 = acc_k[7];
    __m512 dv0 = acc_v[0], dv1 = acc_v[1], dv2 = acc_v[2], dv3 = acc_v[3], dv4 = acc_v[4], dv5 = acc_v[5],
           dv6 = acc_v[6], dv7 = acc_v[7];
    for (int64_t r = r0; r < r_end; r++) {
        const float *p_r = pm + W / 2 * (r - r0), *ds_r = dsm + W / 2 * (r - r0);
        int64_t n_kept = causal ? min64(n_k, r + 1) : n_k; /* a dropped key gets nothing, not 0 * inf */
        __m512 do_r = _mm512_maskz_loadu_ps(cols_v, dout + r * d_v), q_r = _mm512_maskz_loadu_ps(cols_k, q + r * d_k);
        __m512 dq0 = _mm512_setzero_ps(), dq1 = dq0; /* even and odd keys */
        KEY_SUMS(0, dq0) KEY_SUMS(1, dq1) KEY_SUMS(2, dq0) KEY_SUMS(3, dq1)
        KEY_SUMS(4, dq0) KEY_SUMS(5, dq1) KEY_SUMS(6, dq0) KEY_SUMS(7, dq1)
        if (dq) add_row(dq + r * d_k, _mm512_add_ps(dq0, dq1), d_k);
    }
    acc_k[0] = dk0, acc_k[1] = dk1, acc_k[2] = dk2, acc_k[3] = dk3, acc_k[4] = dk4, acc_k[5] = dk5, acc_k[6] = dk6,
    acc_k[7] = dk7;
    acc_v[0] = dv0, acc_v[1] = dv1, acc_v[2] = dv2, acc_v[3] = dv3, acc_v[4] = dv4, acc_v[5] = dv5, acc_v[6] = dv6,
    acc_v[7] = dv7;
}
#undef KEY_SUMS

// per query pair, from the forward's A:  dP = dO V^T,  D = rowsum(dO * O),  dS = s A (dP - D) (0 where A = 0);
// per query r and kept key c:  dV_c += A[r,c] dO_r,  dK_c += dS[r,c] q_r,  dQ_r += dS[r,c] k_c
static inline __attribute__((always_inline)) void bwd8_body(const float *q, const float *k, const float *v,
                                                            const float *out, const float *dout, const float *a,
                                                            float *dq, float *dk, float *dv, int64_t n_q,
                                                            int64_t n_k, int64_t d_k, int64_t d_v, float scale,
                                                            bool causal, const int64_t nb_k, const int64_t nb_v) {
    __m256 vt[DMAX];
    transposed8(v, n_k, d_v, vt, W * nb_v); // V^T [d_v, n_k]
    __m512 kr[W / 2][DB], dk8[W / 2][DB], dv8[W / 2][DB]; /* K's rows (zero past n_k); key c's sums */
    for (int64_t c = 0; c < W / 2; c++) {
        for (int64_t b = 0; b < nb_k; b++) {
            kr[c][b] = _mm512_maskz_loadu_ps(c < n_k ? below(b * W, d_k) : 0, k + (c < n_k ? c : 0) * d_k + b * W);
            dk8[c][b] = _mm512_setzero_ps();
        }
        for (int64_t b = 0; b < nb_v; b++) dv8[c][b] = _mm512_setzero_ps();
    }
    const __m512 vscale = _mm512_set1_ps(scale);
    const __mmask16 key_row = below(0, n_k);
    for (int64_t r0 = 0; r0 < n_q; r0 += W) {
        int64_t r_end = min64(n_q, r0 + W);
        float pm[W * W / 2], dsm[W * W / 2]; /* query r0 + j's A and dS at 8j */
        for (int64_t r = r0; r < r_end; r += 2) {
            bool two = r + 1 < r_end;
            __m512 p;
            if (n_k == W / 2 && two) {
                p = _mm512_loadu_ps(a + r * n_k); /* the two rows are adjacent */
            } else {
                p = _mm512_maskz_loadu_ps(key_row, a + r * n_k);
                if (two) p = pair(p, _mm512_maskz_loadu_ps(key_row, a + (r + 1) * n_k));
            }
            __m256 dp1 = two ? dot8(dout + (r + 1) * d_v, vt, d_v, W * nb_v) : _mm256_setzero_ps();
            __m512 dp = join8(dot8(dout + r * d_v, vt, d_v, W * nb_v), dp1);
            __m512 dsum = row_products8(dout + r * d_v, out + r * d_v, d_v, nb_v);
            if (two) dsum = pair(dsum, row_products8(dout + (r + 1) * d_v, out + (r + 1) * d_v, d_v, nb_v));
            dsum = half_reduce(dsum, true); // D of each query in its half
            // dS = s A (dP - D), 0 where A = 0 (dropped keys, queries with no key)
            __mmask16 nz = _mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_UQ);
            _mm512_storeu_ps(pm + W / 2 * (r - r0), p);
            __m512 ds = _mm512_maskz_mul_ps(nz, _mm512_mul_ps(vscale, p), _mm512_sub_ps(dp, dsum));
            _mm512_storeu_ps(dsm + W / 2 * (r - r0), ds);
        }
        if (nb_k == 1 && nb_v == 1) {
            __m512 acc_k[W / 2], acc_v[W / 2];
            for (int64_t c = 0; c < W / 2; c++) acc_k[c] = dk8[c][0], acc_v[c] = dv8[c][0];
            bwd8_sums16(r0, r_end, pm, dsm, q, k, dout, dq, acc_k, acc_v, n_k, d_k, d_v, causal);
            for (int64_t c = 0; c < W / 2; c++) dk8[c][0] = acc_k[c], dv8[c][0] = acc_v[c];
            continue;
        }
        for (int64_t r = r0; r < r_end; r++) {
            const float *p_r = pm + W / 2 * (r - r0), *ds_r = dsm + W / 2 * (r - r0);
            int64_t n_kept = causal ? min64(n_k, r + 1) : n_k; /* a dropped key gets nothing, not 0 * inf */
            __m512 do_r[DB], q_r[DB], dq0[DB], dq1[DB];
            for (int64_t b = 0; b < nb_v; b++)
                do_r[b] = _mm512_maskz_loadu_ps(below(b * W, d_v), dout + r * d_v + b * W);
            for (int64_t b = 0; b < nb_k; b++) {
                q_r[b] = _mm512_maskz_loadu_ps(below(b * W, d_k), q + r * d_k + b * W);
                dq0[b] = dq1[b] = _mm512_setzero_ps();
            }
#pragma GCC unroll 8
            for (int64_t c = 0; c < W / 2; c++) {
                if (c >= n_kept) continue;
                __m512 a_c = _mm512_set1_ps(p_r[c]), ds_c = _mm512_set1_ps(ds_r[c]);
                for (int64_t b = 0; b < nb_v; b++) dv8[c][b] = _mm512_fmadd_ps(a_c, do_r[b], dv8[c][b]);
                for (int64_t b = 0; b < nb_k; b++) {
                    dk8[c][b] = _mm512_fmadd_ps(ds_c, q_r[b], dk8[c][b]);
                    if (c % 2) dq1[b] = _mm512_fmadd_ps(ds_c, kr[c][b], dq1[b]);
                    else dq0[b] = _mm512_fmadd_ps(ds_c, kr[c][b], dq0[b]);
                }
            }
            for (int64_t b = 0; dq && b < nb_k; b++)
                add_row(dq + r * d_k + b * W, _mm512_add_ps(dq0[b], dq1[b]), d_k - b * W);
        }
    }
#pragma GCC unroll 8
    for (int64_t c = 0; c < W / 2; c++) {
        if (c >= n_k) continue;
        for (int64_t b = 0; dk && b < nb_k; b++) add_row(dk + c * d_k + b * W, dk8[c][b], d_k - b * W); // dK_c
        for (int64_t b = 0; dv && b < nb_v; b++) add_row(dv + c * d_v + b * W, dv8[c][b], d_v - b * W); // dV_c
    }
}

/* The forward: 8 keys or fewer two queries a vector, else one; d_k and d_v within one vector (the common
 * short case) compiled apart, their column loops gone */
static void short_fwd(const float *q, const float *k, const float *v, float *out, float *a, int64_t n_q,
                      int64_t n_k, int64_t d_k, int64_t d_v, float scale, bool causal) {
    if (n_k <= W / 2 && d_k <= W && d_v <= W) fwd8_body(q, k, v, out, a, n_q, n_k, d_k, d_v, scale, causal, 1, 1);
    else if (n_k <= W / 2) fwd8_body(q, k, v, out, a, n_q, n_k, d_k, d_v, scale, causal, DB, DB);
    else if (d_v <= W) short_fwd_body(q, k, v, out, a, n_q, n_k, d_k, d_v, scale, causal, 1);
    else short_fwd_body(q, k, v, out, a, n_q, n_k, d_k, d_v, scale, causal, (d_v + W - 1) / W);
}

/* d_k and d_v within one vector (the common short case) compiled apart, its column loops gone */
static void short_bwd(const float *q, const float *k, const float *v, const float *out, const float *dout,
                      const float *a, float *dq, float *dk, float *dv, int64_t n_q, int64_t n_k, int64_t d_k,
                      int64_t d_v, float scale, bool causal) {
    if (n_k <= W / 2 && d_k <= W && d_v <= W)
        bwd8_body(q, k, v, out, dout, a, dq, dk, dv, n_q, n_k, d_k, d_v, scale, causal, 1, 1);
    else if (n_k <= W / 2)
        bwd8_body(q, k, v, out, dout, a, dq, dk, dv, n_q, n_k, d_k, d_v, scale, causal, DB, DB);
    else if (d_k <= W && d_v <= W)
        short_bwd_body(q, k, v, out, dout, a, dq, dk, dv, n_q, n_k, d_k, d_v, scale, causal, 1, 1);
    else
        short_bwd_body(q, k, v, out, dout, a, dq, dk, dv, n_q, n_k, d_k, d_v, scale, causal, (d_k + W - 1) / W,
                       (d_v + W - 1) / W);
}

/* Each half's sum of x (two rows of up to 8 floats) in double, in the order of sum_pd, rounded to float and
 * spread over its half: the two rows' sums side by side in one vector at each step. */
static inline __m512 half_sums_f64(__m512 x) {
    __m512d lo = _mm512_cvtps_pd(low8(x)), hi = _mm512_cvtps_pd(high8(x));
    // a = [lo_j + lo_j+4 | hi_j + hi_j+4],  b: + the other 128-bit block of each half,  c: + the neighbour
    __m512d a = _mm512_add_pd(_mm512_shuffle_f64x2(lo, hi, 0x44), _mm512_shuffle_f64x2(lo, hi, 0xEE));
    __m512d b = _mm512_add_pd(a, _mm512_shuffle_f64x2(a, a, 0xB1));
    __m512d c = _mm512_add_pd(b, _mm512_permute_pd(b, 0x55));
    const __m512i spread = _mm512_set_epi32(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(_mm512_cvtpd_ps(c)));
}

// rows of 8 entries or fewer two at a time (r in lanes 0-7, r+1 in lanes 8-15: one exp), each as softmax_row;
// 8 pairs a block, each step for every pair before the next (independent chains for the core to overlap)
static void softmax_rows(const float *s, float *a, int64_t rows, int64_t n) {
    int64_t r = 0;
    if (n <= W / 2) {
        const __mmask16 row = below(0, n), kept = (__mmask16)(row | row << W / 2);
        const __m512 neg_inf = _mm512_set1_ps(-INFINITY), tiny = _mm512_set1_ps(FLT_MIN);
        while (r + 1 < rows) {
            int64_t n_pairs = min64(W / 2, (rows - r) / 2);
            __m512 p[W / 2];
#pragma GCC unroll 8
            for (int64_t i = 0; i < W / 2; i++) { // m = the max of each row (half), P = exp(x - m)
                p[i] = _mm512_setzero_ps();
                if (i >= n_pairs) continue;
                const float *s_r = s + (r + 2 * i) * n;
                /* rows of exactly 8: both at once, whole (see store_row) */
                __m512 x = n == W / 2 ? _mm512_loadu_ps(s_r)
                                      : pair(_mm512_maskz_loadu_ps(row, s_r), _mm512_maskz_loadu_ps(row, s_r + n));
                __m512 m = half_reduce(_mm512_mask_mov_ps(neg_inf, kept, x), false);
                p[i] = exp_kept(_mm512_sub_ps(x, m), kept);
            }
#pragma GCC unroll 8
            for (int64_t i = 0; i < W / 2; i++) { // a = p / total, exactly 0 where that would be subnormal
                if (i >= n_pairs) continue;
                __m512 total = half_sums_f64(p[i]);
                __mmask16 normal = _mm512_cmp_ps_mask(p[i], _mm512_mul_ps(tiny, total), _CMP_NLT_UQ) & kept;
                __m512 out = _mm512_maskz_div_ps(normal, p[i], total);
                float *a_r = a + (r + 2 * i) * n;
                if (n == W / 2) {
                    _mm512_storeu_ps(a_r, out);
                } else {
                    _mm512_mask_storeu_ps(a_r, row, out);
                    _mm512_mask_storeu_ps(a_r + n, row, upper(out));
                }
            }
            r += 2 * n_pairs;
        }
    }
    for (; r < rows; r++) softmax_row(s + r * n, a + r * n, n, NULL, n);
}

/* ---- attention variants (include/qkv/attention.h), the portable set's maths on 16 lanes --------------- */

// P = sigma(scale S + bias) = 1 / (1 + exp(-(scale S + bias))) over kept keys; 0 elsewhere and below FLT_MIN
static void sigmoid_p(float *s, const qkv_attn_tile_ *t, float scale, float bias) {
    const __m512 vscale = _mm512_set1_ps(scale), vb = _mm512_set1_ps(bias), one = _mm512_set1_ps(1.0f);
    const __m512 lo = _mm512_set1_ps(QKV_EXP_FLUSH_F32), hi = _mm512_set1_ps(-QKV_EXP_FLUSH_F32);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 y = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale), vb);
            k &= _mm512_cmp_ps_mask(y, lo, _CMP_NLT_UQ); /* NaN stays */
            __m512 p = _mm512_setzero_ps();
            if (k) { /* exp(-y), -y clamped to [flush, -flush]: never subnormal nor inf (min/max keep NaN) */
                __m512 e = qkv_expf16_avx512_(_mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_sub_ps(_mm512_setzero_ps(), y))));
                p = _mm512_maskz_div_ps(k, one, _mm512_add_ps(one, e));
            }
            _mm512_mask_storeu_ps(srow + c, below(c, t->cols), p);
        }
    }
}

// dS = scale P (1 - P) dP, 0 where P = 0
static void sigmoid_ds(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, float *ds) {
    const __m512 vscale = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
    int64_t n = t->rows * t->cols;
    for (int64_t c = 0; c < n; c += W) {
        __mmask16 tl = below(c, n);
        __m512 vp = _mm512_maskz_loadu_ps(tl, p + c);
        __mmask16 nz = tl & _mm512_cmp_ps_mask(vp, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        __m512 vdp = _mm512_maskz_loadu_ps(nz, dp + c);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(vscale, vp), _mm512_sub_ps(one, vp)), vdp);
        _mm512_mask_storeu_ps(ds + c, tl, _mm512_maskz_mov_ps(nz, v));
    }
}

// m' = max(m, max_c x);  e_c = exp(x - m') - exp(-m');  P = relu(e_c);  l' = exp(m - m') l + rowsum(|e_c|);
// O *= exp(m - m')
static void softpick_fwd_tile(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o,
                              int64_t ldo, int64_t d_v) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        __mmask16 nan = 0;
        for (int64_t c = 0; c < len; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) & k;
            vmax = _mm512_mask_max_ps(vmax, k, vmax, x);
        }
        float tmax = nan ? NAN : _mm512_reduce_max_ps(vmax);
        float m_new = isnan(tmax) ? tmax : fmaxf(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        float alpha = exp_flushed(m[r] - m_new), floor_e = exp_flushed(-m_new);
        __m512 vm = _mm512_set1_ps(m_new), vfloor = _mm512_set1_ps(floor_e), vsum = _mm512_setzero_ps();
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, srow + c), vscale);
            __m512 e = _mm512_maskz_sub_ps(k, exp_kept(_mm512_sub_ps(x, vm), k), vfloor);
            _mm512_mask_storeu_ps(srow + c, below(c, t->cols), _mm512_max_ps(e, _mm512_setzero_ps()));
            vsum = _mm512_add_ps(vsum, _mm512_abs_ps(e));
        }
        l[r] = l[r] * alpha + _mm512_reduce_add_ps(vsum);
        m[r] = m_new;
        if (alpha != 1.0f) {
            __m512 va = _mm512_set1_ps(alpha);
            float *orow = o + r * ldo;
            for (int64_t c = 0; c < d_v; c += W) {
                __mmask16 tl = below(c, d_v);
                _mm512_mask_storeu_ps(orow + c, tl, _mm512_mul_ps(_mm512_maskz_loadu_ps(tl, orow + c), va));
            }
        }
    }
}

// E = exp(x - m) inv;  P = relu(E - exp(-m) inv);  e = sign(x) E
static void softpick_bwd_p(float *s, const qkv_attn_tile_ *t, float scale, const float *m, const float *inv,
                           float *e) {
    const __m512 vscale = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < t->rows; r++) {
        float *srow = s + r * t->cols, *erow = e + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        __m512 vm = _mm512_set1_ps(m[r]), vinv = _mm512_set1_ps(inv[r]);
        __m512 vfloor = _mm512_set1_ps(exp_flushed(-m[r]) * inv[r]);
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 k = keep_lanes(c, len, mrow), tl = below(c, t->cols);
            __m512 x = _mm512_maskz_mul_ps(k, _mm512_maskz_loadu_ps(k, srow + c), vscale);
            __m512 big = _mm512_mul_ps(exp_kept(_mm512_sub_ps(x, vm), k), vinv);
            __mmask16 pos = _mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), neg = _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ);
            __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            _mm512_mask_storeu_ps(srow + c, tl, _mm512_maskz_sub_ps(pos, big, vfloor));
            __m512 signed_e = _mm512_mask_sub_ps(_mm512_maskz_mov_ps(pos, big), neg, zero, big);
            _mm512_mask_storeu_ps(erow + c, tl, _mm512_mask_mov_ps(signed_e, nan, x));
        }
    }
}

// dS = scale (e > 0 ? e (dP - D) : -e D)
static void softpick_ds(const float *e, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                        float *ds) {
    const __m512 vscale = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < t->rows; r++) {
        __m512 vd = _mm512_set1_ps(dsum[r]);
        int64_t row = r * t->cols;
        for (int64_t c = 0; c < t->cols; c += W) {
            __mmask16 tl = below(c, t->cols);
            __m512 ve = _mm512_maskz_loadu_ps(tl, e + row + c);
            __mmask16 pos = _mm512_cmp_ps_mask(ve, zero, _CMP_GT_OQ);
            __mmask16 nz = tl & _mm512_cmp_ps_mask(ve, zero, _CMP_NEQ_UQ);
            __m512 vdp = _mm512_maskz_loadu_ps(nz, dp + row + c);
            __m512 a = _mm512_mul_ps(_mm512_mul_ps(vscale, ve), _mm512_sub_ps(vdp, vd));
            __m512 b = _mm512_mul_ps(_mm512_mul_ps(vscale, _mm512_sub_ps(zero, ve)), vd);
            _mm512_mask_storeu_ps(ds + row + c, tl, _mm512_maskz_mov_ps(nz, _mm512_mask_mov_ps(b, pos, a)));
        }
    }
}

const qkv_attn_kernel_set_ qkv_attn_kernels_avx512_ = {
    .name = "avx512",
    .available = true,
    .softmax_row = softmax_row,
    .softmax_rows = softmax_rows,
    .fwd_tile = fwd_tile,
    .bwd_p = bwd_p,
    .bwd_ds = bwd_ds,
    .short_keys = W,
    .short_dims = DMAX,
    .short_fwd = short_fwd,
    .short_bwd = short_bwd,
    .sigmoid_p = sigmoid_p,
    .sigmoid_ds = sigmoid_ds,
    .softpick_fwd_tile = softpick_fwd_tile,
    .softpick_bwd_p = softpick_bwd_p,
    .softpick_ds = softpick_ds,
};

#else

const qkv_attn_kernel_set_ qkv_attn_kernels_avx512_ = {.name = "avx512", .available = false};

#endif
