/*
 * attention_kernels.h — the f32 row kernels of softmax and of the fused attention (ops/softmax.c,
 * ops/attention.c), one set per instruction set: attention_portable.c (plain C, libm expf),
 * attention_avx2.c (AVX2+FMA, SLEEF Sleef_expf8_u10avx2) and attention_avx512.c (AVX-512F, SLEEF
 * Sleef_expf16_u10avx512f). Each file is compiled with its own ISA flags; attention_dispatch.c picks the set
 * the CPU runs (the same choice as the GEMM's, qkv_isa_best_). The GEMMs around these kernels are
 * qkv_gemm_f32_.
 *
 * A tile is `rows` queries x `cols` keys of scores, row-major with leading dimension cols. Which keys a
 * row keeps is the masked softmax's rule (ops/softmax.c): key c of row r is kept when
 *   (!causal || c <= r + diag)  and  (!mask || mask[r * mask_ld + c] != 0).
 * A dropped score is never loaded (masked loads), and gets probability 0.
 *
 * Subnormals: exp(x) for x < QKV_EXP_FLUSH_F32 gives exactly 0 in every kernel (the result would be
 * below FLT_MIN = 2^-126), and so does a normalised softmax entry p / sum that would fall below FLT_MIN.
 * Saturated softmax rows therefore produce no subnormal numbers, which cost a microcode assist per
 * operation on x86 (PyTorch runs about 2x slower there); the MXCSR (FTZ/DAZ) is never touched, so the
 * caller's floating-point environment is left alone. The value lost is below 1.2e-38 per entry against a
 * row maximum of exp(0) = 1: far under f32 rounding (tests/test_fused.c checks both the flush and the
 * accuracy of saturated rows).
 */
#ifndef QKV_ATTENTION_KERNELS_H
#define QKV_ATTENTION_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ln(FLT_MIN) = -87.33654...; a hair above it so that a 1-ulp exp is still >= FLT_MIN. */
#define QKV_EXP_FLUSH_F32 (-87.3365f)

typedef struct qkv_attn_tile_ {
    int64_t rows, cols;   /* queries x keys; scores row-major with leading dimension cols      */
    const uint8_t *mask;  /* mask byte of (row 0, key 0), or NULL for no mask                  */
    int64_t mask_ld;      /* bytes between the mask rows of consecutive queries (0: one row)   */
    bool causal;          /* keep key c of row r only if c <= r + diag                         */
    int64_t diag;         /* (first query index) - (first key index)                           */
} qkv_attn_tile_;

/* Number of leading keys of row r that causality allows (all cols without causal). */
static inline int64_t qkv_tile_row_len_(const qkv_attn_tile_ *t, int64_t r) {
    if (!t->causal) return t->cols;
    int64_t len = r + t->diag + 1;
    return len < 0 ? 0 : len > t->cols ? t->cols : len;
}

typedef struct qkv_attn_kernel_set_ {
    const char *name;
    bool available; /* compiled in (its ISA flag and SLEEF were there at build time)              */

    /* a[0:n] = softmax of the kept entries of s[0:n] (key j kept: j < len and (!mrow || mrow[j])),
     * 0 elsewhere; a row with nothing kept is all 0. s and a may not overlap. */
    void (*softmax_row)(const float *s, float *a, int64_t n, const uint8_t *mrow, int64_t len);

    /* Optional (NULL: qkv_attn_softmax_rows_ loops softmax_row). a[r*n .. r*n+n) = softmax of
     * s[r*n .. r*n+n) for r < rows, nothing masked: each row bit for bit what softmax_row(s + r*n, a + r*n,
     * n, NULL, n) gives, several rows at once. */
    void (*softmax_rows)(const float *s, float *a, int64_t rows, int64_t n);

    /* One key tile of the online softmax, row by row, with m (running max of scale*S over kept keys)
     * and l (running sum of exp(scale*S - m)):
     *   m' = max(m, max_c scale*S[r,c]),  alpha = exp(m - m'),  P[r,c] = exp(scale*S[r,c] - m'),
     *   l' = alpha l + rowsum(P),  O[r,:] *= alpha
     * P overwrites S (0 where dropped). o has rows x d_v, leading dimension ldo. */
    void (*fwd_tile)(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o,
                     int64_t ldo, int64_t d_v);

    /* P[r,c] = exp(scale*S[r,c] - lse[r]) over kept keys, 0 elsewhere (and for rows with lse = -inf,
     * whose every key was dropped). P overwrites S. */
    void (*bwd_p)(float *s, const qkv_attn_tile_ *t, float scale, const float *lse);

    /* dS[r,c] = scale * P[r,c] * (dP[r,c] - dsum[r]), and 0 wherever P is 0 (so a dropped key gives
     * 0 even if dP is not finite there). p, dp, ds: rows x cols, leading dimension cols. */
    void (*bwd_ds)(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                   float *ds);

    /* Short sequences (optional: short_keys 0 and NULL pointers when the set has none). One whole batch
     * element of the fused attention, few keys (AVX-512: one vector, 16; AVX2: 8 vectors, 64): 1 <= n_k <= short_keys and
     * 1 <= d_k, d_v <= short_dims, any n_q, no mask; causal keeps key c of query r when c <= r.
     * q [n_q, d_k], k [n_k, d_k], v [n_k, d_v], out [n_q, d_v], all row-major contiguous.
     * Forward: out = A V with A = softmax(scale Q K^T) and, when a is not NULL, A itself into a [n_q, n_k]
     * (n_k <= short_keys floats a query: what the backward then reads instead of recomputing, so no L is
     * made); the tile kernels' conventions (a query whose kept scores are all -inf: out 0, A 0; a kept NaN:
     * its row NaN).
     * Backward, from that A and out: with D = rowsum(dO * O) and dS = scale A (dO V^T - D) (0 where A = 0),
     * adds dQ += dS K, dK += dS^T Q, dV += A^T dO into those of dq, dk, dv that are not NULL. */
    int64_t short_keys, short_dims;
    void (*short_fwd)(const float *q, const float *k, const float *v, float *out, float *a, int64_t n_q,
                      int64_t n_k, int64_t d_k, int64_t d_v, float scale, bool causal);
    void (*short_bwd)(const float *q, const float *k, const float *v, const float *out, const float *dout,
                      const float *a, float *dq, float *dk, float *dv, int64_t n_q, int64_t n_k, int64_t d_k,
                      int64_t d_v, float scale, bool causal);

    /* Few-row products (optional: NULL when the set has none, and the fused attention calls the GEMM).
     * A query block of at most QKV_ATTN_FEW_ROWS rows (decoding: one query against many keys), where the
     * GEMM would pack a whole K or V tile for each one-row product; all row-major contiguous, f32 sums in
     * a fixed order (the same bits on every call):
     *   rows_dot   C[r, j] = A_r . B_j          A [m, k], B [n, k], C [m, n]   S = Q K^T, dP = dO V^T
     *   rows_axpy  C_r += sum_j A[r, j] B_j     A [m, n], B [n, k], C [m, k]   O += P V, dQ += dS K
     *   outer_add  C_j += sum_r A[r, j] X_r     A [m, n], X [m, k], C [n, k]   dV += P^T dO, dK += dS^T Q
     * ops/attention.c also gives rows_dot the S and dP tiles of at most 16 keys, any m (two rows by four
     * keys a step, where the GEMM's tiles would be half empty). Each sum runs in one order whatever m is.
     * An inf or NaN in B or X spreads as in the GEMM (0 * inf = NaN): the caller keeps its non-finite rows
     * away from them, as it does from the GEMM. */
    void (*rows_dot)(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n);
    void (*rows_axpy)(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k);
    void (*outer_add)(const float *a, const float *x, float *c, int64_t m, int64_t n, int64_t k);

    /* Attention variants (include/qkv/attention.h); optional: NULL takes the portable set's (qkv_attn_variant_
     * below). x = scale*S[r,c] over the kept keys; a dropped key gets 0 and its score is never loaded.
     * Sigmoid, forward and backward: P[r,c] = sigma(x + bias), exactly 0 where x + bias < QKV_EXP_FLUSH_F32
     * (below FLT_MIN). P overwrites S. */
    void (*sigmoid_p)(float *s, const qkv_attn_tile_ *t, float scale, float bias);
    /* Sigmoid backward: dS[r,c] = scale * P (1 - P) dP, 0 wherever P is 0. */
    void (*sigmoid_ds)(const float *p, const float *dp, const qkv_attn_tile_ *t, float scale, float *ds);
    /* Softpick forward, one key tile of the online form, with m (running max of 0 and the kept x) and l
     * (running sum of |e^(x - m) - e^-m|):
     *   m' = max(m, max_c x),  alpha = e^(m - m'),  P = relu(e^(x - m') - e^-m'),
     *   l' = alpha l + rowsum(|e^(x - m') - e^-m'|),  O[r,:] *= alpha
     * P overwrites S (0 where dropped). o has rows x d_v, leading dimension ldo. */
    void (*softpick_fwd_tile)(float *s, const qkv_attn_tile_ *t, float scale, float *m, float *l, float *o,
                              int64_t ldo, int64_t d_v);
    /* Softpick backward, from each row's final m and inv = 1 / (l + eps e^-m):
     *   E = e^(x - m) inv,  P = relu(E - e^-m inv) into S (the weights),
     *   e[r,c] = sign(x) E into e (0 at x = 0 and where dropped). */
    void (*softpick_bwd_p)(float *s, const qkv_attn_tile_ *t, float scale, const float *m, const float *inv,
                           float *e);
    /* dS = scale (e > 0 ? e (dP - dsum) : -e dsum): the derivative of relu(e^x - 1) / (sum |e^x - 1| + eps)
     * through x, with dsum = rowsum(dO * O). e, dp, ds: rows x cols (ds may be dp). */
    void (*softpick_ds)(const float *e, const float *dp, const qkv_attn_tile_ *t, float scale, const float *dsum,
                        float *ds);
} qkv_attn_kernel_set_;

/* The most query rows a block may have for the few-row products (rows_dot, rows_axpy, outer_add). */
#define QKV_ATTN_FEW_ROWS 4

/* Grain sizes of the OpenMP regions of ops/attention.c and ops/softmax.c: each thread gets at least this much
 * work, and a call with less runs on the calling thread alone, with no region at all. Opening a region
 * costs about a microsecond on idle cores; when a thread's core is busy with another process, the region
 * waits for the scheduler to run that thread (a time slice, milliseconds), so a training step made of
 * microsecond regions ran hundreds of times slower with 2 threads than with 1. 2^20 flops is about 0.1 ms
 * of one core's f32 attention; 32768 softmax entries about 30 us (PyTorch's at::internal::GRAIN_SIZE).
 * Which thread computes what never changes the order of any sum, so 1 and N threads give the same bits. */
#define QKV_GRAIN_FLOPS_ (1 << 20)
#define QKV_GRAIN_SOFTMAX_ 32768

/* Threads for `work` units of grain `grain`, at most `threads` and `tasks`, at least 1. */
static inline int qkv_grain_threads_(int threads, int64_t tasks, double work, double grain) {
    double by_work = work / grain;
    int64_t nt = threads;
    if (tasks < nt) nt = tasks;
    if (by_work < (double)nt) nt = (int64_t)by_work;
    return nt < 1 ? 1 : (int)nt;
}

/* OpenMP regions opened by attention and softmax since the process started (tests check the grain). */
void qkv_parallel_region_opened_(void);
long long qkv_parallel_regions_(void);

/* Unmasked rows through a set: its softmax_rows if it has one, else softmax_row row by row (the same bits). */
static inline void qkv_attn_softmax_rows_(const qkv_attn_kernel_set_ *ks, const float *s, float *a, int64_t rows,
                                          int64_t n) {
    if (ks->softmax_rows) {
        ks->softmax_rows(s, a, rows, n);
        return;
    }
    for (int64_t r = 0; r < rows; r++) ks->softmax_row(s + r * n, a + r * n, n, NULL, n);
}

extern const qkv_attn_kernel_set_ qkv_attn_kernels_portable_;

/* A variant kernel of set ks, or the portable set's when ks has none: qkv_attn_variant_(ks, sigmoid_p). */
#define qkv_attn_variant_(ks, kernel) ((ks)->kernel ? (ks)->kernel : qkv_attn_kernels_portable_.kernel)
extern const qkv_attn_kernel_set_ qkv_attn_kernels_avx2_;
extern const qkv_attn_kernel_set_ qkv_attn_kernels_avx512_;

/* The set to use: a forced one (tests, benchmarks) if set and available, else the best for this CPU. */
const qkv_attn_kernel_set_ *qkv_attn_kernels_(void);

/* The set whose few-row products a query block of at most QKV_ATTN_FEW_ROWS rows uses while ks runs, NULL
 * when none: ks's own, else the widest set below ks that has them and this CPU runs. The AVX-512 set has
 * none of its own and borrows AVX2's: with the GEMM in their place the decode shapes of
 * bench/attention_skinny, (64, 1, 512, 64) and (8, 1, 2048, 64), ran 1.6-3.3x slower on a Zen 4 (AVX-512;
 * 3 interleaved runs, 2026-12-02). */
const qkv_attn_kernel_set_ *qkv_attn_few_rows_kernels_(const qkv_attn_kernel_set_ *ks);
/* Force a set by ISA (a qkv_isa_ value, see qkv_internal.h), or -1 to go back to the automatic choice.
 * Returns false (and changes nothing) if that set is not available here. Not thread-safe: for tests
 * and benchmarks, called before the kernels run. */
bool qkv_attn_force_isa_(int isa);
/* Whether the fused attention may take a set's short-sequence kernels (default true). Tests turn it off
 * to run the tiled path on the same shapes; not thread-safe, like qkv_attn_force_isa_. */
void qkv_attn_allow_short_(bool allow);
bool qkv_attn_short_allowed_(void);
/* Whether the tiled path may keep P from the forward for the backward (ops/attention.c's keeps_p; on unless
 * a test turns it off, to compare with the backward that recomputes P). */
void qkv_attn_allow_keep_p_(bool allow);
bool qkv_attn_keep_p_allowed_(void);

#endif /* QKV_ATTENTION_KERNELS_H */
