/*
 * attention.c — scaled dot-product attention:
 *   q [B, n_q, d_k], k [B, n_k, d_k], v [B, n_k, d_v] -> out [B, n_q, d_v]   (2-D operands: B = 1)
 *   out = softmax(scale * Q K^T, mask, flags) V      scale QKV_SCALE_DEFAULT (-inf): 1/sqrt(d_k)
 * The mask and QKV_CAUSAL follow qkv_softmax exactly (ops/softmax.c): u8 [n_q, n_k], [Bm, n_q, n_k] or
 * [Bm, 1, n_k] with Bm dividing B; a dropped score is never read; a row with every key dropped gives 0
 * and zero gradients. When recording, the node keeps its own copy of the mask (as many bytes as the mask
 * has), so a caller who changes or frees the mask before the backward changes nothing there.
 *
 * out is always the fused path, FlashAttention-2 style; one tape node "qkv_attention". The forward walks key
 * tiles with an online softmax and saves out and the row log-sum-exp L; the backward recomputes each tile of
 * P from L. Per-thread scratch is O(tile + n_q * BC_B). The n_q x n_k matrix is stored only when it is small:
 * when the keys fit one forward tile (n_k <= BC_F) and P is no larger than Q, K and V together (keeps_p),
 * the forward keeps P = A (B n_q n_k values in the dtype) and the backward reads it instead of recomputing
 * S and P, one of its five products and its exps: (8, 128, 64) ran 6% (f32) and 10% (f64) faster on a Zen 4
 * (five interleaved pairs, 2026-12-03). Both give the same results to rounding (tests/test_fused.c).
 * When the caller also wants A (attn != NULL), A = softmax(s Q K^T) is formed beside it by qkv_matmul,
 * qkv_scale and qkv_softmax (three more nodes, through which a gradient of A itself flows), so asking for
 * A never changes out or its gradients. qkv_attention_composed_ (qkv_internal.h) is the whole attention
 * composed of the operators (four nodes: matmul, scale, softmax, matmul): the reference the tests and the
 * graph fuzzer check the fused path against.
 *
 * Fused forward, per (batch b, query block i of BR_F rows), key blocks j of BC_F keys (causal: only keys
 * up to the block's last query, so the tiles above the diagonal are never computed; tiles whose every key
 * is masked are skipped):
 *   S = Q_i K_j^T                                      qkv_gemm
 *   m' = max(m, rowmax(s S)),  P = exp(s S - m'),  l' = exp(m - m') l + rowsum(P),  O *= exp(m - m')
 *   O += P V_j                                         qkv_gemm
 *   O /= l,  L = m + log(l)                            (O = 0, L = -inf where no key was kept)
 * Fused backward, with D = rowsum(dO * O), per (batch b, key block j of BC_B keys) over query chunks i of
 * BR_B rows (causal: only rows >= the block's first key, chunks of BR_B_CAUSAL rows whose tiles stop at
 * the chunk's last query):
 *   S = Q_i K_j^T,  P = exp(s S - L)                   recomputed (or P read, when kept)
 *   dV_j += P^T dO_i
 *   dP = dO_i V_j^T
 *   dS = s P * (dP - D)                                (0 where P = 0: dropped keys, empty rows)
 *   dK_j += dS^T Q_i
 *   dQ += dS_strip K_j                                 (dS of the whole column strip of block j)
 * A dropped key: its score is never read (the row kernels skip it, P = dS = 0 there), and neither are its K
 * and V rows by a query that drops it. The GEMMs O += P V_j and dQ += dS K_j would add 0 * inf = NaN for a
 * row of inf or NaN, so the forward first flags the keys whose K or V row is not finite (one integer pass
 * over K and V; none, the usual case, costs nothing more; with a single query block, n_q <= BR_F, each key
 * block's rows are checked instead where its tile reads them), and a tile holding a flagged row takes a loop
 * that adds only the nonzero entries of P or dS instead of the GEMM (gemm_skip_zeros). A key every query
 * drops then changes nothing; dK_j += dS^T Q_i and dV_j += P^T dO_i read only the queries.
 * A query block of at most QKV_ATTN_FEW_ROWS (4) rows (decoding) takes the kernel set's few-row products
 * (attention_kernels.h: rows_dot, rows_axpy, outer_add) instead of the GEMM, which would pack a whole K or
 * V tile for each one-row product.
 * Threads (OpenMP, qkv_threads(ctx)): the forward over (b, i) tasks, each writing its own rows; the
 * backward over (b, j) tasks, each writing its own rows of dK and dV; dQ, which every key block adds to,
 * is accumulated in an ordered section in task order (or, when the batch splits evenly over the threads,
 * each thread runs whole batches, whose tasks it takes in order). Every element is therefore computed by
 * one thread in one fixed order: 1 or N threads give the same bits. A call of less than QKV_GRAIN_FLOPS_
 * (2^20) flops a thread, counted as 2 B n_q n_k (d_k + d_v), takes fewer threads, down to the calling thread
 * alone with no OpenMP region (attention_kernels.h: a region waits for a thread whose core is busy).
 *
 * f32 runs the per-ISA row kernels of ops/kernels/attention_*.c (SLEEF exp) around qkv_gemm_f32_; f64 runs
 * the same algorithm around qkv_gemm_f64_ (the packed f64 GEMM) with the f64 row kernels of
 * ops/kernels/attention_f64_avx2.c (SLEEF exp, 4 lanes) on an AVX2 CPU, else the plain C ones below (libm
 * exp; also whenever the f32 set is forced to portable, so tests reach them). qkv_gradcheck checks f64.
 *
 * Variants (qkv_attention_ex, include/qkv/attention.h) change only the normaliser; tiles, masks, threads and
 * the products stay the ones above (tape node "qkv_attention_ex"):
 *   softmax1, sink  init m = b (0 or the head's logit b_h), l = 1 instead of m = -inf, l = 0: the extra logit
 *                   without a value row; the backward is the softmax's, and d b_h = -sum_r exp(b_h - L_r) D_r
 *   sigmoid         P = sigma(s S + b) (no m, l, L); O += P V;  backward dS = s P (1 - P) dP, no D
 *   softpick        init m = 0, l = 0; per tile e = exp(s S - m') - exp(-m'), P = relu(e), l' = alpha l +
 *                   rowsum(|e|); O /= (l + eps exp(-m)); the backward keeps m and inv = 1 / (l + eps exp(-m))
 *                   per row: E = exp(s S - m) inv, dS = s (x > 0 ? E (dP - D) : -sign(x) E D)
 *   ssmax           a node before the fused softmax: q'_i = c_h log(n_i) q_i (ssmax_scale_q)
 * Their f32 kernels are the kernel set's (attention_kernels.h, qkv_attn_variant_: the portable set's when the
 * set has none); their f64 kernels are the plain C ones below on every CPU. None takes the short path;
 * all keep P when keeps_p (the sigmoid's P is final in its tile), except softpick, which keeps S = Q K^T
 * instead (its backward's P needs the row's final m and l, and the sign of S where P is 0): its backward
 * then skips the product S = Q_i K_j^T, not the exps.
 * Soft-capping (options.softcap = cap > 0, any variant): after S = Q_i K_j^T each tile's kept scores become
 * x' = cap t, t = tanh(s S / cap) (softcap_tile: the unary kernels' tanh, SLEEF on AVX2 and AVX-512, over runs of
 * kept keys, so a dropped score is still never read), and the row kernels above take x' with scale 1. The
 * backward recomputes S, t and x' for its tile in the same way, keeps g = s (1 - t^2) in one more tile of
 * scratch, and after the variant's dS' = d/dx' takes dS = dS' g (softcap_grad_tile) before dK and dQ. Neither
 * the short path nor the kept P is taken with a cap (both would skip the S the backward needs). Its cost against
 * the uncapped fused softmax (bench/attention --variants --softcap 30 --cpu, f32, one thread, AVX2 kernels, the
 * 2-core EPYC at load 8-10; median of 5 interleaved rounds of 7 samples, 2026-12-04): (4,512,64) 1.23x for the
 * capped softmax (1.23-1.31x for the variants), (8,128,64) 1.37x (1.36-1.48x; this shape also loses the kept P).
 * SLEEF's 1-ulp tanhf made it 1.46x and 1.62x: the tiles take the unary kernels' 3.5-ulp one.
 * Their cost against the fused softmax (bench/attention --variants --cpu, f32, one thread, AVX2 kernels, on a
 * 2-core EPYC shared with other builds at load 5-9, so only the ratios mean anything; median of 6 runs, each the
 * median of 5 interleaved rounds, 2026-12-04): (4,512,64) softmax1 1.02, sink 1.01, sigmoid 0.93, ssmax 1.00,
 * softpick 1.05; (8,128,64) 0.95, 1.02, 0.89, 1.06, 1.14 (single runs of softpick there ranged 1.11-1.53).
 *
 * Grouped-query attention (options.kv_heads, group = heads / kv_heads query rows per K and V row): forward task
 * (b, i) reads K and V row b / group where it would read row b; the backward's tasks are (kb, j), kb a row of K
 * and V, and each runs the chunks above for its query rows kb group .. kb group + group - 1 in that order,
 * adding into the shared dK_j and dV_j and leaving each query row's dS strip (group strips a thread) for bwd_dq.
 * Every dK and dV entry is thus summed by one task in one order: 1 and N threads give the same bits. No short
 * path with grouping (its kernel adds a whole batch element's dK and dV at once).
 *
 * Short sequences (f32, no mask, few keys: n_k <= 16 and d_k, d_v <= 32 on AVX-512, every key within one
 * vector; n_k <= 64 and d_k, d_v <= 16 on AVX2, in up to 8 vectors): each batch element is one call of the
 * set's short_fwd / short_bwd, which hold K^T and V^T in registers (or, past 8 keys on AVX2, an L1 buffer),
 * where the tiles above would make seven tiny GEMM calls and a dozen row-kernel calls. There the forward
 * also keeps A itself (at most short_keys floats per query) and the backward reads it instead of
 * recomputing Q K^T and exp: dV += A^T dO, dS = s A (dO V^T - D), dK += dS^T Q, dQ += dS K. A key a query
 * dropped gets nothing from that query (the tiled backward multiplies its zero dS by the query, so a NaN
 * query spreads there); otherwise both paths agree to rounding (tests/test_fused.c).
 */
#include "qkv_internal.h"

#include "kernels/attention_f64_kernels.h"
#include "kernels/attention_kernels.h"
#include "kernels/unary_kernels.h"
#include "row_sums.h"

#include <math.h>

#ifdef QKV_HAVE_OPENMP
#include <omp.h>
#endif

/* Tile sizes (rows x keys) of the fused forward and backward (bench/attention.c). With QKV_CAUSAL the
 * backward takes shorter row chunks, so that the tiles along the diagonal stop at their last query. */
#define BR_F 64
#define BC_F 256
#define BR_B 128
#define BR_B_CAUSAL 32
#define BC_B 128

/* ---- argument checks shared by both paths ------------------------------------------------------- */

/* The q, k, v shapes of attention: 2-D or 3-D, same dtype, matching batch and dimensions; with group > 1
 * (grouped-query attention: heads query heads over heads / group key/value heads) k and v have batch
 * B / group, B that of q (a multiple of heads). */
static bool check_qkv_grouped(qkv_ctx *ctx, const char *fn, const qkv_tensor *q, const qkv_tensor *k,
                              const qkv_tensor *v, int heads, int group) {
    if (!qkv_check_float_(ctx, fn, "q", q) || !qkv_check_float_(ctx, fn, "k", k) ||
        !qkv_check_float_(ctx, fn, "v", v) || !qkv_check_same_dtype_(ctx, fn, q, "q", k, "k") ||
        !qkv_check_same_dtype_(ctx, fn, q, "q", v, "v"))
        return false;
    const qkv_tensor *ts[3] = {q, k, v};
    const char *names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++)
        if (ts[i]->ndim != 2 && ts[i]->ndim != 3)
            return qkv_fail_(ctx, QKV_ERR_RANK, "%s: %s is %s; attention takes [B, n, d] or [n, d]", fn,
                             names[i], QKV_SHAPE(ts[i])),
                   false;
    if (q->ndim != k->ndim || q->ndim != v->ndim)
        return qkv_fail_(ctx, QKV_ERR_RANK, "%s: q is %s, k is %s, v is %s: ranks differ", fn, QKV_SHAPE(q),
                         QKV_SHAPE(k), QKV_SHAPE(v)),
               false;
    int r = q->ndim;
    if (group > 1) {
        int64_t batch = r == 3 ? q->shape[0] : 1, kv_batch = batch / group;
        if (batch % heads != 0)
            return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: q is %s, k is %s: heads %d does not divide the batch %lld", fn,
                             QKV_SHAPE(q), QKV_SHAPE(k), heads, (long long)batch),
                   false;
        if (r != 3 || k->shape[0] != kv_batch || v->shape[0] != kv_batch)
            return qkv_fail_(ctx, QKV_ERR_SHAPE,
                             "%s: q is %s, k is %s, v is %s: with heads %d and kv_heads %d, k and v need batch B / "
                             "heads * kv_heads = %lld (q's batch row b reads their row b / %d)",
                             fn, QKV_SHAPE(q), QKV_SHAPE(k), QKV_SHAPE(v), heads, heads / group,
                             (long long)kv_batch, group),
                   false;
    } else if (r == 3 && (q->shape[0] != k->shape[0] || q->shape[0] != v->shape[0]))
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: q is %s, k is %s, v is %s: batch dimensions differ", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), QKV_SHAPE(v)),
               false;
    if (q->shape[r - 1] != k->shape[r - 1])
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: q is %s, k is %s: d_k %lld and %lld differ", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), (long long)q->shape[r - 1], (long long)k->shape[r - 1]),
               false;
    if (k->shape[r - 2] != v->shape[r - 2])
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: k is %s, v is %s: key counts %lld and %lld differ", fn,
                         QKV_SHAPE(k), QKV_SHAPE(v), (long long)k->shape[r - 2], (long long)v->shape[r - 2]),
               false;
    return true;
}

static bool check_qkv(qkv_ctx *ctx, const char *fn, const qkv_tensor *q, const qkv_tensor *k, const qkv_tensor *v) {
    return check_qkv_grouped(ctx, fn, q, k, v, 1, 1);
}

/* The scale to use: exactly -inf (QKV_SCALE_DEFAULT, -HUGE_VAL) means 1/sqrt(d_k); any finite value is used
 * as given (0 and negative ones too); NaN and +inf are errors, so that a scale computed by mistake (0.0/0.0,
 * 1/0.0) is not silently replaced by the default. */
static bool resolve_scale(qkv_ctx *ctx, const char *fn, const qkv_tensor *q, const qkv_tensor *k, double scale,
                          double *out) {
    int64_t d_k = q->shape[q->ndim - 1];
    if (scale == QKV_SCALE_DEFAULT) {
        *out = d_k > 0 ? 1.0 / sqrt((double)d_k) : 1.0;
        return true;
    }
    if (!isfinite(scale))
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: q is %s, k is %s: scale %g is %s (pass QKV_SCALE_DEFAULT, -HUGE_VAL, for "
                         "1/sqrt(d_k), or a finite value)",
                         fn, QKV_SHAPE(q), QKV_SHAPE(k), scale, isnan(scale) ? "not a number" : "not finite"),
               false;
    *out = scale;
    return true;
}

/* ---- the fused path: its plan ------------------------------------------------------------------- */

typedef struct plan {
    bool f64;
    size_t es; /* element size */
    const qkv_attn_kernel_set_ *ks; /* f32 row kernels */
    const qkv_attn_kernel_set_ *few; /* f32 few-row products (ks's or a narrower set's), NULL when none */
    const qkv_attn_f64_kernels_ *ks64; /* f64 row kernels */
    int64_t batch, n_q, n_k, d_k, d_v;
    double scale;
    const uint8_t *mask;          /* NULL: no mask */
    int64_t mask_batch, mask_rows; /* Bm; n_q or 1 */
    bool causal;
    int threads;
    const uint8_t *bad; /* [B n_k]: bit 1 K row, bit 2 V row holds inf or NaN; NULL when none does */
    bool bad_in_place;  /* no flags made: each key block's K or V rows are checked where they are used */
    /* the variant (include/qkv/attention.h; SSMax runs as the softmax of a scaled q, so never here) */
    qkv_attn_variant variant;
    const void *sink;   /* QKV_ATTN_SINK: the logits b [heads] in the dtype (the node's copy) */
    int64_t heads;      /* batch element b uses head b % heads */
    int64_t group;      /* grouped-query attention: query batch row b reads K and V row b / group (1: row b) */
    double bias;        /* QKV_ATTN_SIGMOID: b in sigma(x + b) */
    double eps;         /* QKV_ATTN_SOFTPICK: eps */
    double cap;         /* options.softcap: scores become cap tanh(s S / cap); 0 = off */
    const qkv_unary_kernel_set_ *tanh_set; /* f32: the tanh of the capped tiles */
} plan;


/* The mask checks of qkv_softmax, for the scores q k^T would have: [B, n_q, n_k]. */
static bool check_mask(qkv_ctx *ctx, const char *fn, const qkv_tensor *q, const qkv_tensor *k,
                       const qkv_tensor *mask, plan *p) {
    if (!qkv_check_tensor_(ctx, fn, "mask", mask)) return false;
    if (mask->dtype != QKV_U8)
        return qkv_fail_(ctx, QKV_ERR_DTYPE, "%s: q is %s, k is %s, mask %s is %s; masks are u8 (0 drops, any other byte keeps)",
                         fn, QKV_SHAPE(q), QKV_SHAPE(k), QKV_SHAPE(mask), qkv_dtype_name(mask->dtype)),
               false;
    if (mask->ndim != 2 && mask->ndim != 3)
        return qkv_fail_(ctx, QKV_ERR_RANK,
                         "%s: q is %s, k is %s, mask is %s: a mask has 2 or 3 dimensions ([n_q, n_k], "
                         "[Bm, n_q, n_k] or [Bm, 1, n_k]), not %d",
                         fn, QKV_SHAPE(q), QKV_SHAPE(k), QKV_SHAPE(mask), mask->ndim),
               false;
    int last = mask->ndim - 1;
    if (mask->shape[last] != p->n_k)
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: q is %s, k is %s, mask is %s: mask dimension %d is %lld, must be n_k = %lld", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), QKV_SHAPE(mask), last, (long long)mask->shape[last],
                         (long long)p->n_k),
               false;
    int64_t rows = mask->shape[last - 1];
    if (rows != p->n_q && !(mask->ndim == 3 && rows == 1))
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: q is %s, k is %s, mask is %s: mask dimension %d is %lld, must be n_q = %lld%s", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), QKV_SHAPE(mask), last - 1, (long long)rows,
                         (long long)p->n_q, mask->ndim == 3 ? " or 1" : ""),
               false;
    int64_t mb = mask->ndim == 3 ? mask->shape[0] : 1;
    if (mb < 1 || p->batch % mb != 0)
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: q is %s, k is %s, mask is %s: mask dimension 0 is %lld, which does not divide the "
                         "batch %lld",
                         fn, QKV_SHAPE(q), QKV_SHAPE(k), QKV_SHAPE(mask), (long long)mb, (long long)p->batch),
               false;
    p->mask = mask->data;
    p->mask_batch = mb;
    p->mask_rows = rows;
    return true;
}

static const qkv_attn_f64_kernels_ *f64_kernels(void);

/* The tanh of the f32 soft-capped tiles: the unary kernels of the attention set's ISA (their fast tanh: SLEEF's
 * 3.5-ulp tanhf on AVX2 and AVX-512, libm's in the portable set), so that a forced attention set runs its own. */
static const qkv_unary_kernel_set_ *tanh_kernels(const qkv_attn_kernel_set_ *ks) {
    int isa = ks == &qkv_attn_kernels_avx512_ ? QKV_ISA_AVX512_
              : ks == &qkv_attn_kernels_avx2_ ? QKV_ISA_AVX2_
                                              : QKV_ISA_PORTABLE_;
    const qkv_unary_kernel_set_ *u = qkv_unary_kernels_isa_(isa);
    return u ? u : &qkv_unary_kernels_portable_;
}

/* The plan of one fused call (dimensions from q, k, v; mask rule from mask and flags). */
static void plan_init(plan *p, const qkv_ctx *ctx, const qkv_tensor *q, const qkv_tensor *k, const qkv_tensor *v,
                      double scale, int flags) {
    int r = q->ndim;
    p->f64 = q->dtype == QKV_F64;
    p->es = qkv_dtype_size(q->dtype);
    p->ks = p->f64 ? NULL : qkv_attn_kernels_();
    p->few = p->f64 ? NULL : qkv_attn_few_rows_kernels_(p->ks);
    p->ks64 = p->f64 ? f64_kernels() : NULL;
    p->batch = r == 3 ? q->shape[0] : 1;
    p->n_q = q->shape[r - 2];
    p->n_k = k->shape[r - 2];
    p->d_k = q->shape[r - 1];
    p->d_v = v->shape[r - 1];
    p->scale = scale;
    p->mask = NULL;
    p->mask_batch = p->mask_rows = 1;
    p->causal = (flags & QKV_CAUSAL) != 0;
    p->threads = qkv_threads(ctx) > 1 ? qkv_threads(ctx) : 1;
    p->bad = NULL;
    p->bad_in_place = false;
    p->variant = QKV_ATTN_SOFTMAX;
    p->sink = NULL;
    p->heads = 1;
    p->group = 1;
    p->bias = 0.0;
    p->eps = 0.0;
    p->cap = 0.0;
    p->tanh_set = p->f64 ? NULL : tanh_kernels(p->ks);
}

/* ---- keys whose K or V row is not finite -------------------------------------------------------- */

enum { BAD_K = 1, BAD_V = 2 };

/* Does row x[0:n] hold an inf or a NaN? (The exponent bits all set; one integer pass, no FP compare.) */
static bool row_nonfinite(const plan *p, const void *x, int64_t n) {
    uint64_t any = 0;
    if (p->f64) {
        const uint64_t *u = x;
        for (int64_t i = 0; i < n; i++) any |= (u[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    } else {
        const uint32_t *u = x;
        for (int64_t i = 0; i < n; i++) any |= (u[i] & 0x7f800000u) == 0x7f800000u;
    }
    return any != 0;
}

/* Flags [B_kv n_k] (B_kv = B / group, the rows of K and V) of the keys whose K row (BAD_K) or V row (BAD_V) is not finite, into p->bad; NULL (and
 * true) when every row is finite, the usual case, which then costs this one pass over K and V and nothing
 * per tile. False on allocation failure (error stored). */
static bool find_bad_keys(qkv_ctx *ctx, const char *fn, plan *p, const void *k, const void *v) {
    const void *kv[2] = {k, v};
    int64_t width[2] = {p->d_k, p->d_v}, keys = p->batch / p->group * p->n_k;
    bool any = false;
    for (int t = 0; t < 2 && !any; t++) any = row_nonfinite(p, kv[t], keys * width[t]);
    p->bad = NULL;
    if (!any) return true;
    uint8_t *bad = qkv_arena_array_(ctx, fn, (size_t)keys, 1);
    if (!bad) return false;
    for (int64_t j = 0; j < keys; j++)
        bad[j] = (uint8_t)((row_nonfinite(p, (const char *)k + (size_t)(j * p->d_k) * p->es, p->d_k) ? BAD_K : 0) |
                           (row_nonfinite(p, (const char *)v + (size_t)(j * p->d_v) * p->es, p->d_v) ? BAD_V : 0));
    p->bad = bad;
    return true;
}

/* The forward visits each key block once when there is one query block (n_q <= BR_F: decoding), and then
 * each block's K and V rows are checked where the tile uses them, in cache, instead of in a pass of their
 * own over K and V before the forward (a third of the forward's memory traffic at (64, 1, 512, 64)). */
static bool check_in_place(const plan *p) { return p->n_q <= BR_F; }

/* Does a key of K and V row kb (batch element kb * group .. of q) in j0 .. j0+cols have a non-finite row of the
 * kind `which`? rows: that block's K (BAD_K) or V (BAD_V) rows, read when the plan checks in place. */
static bool block_has_bad(const plan *p, int64_t kb, int64_t j0, int64_t cols, int which, const void *rows) {
    if (p->bad_in_place) return row_nonfinite(p, rows, cols * (which == BAD_K ? p->d_k : p->d_v));
    if (!p->bad) return false;
    const uint8_t *f = p->bad + kb * p->n_k + j0;
    uint8_t any = 0;
    for (int64_t c = 0; c < cols; c++) any |= f[c];
    return (any & which) != 0;
}

// C[m, n] += A[m, kk] B[kk, n] over the entries of A that are not 0: a key that a query dropped (A = 0 there)
// adds nothing to that query's row, even when its row of B holds inf or NaN (where the GEMM would add 0 * inf)
static void gemm_skip_zeros(const plan *p, const void *a, const void *b, void *c, int64_t m, int64_t kk, int64_t n) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < kk; j++) {
            if (p->f64) {
                double x = ((const double *)a)[r * kk + j];
                if (x == 0.0) continue;
                const double *brow = (const double *)b + j * n;
                double *crow = (double *)c + r * n;
                for (int64_t e = 0; e < n; e++) crow[e] += x * brow[e];
            } else {
                float x = ((const float *)a)[r * kk + j];
                if (x == 0.0f) continue;
                const float *brow = (const float *)b + j * n;
                float *crow = (float *)c + r * n;
                for (int64_t e = 0; e < n; e++) crow[e] += x * brow[e];
            }
        }
}

/* Element i of an array of the plan's dtype. */
static inline void *at(const plan *p, const void *base, int64_t i) {
    return (char *)base + (size_t)i * p->es;
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t blocks(int64_t n, int64_t size) { return (n + size - 1) / size; }

/* The tile of scores batch b, queries i0 .. i0+rows, keys j0 .. j0+cols. */
static qkv_attn_tile_ tile_of(const plan *p, int64_t b, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
    qkv_attn_tile_ t = {rows, cols, NULL, 0, p->causal, i0 - j0};
    if (p->mask) {
        int64_t mb = b / (p->batch / p->mask_batch);
        int64_t mi = p->mask_rows == 1 ? 0 : i0;
        t.mask = p->mask + (mb * p->mask_rows + mi) * p->n_k + j0;
        t.mask_ld = p->mask_rows == 1 ? 0 : p->n_k;
    }
    return t;
}

/* Does any row of the tile keep a key? (With one shared mask row, the last row sees the most keys.) */
static bool tile_any_kept(const qkv_attn_tile_ *t) {
    for (int64_t r = t->mask && t->mask_ld ? 0 : t->rows - 1; r < t->rows; r++) {
        int64_t len = qkv_tile_row_len_(t, r);
        if (!t->mask) {
            if (len > 0) return true;
            continue;
        }
        const uint8_t *m = t->mask + r * t->mask_ld;
        uint8_t any = 0;
        for (int64_t c = 0; c < len; c++) any |= m[c];
        if (any) return true;
    }
    return false;
}

/* C (+)= op(A) op(B) in the plan's dtype. */
static void gemm(const plan *p, const void *a, const void *b, void *c, int64_t m, int64_t k, int64_t n, bool ta,
                 bool tb, bool acc) {
    if (p->f64) qkv_gemm_f64_(a, b, c, m, k, n, ta, tb, acc);
    else qkv_gemm_f32_(a, b, c, m, k, n, ta, tb, acc);
}

/* The products of a query block of at most QKV_ATTN_FEW_ROWS rows (decoding) go to few-row products when a
 * kernel set this CPU runs has them (f32: qkv_attn_few_rows_kernels_), which read K and V where they lie; the
 * GEMM would pack a whole K or V tile for each one-row product (half the time of a (64, 1, 512, 64) forward
 * + backward). */
static bool few_rows(const plan *p, int64_t rows) { return p->few && rows <= QKV_ATTN_FEW_ROWS; }

// C = A B^T   [rows, n]  (A [rows, kk], B [n, kk]); at most 16 keys (n_k <= 16, narrow causal tiles) also go
// to rows_dot, which takes two rows by four keys where the GEMM's tiles would be half empty
static void gemm_abt(const plan *p, const void *a, const void *b, void *c, int64_t rows, int64_t kk, int64_t n) {
    if (few_rows(p, rows)) p->few->rows_dot(a, b, c, rows, kk, n);
    else if (!p->f64 && p->ks->rows_dot && n <= 16) p->ks->rows_dot(a, b, c, rows, kk, n);
    else gemm(p, a, b, c, rows, kk, n, false, true, false);
}

// C += A B    [rows, n]  (A [rows, kk], B [kk, n])
static void gemm_ab_add(const plan *p, const void *a, const void *b, void *c, int64_t rows, int64_t kk, int64_t n) {
    if (few_rows(p, rows)) p->few->rows_axpy(a, b, c, rows, kk, n);
    else gemm(p, a, b, c, rows, kk, n, false, false, true);
}

// C += A^T X  [n, kk]    (A [rows, n], X [rows, kk])
static void gemm_atb_add(const plan *p, const void *a, const void *x, void *c, int64_t n, int64_t rows, int64_t kk) {
    if (few_rows(p, rows)) p->few->outer_add(a, x, c, rows, n, kk);
    else gemm(p, a, x, c, n, rows, kk, true, false, true);
}

/* ---- soft-capping of a score tile (options.softcap) ---------------------------------------------------- */

/* The scale the row kernels apply to their tile: s, or 1 when the tile already holds the capped scores
 * x' = cap tanh(s S / cap) (softcap_tile), which the kernels then take as they are. */
static inline double kernel_scale(const plan *p) { return p->cap > 0 ? 1.0 : p->scale; }

// keys c0 .. c1 of one row:  t = tanh(s S / cap),  S = cap t,  and g = s (1 - t^2) (dx / dS) when g is wanted
static void softcap_run(const plan *p, void *srow, void *grow, int64_t c0, int64_t c1) {
    int64_t n = c1 - c0;
    if (p->f64) {
        double *x = (double *)srow + c0, *g = grow ? (double *)grow + c0 : NULL;
        for (int64_t c = 0; c < n; c++) {
            double t = tanh(x[c] * p->scale / p->cap);
            x[c] = p->cap * t;
            if (g) g[c] = p->scale * (1.0 - t * t);
        }
        return;
    }
    float *x = (float *)srow + c0, *g = grow ? (float *)grow + c0 : NULL;
    float scale = (float)p->scale, cap = (float)p->cap;
    for (int64_t c = 0; c < n; c++) x[c] = x[c] * scale / cap;
    p->tanh_set->map(QKV_VF_TANH_FAST_, x, x, n, 0.0f); /* t = tanh(s S / cap), in place (SLEEF's 3.5-ulp tanhf) */
    for (int64_t c = 0; c < n; c++) {
        float t = x[c];
        if (g) g[c] = scale * (1.0f - t * t);
        x[c] = cap * t;
    }
}

// S = cap tanh(s S / cap) over the kept keys of tile t, in runs of consecutive kept keys (a dropped key's score
// is neither read nor written); g (rows x cols, when not NULL) = s (1 - t^2) there, for the backward
static void softcap_tile(const plan *p, void *s, const qkv_attn_tile_ *t, void *g) {
    for (int64_t r = 0; r < t->rows; r++) {
        int64_t len = qkv_tile_row_len_(t, r);
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        void *srow = at(p, s, r * t->cols), *grow = g ? at(p, g, r * t->cols) : NULL;
        for (int64_t c0 = 0; c0 < len;) {
            if (mrow && !mrow[c0]) {
                c0++;
                continue;
            }
            int64_t c1 = c0 + 1;
            while (c1 < len && (!mrow || mrow[c1])) c1++;
            softcap_run(p, srow, grow, c0, c1);
            c0 = c1;
        }
    }
}

// dS = dS' g = dS' s (1 - t^2) over the kept keys of tile t (dS' is the variant's gradient of the capped score
// x'; elsewhere dS is 0 already and g was never written)
static void softcap_grad_tile(const plan *p, void *ds, const qkv_attn_tile_ *t, const void *g) {
    for (int64_t r = 0; r < t->rows; r++) {
        int64_t len = qkv_tile_row_len_(t, r);
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        for (int64_t c = 0; c < len; c++) {
            if (mrow && !mrow[c]) continue;
            int64_t i = r * t->cols + c;
            if (p->f64) ((double *)ds)[i] *= ((const double *)g)[i];
            else ((float *)ds)[i] *= ((const float *)g)[i];
        }
    }
}

/* ---- f64 row kernels: the f32 kernels' algorithm (attention_kernels.h) in double, exp without flush -- */

static inline bool kept64(const uint8_t *mrow, int64_t len, int64_t c) { return c < len && (!mrow || mrow[c]); }

// m' = max(m, max_c s S[r,c]);  P = exp(s S - m');  l' = exp(m - m') l + rowsum(P);  O *= exp(m - m')
static void fwd_tile_f64(double *s, const qkv_attn_tile_ *t, double scale, double *m, double *l, double *o,
                         int64_t d_v) {
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        double tmax = -INFINITY;
        for (int64_t c = 0; c < len; c++) {
            if (!kept64(mrow, len, c)) continue;
            double x = srow[c] * scale;
            if (x > tmax || isnan(x)) tmax = x; /* a kept NaN sticks */
        }
        if (tmax == -INFINITY) { /* nothing kept in this tile (or only -inf scores): P = 0, no change */
            for (int64_t c = 0; c < t->cols; c++) srow[c] = 0.0;
            continue;
        }
        double m_new = isnan(tmax) ? tmax : fmax(m[r], tmax); /* NaN: every P, l and O of the row NaN */
        double alpha = m[r] == -INFINITY ? 0.0 : exp(m[r] - m_new);
        double sum = 0.0;
        for (int64_t c = 0; c < t->cols; c++) {
            srow[c] = kept64(mrow, len, c) ? exp(srow[c] * scale - m_new) : 0.0;
            sum += srow[c];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
        if (alpha != 1.0)
            for (int64_t c = 0; c < d_v; c++) o[r * d_v + c] *= alpha;
    }
}

// P = exp(s S - L) over kept keys, 0 elsewhere
static void bwd_p_f64(double *s, const qkv_attn_tile_ *t, double scale, const double *lse) {
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = lse[r] == -INFINITY ? 0 : qkv_tile_row_len_(t, r);
        for (int64_t c = 0; c < t->cols; c++)
            srow[c] = kept64(mrow, len, c) ? exp(srow[c] * scale - lse[r]) : 0.0;
    }
}

// dS = s P (dP - D), 0 where P = 0
static void bwd_ds_f64(const double *p, const double *dp, const qkv_attn_tile_ *t, double scale,
                       const double *dsum, double *ds) {
    for (int64_t r = 0; r < t->rows; r++)
        for (int64_t c = 0; c < t->cols; c++) {
            int64_t i = r * t->cols + c;
            ds[i] = p[i] != 0.0 ? (scale * p[i]) * (dp[i] - dsum[r]) : 0.0;
        }
}

/* The variants' f64 row kernels (the f32 portable set's, attention_kernels.h, in double; libm exp, no
 * flush): plain C on every CPU. */

// P = sigma(s S + b) over kept keys, 0 elsewhere
static void sigmoid_p_f64(double *s, const qkv_attn_tile_ *t, double scale, double bias) {
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        for (int64_t c = 0; c < t->cols; c++)
            srow[c] = kept64(mrow, len, c) ? 1.0 / (1.0 + exp(-(srow[c] * scale + bias))) : 0.0;
    }
}

// dS = s P (1 - P) dP, 0 where P = 0
static void sigmoid_ds_f64(const double *p, const double *dp, const qkv_attn_tile_ *t, double scale, double *ds) {
    for (int64_t i = 0; i < t->rows * t->cols; i++)
        ds[i] = p[i] != 0.0 ? (scale * p[i]) * (1.0 - p[i]) * dp[i] : 0.0;
}

// m' = max(m, max_c x);  e_c = exp(x - m') - exp(-m');  P = relu(e_c);  l' = exp(m - m') l + rowsum(|e_c|);
// O *= exp(m - m')
static void softpick_fwd_tile_f64(double *s, const qkv_attn_tile_ *t, double scale, double *m, double *l, double *o,
                                  int64_t d_v) {
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        double m_new = m[r];
        for (int64_t c = 0; c < len; c++) {
            if (!kept64(mrow, len, c)) continue;
            double x = srow[c] * scale;
            if (x > m_new || isnan(x)) m_new = x; /* a kept NaN sticks */
        }
        double alpha = exp(m[r] - m_new), floor_e = exp(-m_new), sum = 0.0;
        for (int64_t c = 0; c < t->cols; c++) {
            double e = kept64(mrow, len, c) ? exp(srow[c] * scale - m_new) - floor_e : 0.0;
            srow[c] = e > 0.0 ? e : 0.0;
            sum += fabs(e);
        }
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
        if (alpha != 1.0)
            for (int64_t c = 0; c < d_v; c++) o[r * d_v + c] *= alpha;
    }
}

// E = exp(x - m) inv;  P = relu(E - exp(-m) inv);  e = sign(x) E
static void softpick_bwd_p_f64(double *s, const qkv_attn_tile_ *t, double scale, const double *m, const double *inv,
                               double *e) {
    for (int64_t r = 0; r < t->rows; r++) {
        double *srow = s + r * t->cols, *erow = e + r * t->cols;
        const uint8_t *mrow = t->mask ? t->mask + r * t->mask_ld : NULL;
        int64_t len = qkv_tile_row_len_(t, r);
        double floor_e = exp(-m[r]) * inv[r];
        for (int64_t c = 0; c < t->cols; c++) {
            double x = kept64(mrow, len, c) ? srow[c] * scale : 0.0;
            double big = x != 0.0 ? exp(x - m[r]) * inv[r] : 0.0;
            srow[c] = x > 0.0 ? big - floor_e : 0.0;
            erow[c] = x > 0.0 ? big : x < 0.0 ? -big : x; /* x NaN: NaN */
        }
    }
}

// dS = s (e > 0 ? e (dP - D) : -e D)
static void softpick_ds_f64(const double *e, const double *dp, const qkv_attn_tile_ *t, double scale,
                            const double *dsum, double *ds) {
    for (int64_t r = 0; r < t->rows; r++)
        for (int64_t c = 0; c < t->cols; c++) {
            int64_t i = r * t->cols + c;
            double ei = e[i];
            ds[i] = ei > 0.0 ? (scale * ei) * (dp[i] - dsum[r]) : ei != 0.0 ? (scale * -ei) * dsum[r] : 0.0;
        }
}

/* The plain C set, and the choice, which follows the f32 set's ISA (so tests that force the f32 kernels,
 * qkv_attn_force_isa_, reach each f64 set too): with the AVX-512 f32 set, the AVX-512 f64 set when compiled
 * in; with AVX2 or AVX-512, the AVX2 set when compiled in and the CPU has AVX2; else the plain C one. */
static const qkv_attn_f64_kernels_ f64_kernels_portable = {"portable", true, fwd_tile_f64, bwd_p_f64, bwd_ds_f64};

static const qkv_attn_f64_kernels_ *f64_kernels(void) {
    const qkv_attn_kernel_set_ *f32 = qkv_attn_kernels_();
    if (f32 == &qkv_attn_kernels_avx512_ && qkv_attn_f64_kernels_avx512_.available)
        return &qkv_attn_f64_kernels_avx512_;
    if (qkv_attn_f64_kernels_avx2_.available && qkv_isa_supported_(QKV_ISA_AVX2_) && f32 != &qkv_attn_kernels_portable_)
        return &qkv_attn_f64_kernels_avx2_;
    return &f64_kernels_portable;
}

/* ---- the fused forward -------------------------------------------------------------------------- */

typedef struct fwd_io {
    const void *q, *k, *v;
    void *out, *lse;
    unsigned char *scratch; /* per thread: S tile, m, l */
    size_t scratch_stride;
    void *a; /* A = P [B, n_q, n_k] written for the backward (keeps_p), or NULL */
    void *inv; /* softpick: 1 / (l + eps e^-m) [B n_q] for the backward (lse then holds m) */
} fwd_io;

/* Running max and sum of the online softmax, at the start of a query block of batch element b:
 *   softmax   m = -inf, l = 0
 *   softmax1  m = 0, l = 1            (the extra logit 0: e^(0 - m) = 1, and no value row)
 *   sink      m = b_h, l = 1          (the extra logit b_h of head h = b % heads)
 *   softpick  m = 0, l = 0            (m = max(0, max x) keeps e^-m <= 1)
 * Sigmoid keeps no m or l. */
static void init_rows(const plan *p, void *m, void *l, int64_t rows, int64_t b) {
    double m0 = -INFINITY, l0 = 0.0;
    if (p->variant == QKV_ATTN_SOFTMAX1) m0 = 0.0, l0 = 1.0;
    if (p->variant == QKV_ATTN_SINK) {
        int64_t h = b % p->heads;
        m0 = p->f64 ? ((const double *)p->sink)[h] : (double)((const float *)p->sink)[h], l0 = 1.0;
    }
    if (p->variant == QKV_ATTN_SOFTPICK) m0 = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        if (p->f64) {
            ((double *)m)[r] = m0;
            ((double *)l)[r] = l0;
        } else {
            ((float *)m)[r] = (float)m0;
            ((float *)l)[r] = (float)l0;
        }
    }
}

// softpick: O /= (l + eps e^-m);  keep m and inv = 1 / (l + eps e^-m) for the backward
static void finish_softpick_rows(const plan *p, void *o, int64_t rows, const void *m, const void *l, void *m_out,
                                 void *inv_out) {
    for (int64_t r = 0; r < rows; r++) {
        if (p->f64) {
            double mr = ((const double *)m)[r], inv = 1.0 / (((const double *)l)[r] + p->eps * exp(-mr));
            double *orow = (double *)o + r * p->d_v;
            for (int64_t c = 0; c < p->d_v; c++) orow[c] *= inv;
            ((double *)m_out)[r] = mr;
            ((double *)inv_out)[r] = inv;
        } else {
            float mr = ((const float *)m)[r];
            float inv = (float)(1.0 / ((double)((const float *)l)[r] + p->eps * exp(-(double)mr)));
            float *orow = (float *)o + r * p->d_v;
            for (int64_t c = 0; c < p->d_v; c++) orow[c] *= inv;
            ((float *)m_out)[r] = mr;
            ((float *)inv_out)[r] = inv;
        }
    }
}

// O /= l,  L = m + log(l);  O = 0, L = -inf where no key was kept (l = 0)
static void finish_rows(const plan *p, void *o, int64_t rows, const void *m, const void *l, void *lse) {
    for (int64_t r = 0; r < rows; r++) {
        if (p->f64) {
            double lr = ((const double *)l)[r], *orow = (double *)o + r * p->d_v;
            for (int64_t c = 0; c < p->d_v; c++) orow[c] = lr == 0.0 ? 0.0 : orow[c] / lr;
            ((double *)lse)[r] = lr == 0.0 ? -INFINITY : ((const double *)m)[r] + log(lr);
        } else {
            float lr = ((const float *)l)[r], *orow = (float *)o + r * p->d_v;
            for (int64_t c = 0; c < p->d_v; c++) orow[c] = lr == 0.0f ? 0.0f : orow[c] / lr;
            ((float *)lse)[r] = lr == 0.0f ? -INFINITY : ((const float *)m)[r] + logf(lr);
        }
    }
}

/* P is kept from the forward for the backward (which then reads it where it would recompute S = Q K^T and
 * exp(s S - L): one of its five products and its exps) when the forward's keys fit one tile (n_k <= BC_F, so
 * its P is final once the row's l is known) and P is no larger than Q, K and V together (B n_q n_k <= B
 * (n_q d_k + n_k (d_k + d_v)): its memory never more than the inputs'). */
static bool keeps_p(const plan *p) {
    double inputs = (double)p->n_q * (double)p->d_k + (double)p->n_k * (double)(p->d_k + p->d_v);
    return qkv_attn_keep_p_allowed_() && p->n_k <= BC_F && p->cap == 0 &&
           (double)p->n_q * (double)p->n_k <= inputs;
}

// A[r, c] = P[r, c] / l[r] over the keys row r keeps, 0 elsewhere and where l = 0 (nothing kept): what the
// backward's exp(s S - L) gives, to rounding (a dropped key is 0 even in a NaN row). t: the tile computed
// (keys 0 .. t->cols), or NULL when none was (every key dropped).
static void keep_p_rows(const plan *p, const void *s, const qkv_attn_tile_ *t, const void *l, int64_t rows, void *a) {
    int64_t cols = t ? t->cols : 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t len = t ? qkv_tile_row_len_(t, r) : 0;
        const uint8_t *mrow = t && t->mask ? t->mask + r * t->mask_ld : NULL;
        if (p->f64) {
            const double *srow = (const double *)s + r * cols;
            double lr = ((const double *)l)[r], *arow = (double *)a + r * p->n_k;
            for (int64_t c = 0; c < p->n_k; c++)
                arow[c] = c < len && (!mrow || mrow[c]) && lr != 0.0 ? srow[c] / lr : 0.0;
        } else {
            const float *srow = (const float *)s + r * cols;
            float lr = ((const float *)l)[r], *arow = (float *)a + r * p->n_k;
            for (int64_t c = 0; c < p->n_k; c++)
                arow[c] = c < len && (!mrow || mrow[c]) && lr != 0.0f ? srow[c] / lr : 0.0f;
        }
    }
}

// A[r, c] = the tile's s[r, c] over the keys of the one key tile t (0 past it, and everywhere when t is NULL):
// the sigmoid's final weights P, or softpick's scores S = Q K^T (its backward then starts from them)
static void keep_tile_rows(const plan *p, const void *s, const qkv_attn_tile_ *t, int64_t rows, void *a) {
    int64_t cols = t ? t->cols : 0;
    for (int64_t r = 0; r < rows; r++) {
        memcpy(at(p, a, r * p->n_k), at(p, s, r * cols), (size_t)cols * p->es);
        memset(at(p, a, r * p->n_k + cols), 0, (size_t)(p->n_k - cols) * p->es);
    }
}

/* One forward task: batch b, query block i. */
static void fwd_block(const plan *p, const fwd_io *io, int64_t task, int tid) {
    int64_t nqb = blocks(p->n_q, BR_F);
    int64_t b = task / nqb, i0 = (task % nqb) * BR_F, rows = min64(BR_F, p->n_q - i0);
    int64_t kb = b / p->group; /* the K and V row this query row reads */
    int64_t bc = min64(BC_F, p->n_k);
    double sc = kernel_scale(p);
    unsigned char *scratch = io->scratch + (size_t)tid * io->scratch_stride;
    void *s = scratch, *m = at(p, s, BR_F * bc), *l = at(p, m, BR_F);
    const void *q_i = at(p, io->q, (b * p->n_q + i0) * p->d_k);
    void *o = at(p, io->out, (b * p->n_q + i0) * p->d_v);
    memset(o, 0, (size_t)(rows * p->d_v) * p->es);
    init_rows(p, m, l, rows, b);
    int64_t kend = p->causal ? min64(p->n_k, i0 + rows) : p->n_k; /* causal: no key past the last query */
    qkv_attn_tile_ kept_tile = {0};
    bool computed = false; /* with P kept (one key tile): kept_tile was computed */
    for (int64_t j0 = 0; j0 < kend; j0 += bc) {
        int64_t cols = min64(bc, kend - j0);
        qkv_attn_tile_ t = tile_of(p, b, i0, j0, rows, cols);
        if (!tile_any_kept(&t)) continue;
        kept_tile = t, computed = true;
        const void *k_j = at(p, io->k, (kb * p->n_k + j0) * p->d_k);
        const void *v_j = at(p, io->v, (kb * p->n_k + j0) * p->d_v);
        // S = Q_i K_j^T                       [rows, cols]
        gemm_abt(p, q_i, k_j, s, rows, p->d_k, cols);
        // soft-cap: S = cap tanh(s S / cap) over the kept keys (the kernels below then take scale 1)
        if (p->cap > 0) softcap_tile(p, s, &t, NULL);
        if (p->variant == QKV_ATTN_SIGMOID) {
            // P = sigma(s S + b)
            if (p->f64) sigmoid_p_f64(s, &t, sc, p->bias);
            else qkv_attn_variant_(p->ks, sigmoid_p)(s, &t, (float)sc, (float)p->bias);
        } else if (p->variant == QKV_ATTN_SOFTPICK) {
            // A = S (kept: the backward's P needs the final m and l, and the sign of S where P is 0)
            if (io->a) keep_tile_rows(p, s, &t, rows, at(p, io->a, (b * p->n_q + i0) * p->n_k));
            // P = relu(exp(s S - m') - exp(-m')), l' = exp(m - m') l + rowsum(|exp(s S - m') - exp(-m')|), O *= exp(m - m')
            if (p->f64) softpick_fwd_tile_f64(s, &t, sc, m, l, o, p->d_v);
            else qkv_attn_variant_(p->ks, softpick_fwd_tile)(s, &t, (float)sc, m, l, o, p->d_v, p->d_v);
        } else {
            // P = exp(s S - m'), l' = exp(m - m') l + rowsum(P), O *= exp(m - m')
            if (p->f64) p->ks64->fwd_tile(s, &t, sc, m, l, o, p->d_v);
            else p->ks->fwd_tile(s, &t, (float)sc, m, l, o, p->d_v, p->d_v);
        }
        // O += P V_j                          [rows, d_v]  (a V row with inf or NaN: only where P != 0)
        if (block_has_bad(p, kb, j0, cols, BAD_V, v_j)) gemm_skip_zeros(p, s, v_j, o, rows, cols, p->d_v);
        else gemm_ab_add(p, s, v_j, o, rows, cols, p->d_v);
    }
    if (p->variant == QKV_ATTN_SIGMOID) { /* no normaliser: O = sum_c P V is final, and so is P */
        // A = P (keys past the tile, and every key when no tile was computed: 0)
        if (io->a) keep_tile_rows(p, s, computed ? &kept_tile : NULL, rows, at(p, io->a, (b * p->n_q + i0) * p->n_k));
        return;
    }
    if (p->variant == QKV_ATTN_SOFTPICK) {
        if (io->a && !computed) keep_tile_rows(p, s, NULL, rows, at(p, io->a, (b * p->n_q + i0) * p->n_k));
        // O /= (l + eps e^-m); keep m (in L's place) and 1 / (l + eps e^-m)
        finish_softpick_rows(p, o, rows, m, l, at(p, io->lse, b * p->n_q + i0), at(p, io->inv, b * p->n_q + i0));
        return;
    }
    // O /= l, L = m + log(l)
    finish_rows(p, o, rows, m, l, at(p, io->lse, b * p->n_q + i0));
    if (io->a) keep_p_rows(p, s, computed ? &kept_tile : NULL, l, rows, at(p, io->a, (b * p->n_q + i0) * p->n_k));
}

/* Per-thread scratch: `count` slices of `bytes` each, 64-byte aligned, from the step arena. */
static unsigned char *thread_scratch(qkv_ctx *ctx, const char *fn, int count, size_t bytes, size_t *stride) {
    *stride = (bytes + QKV_ALIGN - 1) / QKV_ALIGN * QKV_ALIGN;
    if (*stride == 0) *stride = QKV_ALIGN;
    return qkv_arena_array_(ctx, fn, (size_t)count, *stride);
}

/* The flops of one pass (forward or backward, each a few GEMMs of this size): 2 B n_q n_k (d_k + d_v). */
static double plan_flops(const plan *p) {
    return 2.0 * (double)p->batch * (double)p->n_q * (double)p->n_k * (double)(p->d_k + p->d_v);
}

/* Threads for `tasks` tasks: at most one a task, and each with at least QKV_GRAIN_FLOPS_ of the work (a call
 * below the grain runs on the calling thread, with no OpenMP region; attention_kernels.h says why). */
static int threads_for(const plan *p, int64_t tasks) {
    int nt = qkv_grain_threads_(p->threads, tasks, plan_flops(p), QKV_GRAIN_FLOPS_);
    if (nt > 1) qkv_parallel_region_opened_();
    return nt;
}

static inline int thread_id(void) {
#ifdef QKV_HAVE_OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The short path: f32, the softmax uncapped and ungrouped, no mask, n_k within the kernel set's short_keys and
 * d_k, d_v within its short_dims (AVX-512: n_k <= 16, d_k, d_v <= 32; AVX2: n_k <= 64, d_k, d_v <= 16). Each
 * batch element is then one kernel call with K^T and V^T held in registers, where the tiled path would make
 * seven tiny GEMM calls and a dozen row-kernel calls. */
static bool short_path(const plan *p) {
    int64_t keys = p->f64 ? 0 : p->ks->short_keys, dims = p->f64 ? 0 : p->ks->short_dims;
    return keys > 0 && qkv_attn_short_allowed_() && p->variant == QKV_ATTN_SOFTMAX && p->cap == 0 && p->group == 1 &&
           !p->mask && p->n_k >= 1 && p->n_k <= keys && p->d_k >= 1 && p->d_k <= dims && p->d_v >= 1 &&
           p->d_v <= dims;
}

/* The short path runs one kernel call per batch element, each writing only its own rows: on one thread in
 * a plain loop (no OpenMP region at all, whose start alone costs about a microsecond), else spread
 * statically over the threads. */
static void each_batch_element(const plan *p, void (*one)(const plan *p, const void *job, int64_t b),
                               const void *job) {
    int nt = threads_for(p, p->batch);
    if (nt <= 1) {
        for (int64_t b = 0; b < p->batch; b++) one(p, job, b);
        return;
    }
#ifdef QKV_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(nt)
#endif
    for (int64_t b = 0; b < p->batch; b++) one(p, job, b);
}

/* The short path's forward: its inputs and outputs, A [B, n_q, n_k] into a when it is not NULL. */
typedef struct short_fwd_job {
    const float *q, *k, *v;
    float *out, *a;
} short_fwd_job;

static void short_forward_one(const plan *p, const void *job, int64_t b) {
    const short_fwd_job *j = job;
    p->ks->short_fwd(j->q + b * p->n_q * p->d_k, j->k + b * p->n_k * p->d_k, j->v + b * p->n_k * p->d_v,
                     j->out + b * p->n_q * p->d_v, j->a ? j->a + b * p->n_q * p->n_k : NULL, p->n_q, p->n_k,
                     p->d_k, p->d_v, (float)p->scale, p->causal);
}

/* What the fused forward keeps for the backward: on the tiled path L, on the short path A itself (n_k <= 64
 * floats per query), and on the tiled path A too when it is small (keeps_p), so that the backward reads P
 * instead of recomputing it. */
typedef struct fused_saved {
    bool short_path;    /* the forward took the short path (its backward then does too) */
    void *lse;          /* [B n_q] on the tiled path, else NULL */
    void *a;            /* A [B, n_q, n_k] in the dtype, kept for the backward: on the short path, and on the
                         * tiled path when keeps_p; else NULL */
    const uint8_t *bad; /* the plan's flags of non-finite K and V rows (tiled path), or NULL  */
    bool bad_in_place;  /* the plan's bad_in_place: no flags, blocks checked where used      */
    qkv_attn_variant variant; /* the plan's variant and its parameters, for the backward's plan     */
    const void *sink;   /* SINK: a copy of the logits [heads] as the forward used them           */
    int64_t heads, group;
    double bias, eps, cap;
    void *inv;          /* SOFTPICK: 1 / (l + eps e^-m) [B n_q]; lse then holds m                  */
} fused_saved;

/* out for every (batch, query block), on the short path or the tiled one (and L into s->lse); A into s->a
 * when it is not NULL; false on allocation failure (error stored). */
static bool fused_forward(qkv_ctx *ctx, const char *fn, const plan *p, const qkv_tensor *q, const qkv_tensor *k,
                          const qkv_tensor *v, qkv_tensor *out, const fused_saved *s, bool use_short) {
    void *lse = s->lse;
    if (use_short) { /* its kernels visit only the keys a query keeps: a K or V row there is never read */
        short_fwd_job job = {q->data, k->data, v->data, out->data, s->a};
        each_batch_element(p, short_forward_one, &job);
        return true;
    }
    int64_t tasks = p->batch * blocks(p->n_q, BR_F);
    int nt = threads_for(p, tasks);
    int64_t bc = min64(BC_F, p->n_k);
    fwd_io io = {q->data, k->data, v->data, out->data, lse, NULL, 0, s->a, s->inv};
    io.scratch = thread_scratch(ctx, fn, nt, (size_t)(BR_F * bc + 2 * BR_F) * p->es, &io.scratch_stride);
    if (!io.scratch) return false;
    if (nt <= 1) {
        for (int64_t task = 0; task < tasks; task++) fwd_block(p, &io, task, 0);
        return true;
    }
#ifdef QKV_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
#endif
    for (int64_t task = 0; task < tasks; task++) fwd_block(p, &io, task, thread_id());
    return true;
}

/* ---- the fused backward ------------------------------------------------------------------------- */

typedef struct bwd_io {
    const void *q, *k, *v, *out, *dout, *lse, *dsum;
    void *dq, *dk, *dv; /* NULL: not wanted */
    unsigned char *scratch; /* per thread: S/P tile, dP tile, dS strip */
    size_t scratch_stride;
    const void *a;          /* the forward's A [B, n_q, n_k] (fused_saved's a), or NULL */
    const void *inv;        /* softpick: the forward's 1 / (l + eps e^-m) [B n_q] (lse holds m) */
} bwd_io;

// D[r] = rowsum(dO * O)   (f32: products and sums in double, 8 lanes added in a fixed order, ops/row_sums.h:
// a single double accumulator was a serial chain of d adds, a sixth of the backward at n_k = 16)
static void row_dots(const plan *p, const void *dout, const void *out, void *dsum, int64_t rows) {
    if (!p->f64) {
        const float *dof = dout, *of = out;
        for (int64_t r = 0; r < rows; r++)
            ((float *)dsum)[r] = (float)dot8_f32(dof + r * p->d_v, of + r * p->d_v, p->d_v);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        double acc = 0.0;
        for (int64_t c = 0; c < p->d_v; c++) {
            int64_t i = r * p->d_v + c;
            acc += ((const double *)dout)[i] * ((const double *)out)[i];
        }
        ((double *)dsum)[r] = acc;
    }
}

/* Rows per chunk of the backward. */
static int64_t bwd_rows(const plan *p) { return min64(p->causal ? BR_B_CAUSAL : BR_B, p->n_q); }

/* The first query row of key block j0 that can keep a key (causal: row j0; else 0). */
static int64_t first_row(const plan *p, int64_t j0) { return p->causal ? min64(j0, p->n_q) : 0; }

/* Thread tid's backward scratch: the S/P tile, the dP tile (br x bcmax each), the dS strips (group of n_q x
 * bcmax, one a query row of the task, when dq is wanted), for softpick the tile of sign(x) E (part 3) and for
 * the soft-cap the tile of s (1 - t^2) (part 4). */
static void *bwd_scratch(const plan *p, const bwd_io *io, int tid, int part) {
    int64_t bcmax = min64(BC_B, p->n_k), tile = bwd_rows(p) * bcmax;
    int64_t offset = part < 3 ? part * tile : 2 * tile + (io->dq ? p->group * p->n_q * bcmax : 0);
    if (part == 4 && p->variant == QKV_ATTN_SOFTPICK) offset += tile;
    return at(p, io->scratch + (size_t)tid * io->scratch_stride, offset);
}

/* One backward task: K and V row kb, key block j. For each query row b = kb group + g that reads them, g in
 * order, adds into dK_j and dV_j and leaves dS of rows r0.. of b in strip g. */
static void bwd_block(const plan *p, const bwd_io *io, int64_t task, int tid) {
    int64_t nkb = blocks(p->n_k, BC_B);
    int64_t kb = task / nkb, j0 = (task % nkb) * BC_B, cols = min64(BC_B, p->n_k - j0);
    int64_t br = bwd_rows(p), bcmax = min64(BC_B, p->n_k);
    void *s = bwd_scratch(p, io, tid, 0), *dp = bwd_scratch(p, io, tid, 1), *strips = bwd_scratch(p, io, tid, 2);
    void *e = bwd_scratch(p, io, tid, 3); /* softpick only */
    void *g = bwd_scratch(p, io, tid, 4); /* soft-cap only: s (1 - t^2) of the tile */
    double sc = kernel_scale(p);
    const void *k_j = at(p, io->k, (kb * p->n_k + j0) * p->d_k);
    const void *v_j = at(p, io->v, (kb * p->n_k + j0) * p->d_v);
    void *dk_j = io->dk ? at(p, io->dk, (kb * p->n_k + j0) * p->d_k) : NULL;
    void *dv_j = io->dv ? at(p, io->dv, (kb * p->n_k + j0) * p->d_v) : NULL;
    bool need_ds = io->dq || io->dk;
    int64_t r0 = first_row(p, j0);
    for (int64_t b = kb * p->group; b < (kb + 1) * p->group; b++) { /* the query rows of kb, in order */
        void *strip = at(p, strips, (b - kb * p->group) * p->n_q * bcmax);
        for (int64_t i0 = r0; i0 < p->n_q; i0 += br) {
            int64_t rows = min64(br, p->n_q - i0), row = b * p->n_q + i0;
            /* causal: keys past the chunk's last query are dropped for all its rows; the tile stops there */
            int64_t tc = p->causal ? min64(cols, i0 + rows - j0) : cols;
            void *strip_i = io->dq ? at(p, strip, (i0 - r0) * cols) : NULL; /* dS rows, leading dim cols */
            void *ds = strip_i && tc == cols ? strip_i : dp; /* else dS replaces dP in place, copied below */
            qkv_attn_tile_ t = tile_of(p, b, i0, j0, rows, tc);
            if (!tile_any_kept(&t)) {
                if (strip_i) memset(strip_i, 0, (size_t)(rows * cols) * p->es);
                continue;
            }
            const void *q_i = at(p, io->q, row * p->d_k), *do_i = at(p, io->dout, row * p->d_v);
            const void *lse_i = at(p, io->lse, row), *d_i = io->dsum ? at(p, io->dsum, row) : NULL;
            bool softpick = p->variant == QKV_ATTN_SOFTPICK;
            if (io->a) { /* P = A (softpick: S = A), kept by the forward: rows i0.., keys j0 .. j0+tc */
                for (int64_t r = 0; r < rows; r++)
                    memcpy(at(p, s, r * tc), at(p, io->a, (row + r) * p->n_k + j0), (size_t)tc * p->es);
            } else {
                // S = Q_i K_j^T                       [rows, tc]
                gemm_abt(p, q_i, k_j, s, rows, p->d_k, tc);
            }
            // soft-cap: t = tanh(s S / cap), S = cap t, g = s (1 - t^2)  (never with a kept A)
            if (p->cap > 0) softcap_tile(p, s, &t, g);
            if (!io->a || softpick) {
                if (p->variant == QKV_ATTN_SIGMOID) {
                    // P = sigma(s S + b)
                    if (p->f64) sigmoid_p_f64(s, &t, sc, p->bias);
                    else qkv_attn_variant_(p->ks, sigmoid_p)(s, &t, (float)sc, (float)p->bias);
                } else if (p->variant == QKV_ATTN_SOFTPICK) {
                    // E = exp(s S - m) inv,  P = relu(E - exp(-m) inv),  e = sign(s S) E    (lse holds m)
                    const void *inv_i = at(p, io->inv, row);
                    if (p->f64) softpick_bwd_p_f64(s, &t, sc, lse_i, inv_i, e);
                    else qkv_attn_variant_(p->ks, softpick_bwd_p)(s, &t, (float)sc, lse_i, inv_i, e);
                } else {
                    // P = exp(s S - L)
                    if (p->f64) p->ks64->bwd_p(s, &t, sc, lse_i);
                    else p->ks->bwd_p(s, &t, (float)sc, lse_i);
                }
            }
            // dV_j += P^T dO_i                    [tc, d_v]
            if (dv_j) gemm_atb_add(p, s, do_i, dv_j, tc, rows, p->d_v);
            if (!need_ds) continue;
            // dP = dO_i V_j^T                     [rows, tc]
            gemm_abt(p, do_i, v_j, dp, rows, p->d_v, tc);
            if (p->variant == QKV_ATTN_SIGMOID) {
                // dS = s P (1 - P) dP
                if (p->f64) sigmoid_ds_f64(s, dp, &t, sc, ds);
                else qkv_attn_variant_(p->ks, sigmoid_ds)(s, dp, &t, (float)sc, ds);
            } else if (p->variant == QKV_ATTN_SOFTPICK) {
                // dS = s (e > 0 ? e (dP - D) : -e D)
                if (p->f64) softpick_ds_f64(e, dp, &t, sc, d_i, ds);
                else qkv_attn_variant_(p->ks, softpick_ds)(e, dp, &t, (float)sc, d_i, ds);
            } else {
                // dS = s P (dP - D)
                if (p->f64) p->ks64->bwd_ds(s, dp, &t, sc, d_i, ds);
                else p->ks->bwd_ds(s, dp, &t, (float)sc, d_i, ds);
            }
            // soft-cap: dS = dS' s (1 - t^2)
            if (p->cap > 0) softcap_grad_tile(p, ds, &t, g);
            // dK_j += dS^T Q_i                    [tc, d_k]
            if (dk_j) gemm_atb_add(p, ds, q_i, dk_j, tc, rows, p->d_k);
            if (strip_i && ds != strip_i) /* a narrower tile: into the strip, zeros past tc */
                for (int64_t r = 0; r < rows; r++) {
                    memcpy(at(p, strip_i, r * cols), at(p, ds, r * tc), (size_t)tc * p->es);
                    memset(at(p, strip_i, r * cols + tc), 0, (size_t)(cols - tc) * p->es);
                }
        }
    }
}

/* dQ[rows r0..] += dS_strip K_j for the block of `task`, for each query row of its K and V row: the ordered
 * step. */
static void bwd_dq(const plan *p, const bwd_io *io, int64_t task, int tid) {
    int64_t nkb = blocks(p->n_k, BC_B);
    int64_t kb = task / nkb, j0 = (task % nkb) * BC_B, cols = min64(BC_B, p->n_k - j0);
    int64_t r0 = first_row(p, j0), bcmax = min64(BC_B, p->n_k);
    if (!io->dq || r0 >= p->n_q) return;
    const void *strips = bwd_scratch(p, io, tid, 2);
    const void *k_j = at(p, io->k, (kb * p->n_k + j0) * p->d_k);
    bool bad = block_has_bad(p, kb, j0, cols, BAD_K, k_j);
    for (int64_t g = 0; g < p->group; g++) {
        const void *strip = at(p, strips, g * p->n_q * bcmax);
        void *dq = at(p, io->dq, ((kb * p->group + g) * p->n_q + r0) * p->d_k);
        // dQ[r0:] += dS_strip K_j            [n_q - r0, d_k]  (a K row with inf or NaN: only where dS != 0)
        if (bad) gemm_skip_zeros(p, strip, k_j, dq, p->n_q - r0, cols, p->d_k);
        else gemm_ab_add(p, strip, k_j, dq, p->n_q - r0, cols, p->d_k);
    }
}

/* The tiled backward over (batch, key block) tasks; false on allocation failure (error stored). */
static bool tiled_backward(qkv_ctx *ctx, const char *fn, const plan *pl, bwd_io *io) {
    const plan p = *pl;
    // D = rowsum(dO * O)   (sigmoid needs none; the sink's gradient may have made it already)
    if (!io->dsum && p.variant != QKV_ATTN_SIGMOID) {
        void *dsum = qkv_arena_array_(ctx, fn, (size_t)(p.batch * p.n_q), p.es);
        if (!dsum) return false;
        row_dots(&p, io->dout, io->out, dsum, p.batch * p.n_q);
        io->dsum = dsum;
    }
    /* Tasks are (kb, j) in order, kb a row of K and V (a batch element; with grouped-query attention the
     * shared row of `group` query rows, which one task visits in order, so that dK and dV add their
     * contributions in one order); each runs bwd_block then bwd_dq. With K and V rows that split evenly over
     * the threads, each thread takes whole rows and runs their tasks in order; otherwise the tasks are
     * shared out one by one and bwd_dq runs in an ordered section. Both do, for each row, the same
     * operations in the same order as one thread: the same bits. */
    int64_t kv_batch = p.batch / p.group, nkb = blocks(p.n_k, BC_B), tasks = kv_batch * nkb;
    int nt = threads_for(&p, tasks);
    bool by_batch = nt > 1 && (kv_batch % nt == 0 || kv_batch >= 4 * (int64_t)nt);
    int64_t br = bwd_rows(&p), bcmax = min64(BC_B, p.n_k);
    int64_t per_thread = 2 * br * bcmax + (io->dq ? p.group * p.n_q * bcmax : 0) + (p.variant == QKV_ATTN_SOFTPICK ? br * bcmax : 0) +
                         (p.cap > 0 ? br * bcmax : 0);
    io->scratch = thread_scratch(ctx, fn, nt, (size_t)per_thread * p.es, &io->scratch_stride);
    if (!io->scratch) return false;
    if (nt <= 1) {
        for (int64_t task = 0; task < tasks; task++) {
            bwd_block(&p, io, task, 0);
            bwd_dq(&p, io, task, 0);
        }
    } else if (by_batch) {
#ifdef QKV_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
#endif
        for (int64_t kb = 0; kb < kv_batch; kb++) {
            int tid = thread_id();
            for (int64_t task = kb * nkb; task < (kb + 1) * nkb; task++) {
                bwd_block(&p, io, task, tid);
                bwd_dq(&p, io, task, tid);
            }
        }
    } else {
#ifdef QKV_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) ordered num_threads(nt)
#endif
        for (int64_t task = 0; task < tasks; task++) {
            int tid = thread_id();
            bwd_block(&p, io, task, tid);
#ifdef QKV_HAVE_OPENMP
#pragma omp ordered
#endif
            bwd_dq(&p, io, task, tid); /* in task order: dQ's sums have one order */
        }
    }
    return true;
}

/* The short path's backward of batch element b, from the forward's A (io->a). */
static void short_backward_one(const plan *p, const void *job, int64_t b) {
    const bwd_io *io = job;
    const float *a = (const float *)io->a;
    int64_t qk = b * p->n_q * p->d_k, kk = b * p->n_k * p->d_k, kv = b * p->n_k * p->d_v;
    int64_t ov = b * p->n_q * p->d_v;
    p->ks->short_bwd((const float *)io->q + qk, (const float *)io->k + kk, (const float *)io->v + kv,
                     (const float *)io->out + ov, (const float *)io->dout + ov, a + b * p->n_q * p->n_k,
                     io->dq ? (float *)io->dq + qk : NULL,
                     io->dk ? (float *)io->dk + kk : NULL, io->dv ? (float *)io->dv + kv : NULL, p->n_q, p->n_k,
                     p->d_k, p->d_v, (float)p->scale, p->causal);
}

// d b_h = -sum over the rows r of the batch elements of head h of exp(b_h - L_r) D_r   (in batch and row
// order, summed in double: the same bits for any thread count; a row with L = -inf adds nothing)
static void sink_gradient(const plan *p, const void *lse, const void *dsum, qkv_tensor *gsink) {
    for (int64_t h = 0; h < p->heads; h++) {
        double acc = 0.0;
        double b = p->f64 ? ((const double *)p->sink)[h] : (double)((const float *)p->sink)[h];
        for (int64_t bi = h; bi < p->batch; bi += p->heads)
            for (int64_t r = bi * p->n_q; r < (bi + 1) * p->n_q; r++) {
                double lr = p->f64 ? ((const double *)lse)[r] : (double)((const float *)lse)[r];
                double dr = p->f64 ? ((const double *)dsum)[r] : (double)((const float *)dsum)[r];
                if (lr != -INFINITY) acc -= exp(b - lr) * dr;
            }
        if (p->f64) ((double *)gsink->data)[h] += acc;
        else ((float *)gsink->data)[h] += (float)acc;
    }
}

static void fused_backward(qkv_ctx *ctx, qkv_node_ *node) {
    const char *fn = node->op;
    qkv_tensor *q = node->in[0], *k = node->in[1], *v = node->in[2], *sink = node->n_in > 3 ? node->in[3] : NULL;
    const qkv_tensor *out = node->out, *mask = node->aux;
    bool want_q = qkv_wants_grad_(q), want_k = qkv_wants_grad_(k), want_v = qkv_wants_grad_(v);
    bool want_sink = sink && qkv_wants_grad_(sink);
    if (!want_q && !want_k && !want_v && !want_sink) return;
    const fused_saved *saved = node->saved;
    plan p;
    plan_init(&p, ctx, q, k, v, node->scalar, node->flags);
    p.variant = saved->variant;
    p.sink = saved->sink;
    p.heads = saved->heads;
    p.bias = saved->bias;
    p.eps = saved->eps;
    p.cap = saved->cap;
    p.group = saved->group;
    if (mask) { /* the forward's own copy */
        p.mask = mask->data;
        p.mask_batch = mask->ndim == 3 ? mask->shape[0] : 1;
        p.mask_rows = mask->shape[mask->ndim - 2];
    }
    qkv_tensor *gq = want_q ? qkv_grad_of_(ctx, q) : NULL;
    qkv_tensor *gk = want_k ? qkv_grad_of_(ctx, k) : NULL;
    qkv_tensor *gv = want_v ? qkv_grad_of_(ctx, v) : NULL;
    qkv_tensor *gsink = want_sink ? qkv_grad_of_(ctx, sink) : NULL;
    if ((want_q && !gq) || (want_k && !gk) || (want_v && !gv) || (want_sink && !gsink)) return;
    p.bad = saved->bad;
    p.bad_in_place = saved->bad_in_place;
    bwd_io io = {q->data, k->data, v->data, out->data, out->grad->data, saved->lse, NULL,
                 gq ? gq->data : NULL, gk ? gk->data : NULL, gv ? gv->data : NULL, NULL, 0, saved->a, saved->inv};
    if (want_sink) { /* the sink is the tiled path's (never the short one); D first, which the tiles reuse */
        // D = rowsum(dO * O)
        void *dsum = qkv_arena_array_(ctx, fn, (size_t)(p.batch * p.n_q), p.es);
        if (!dsum) return;
        row_dots(&p, io.dout, io.out, dsum, p.batch * p.n_q);
        io.dsum = dsum;
        sink_gradient(&p, saved->lse, dsum, gsink);
        if (!gq && !gk && !gv) return;
    }
    /* q, k or v passed twice (attention(x, x, x)): dQ is added by every task, so dK and dV must not share
     * its storage while tasks run; they go to zeroed buffers added in afterwards. */
    void *dk_into = NULL, *dv_into = NULL;
    if (io.dk && io.dk == io.dq) {
        dk_into = io.dk;
        io.dk = qkv_arena_array_(ctx, fn, (size_t)k->numel, p.es);
        if (!io.dk) return;
        memset(io.dk, 0, (size_t)k->numel * p.es);
    }
    if (io.dv && io.dv == io.dq) {
        dv_into = io.dv;
        io.dv = qkv_arena_array_(ctx, fn, (size_t)v->numel, p.es);
        if (!io.dv) return;
        memset(io.dv, 0, (size_t)v->numel * p.es);
    }
    if (saved->short_path) { /* from the A its forward kept (its kernel forms D itself) */
        each_batch_element(&p, short_backward_one, &io);
    } else if (!tiled_backward(ctx, fn, &p, &io)) {
        return;
    }
    if (dk_into)
        for (int64_t i = 0; i < k->numel; i++) {
            if (p.f64) ((double *)dk_into)[i] += ((double *)io.dk)[i];
            else ((float *)dk_into)[i] += ((float *)io.dk)[i];
        }
    if (dv_into)
        for (int64_t i = 0; i < v->numel; i++) {
            if (p.f64) ((double *)dv_into)[i] += ((double *)io.dv)[i];
            else ((float *)dv_into)[i] += ((float *)io.dv)[i];
        }
}

/* The variant of one fused call and its parameters (already checked). */
typedef struct variant_args {
    qkv_attn_variant variant; /* SOFTMAX, SOFTMAX1, SINK, SIGMOID or SOFTPICK */
    qkv_tensor *sink;         /* SINK: [heads] logits, else NULL */
    int64_t heads;
    double bias, eps;         /* SIGMOID's b, SOFTPICK's eps */
    double cap;               /* options.softcap, 0 = off */
    int64_t group;            /* heads / kv_heads: query rows per K and V row (1: no grouping) */
} variant_args;

static const variant_args SOFTMAX_ARGS = {QKV_ATTN_SOFTMAX, NULL, 1, 0.0, 0.0, 0.0, 1};

/* The fused path: validate the mask and flags, run the forward, record one node. */
static qkv_tensor *fused_attention(qkv_ctx *ctx, const char *fn, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                   const qkv_tensor *mask, double scale, int flags, const variant_args *va) {
    if (flags & ~QKV_CAUSAL)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: q is %s, k is %s: flags 0x%x has unknown bits (only QKV_CAUSAL)",
                         fn, QKV_SHAPE(q), QKV_SHAPE(k), (unsigned)flags);
    plan p;
    plan_init(&p, ctx, q, k, v, scale, flags);
    if (mask && !check_mask(ctx, fn, q, k, mask, &p)) return NULL;
    qkv_tensor *out = q->ndim == 3
                          ? qkv_new_tensor_(ctx, fn, q->dtype, 3, (int64_t[]){p.batch, p.n_q, p.d_v})
                          : qkv_new_tensor_(ctx, fn, q->dtype, 2, (int64_t[]){p.n_q, p.d_v});
    qkv_tensor *in[4] = {q, k, v, va->sink};
    int n_in = va->sink ? 4 : 3;
    bool recording = qkv_needs_grad_(ctx, in, n_in);
    fused_saved *saved = out ? qkv_arena_alloc_(ctx, fn, sizeof *saved) : NULL;
    if (!saved) return NULL;
    p.variant = va->variant;
    p.heads = va->heads;
    p.bias = va->bias;
    p.eps = va->eps;
    p.cap = va->cap;
    p.group = va->group;
    saved->group = va->group;
    saved->variant = va->variant;
    saved->heads = va->heads;
    saved->bias = va->bias;
    saved->eps = va->eps;
    saved->cap = va->cap;
    saved->sink = NULL;
    saved->inv = NULL;
    if (va->sink) { /* a copy: the backward differentiates at the logits the forward used */
        void *copy = qkv_arena_array_(ctx, fn, (size_t)va->heads, p.es);
        if (!copy) return NULL;
        memcpy(copy, va->sink->data, (size_t)va->heads * p.es);
        saved->sink = p.sink = copy;
    }
    bool use_short = short_path(&p); /* decided once, for both passes */
    bool keep_a = recording && (use_short || keeps_p(&p));
    saved->short_path = use_short;
    saved->lse = use_short ? NULL : qkv_arena_array_(ctx, fn, (size_t)(p.batch * p.n_q), p.es);
    saved->a = keep_a ? qkv_arena_array_(ctx, fn, (size_t)(p.batch * p.n_q * p.n_k), p.es) : NULL;
    if ((!use_short && !saved->lse) || (keep_a && !saved->a)) return NULL;
    if (p.variant == QKV_ATTN_SOFTPICK) {
        saved->inv = qkv_arena_array_(ctx, fn, (size_t)(p.batch * p.n_q), p.es);
        if (!saved->inv) return NULL;
    }
    p.bad_in_place = !use_short && check_in_place(&p);
    if (!use_short && !p.bad_in_place && !find_bad_keys(ctx, fn, &p, k->data, v->data)) return NULL;
    saved->bad = p.bad;
    saved->bad_in_place = p.bad_in_place;
    if (!fused_forward(ctx, fn, &p, q, k, v, out, saved, use_short)) return NULL;

    if (recording) {
        /* which keys each query keeps: a copy, as the caller may change or free the mask before the backward */
        qkv_tensor *kept_mask = mask ? qkv_new_like_(ctx, fn, mask) : NULL;
        if (mask && !kept_mask) return NULL;
        if (mask) memcpy(kept_mask->data, mask->data, (size_t)mask->numel);
        qkv_node_ *node = qkv_record_(ctx, fn, fused_backward, out, in, n_in);
        if (!node) return NULL;
        node->scalar = scale;
        node->flags = flags;
        node->aux = kept_mask;
        node->saved = saved; /* L on the tiled path, A on the short path and when kept; out is node->out */
    }
    return out;
}

qkv_tensor *qkv_attention_composed_(qkv_ctx *ctx, const char *fn, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                    const qkv_tensor *mask, double scale, int flags, qkv_tensor **attn) {
    if (attn) *attn = NULL;
    if (!ctx || ctx->status || !check_qkv(ctx, fn, q, k, v)) return NULL;
    double s;
    if (!resolve_scale(ctx, fn, q, k, scale, &s)) return NULL;
    qkv_tensor *scores = qkv_matmul(ctx, q, k, QKV_TRANS_B); // S = Q K^T
    qkv_tensor *scaled = qkv_scale(ctx, scores, s);            // S' = s S
    qkv_tensor *a = qkv_softmax(ctx, scaled, mask, flags);     // A = softmax(S') by rows
    qkv_tensor *out = qkv_matmul(ctx, a, v, 0);                // out = A V
    qkv_name_caller_(ctx, fn);
    if (!out) return NULL;
    if (attn) *attn = a;
    return out;
}

qkv_tensor *qkv_attention(qkv_ctx *ctx, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v, const qkv_tensor *mask,
                          double scale, int flags, qkv_tensor **attn) {
    const char *fn = "qkv_attention";
    if (attn) *attn = NULL;
    if (!ctx || ctx->status || !check_qkv(ctx, fn, q, k, v)) return NULL;
    double s;
    if (!resolve_scale(ctx, fn, q, k, scale, &s)) return NULL;
    qkv_tensor *out = fused_attention(ctx, fn, q, k, v, mask, s, flags, &SOFTMAX_ARGS);
    if (!out || !attn) return out;
    /* A, asked for beside the fused out (which never reads a dropped key): A = softmax(s Q K^T) by rows. The
     * operators name themselves in an error (an allocation that fails), so the message is given the name of
     * the function the user called in front. */
    qkv_tensor *a = qkv_softmax(ctx, qkv_scale(ctx, qkv_matmul(ctx, q, k, QKV_TRANS_B), s), mask, flags);
    qkv_name_caller_(ctx, fn);
    if (!a) return NULL;
    *attn = a;
    return out;
}

/* ---- attention variants: qkv_attention_ex (include/qkv/attention.h) -------------------------------- */

static const char *const VARIANT_NAMES[QKV_ATTN_VARIANT_COUNT] = {"softmax", "softmax1", "sink",
                                                                  "sigmoid", "ssmax",    "softpick"};

const char *qkv_attn_variant_name(qkv_attn_variant variant) {
    return (int)variant >= 0 && variant < QKV_ATTN_VARIANT_COUNT ? VARIANT_NAMES[variant] : NULL;
}

bool qkv_attn_variant_from_name(const char *name, qkv_attn_variant *variant) {
    if (!name || !variant) return false;
    for (int i = 0; i < QKV_ATTN_VARIANT_COUNT; i++)
        if (!strcmp(name, VARIANT_NAMES[i])) {
            *variant = (qkv_attn_variant)i;
            return true;
        }
    return false;
}

qkv_attention_options qkv_attention_default_options(void) {
    qkv_attention_options o;
    memset(&o, 0, sizeof o);
    o.variant = QKV_ATTN_SOFTMAX;
    o.scale = QKV_SCALE_DEFAULT;
    o.heads = 1;
    o.sigmoid_bias = NAN;
    o.softpick_eps = 1e-6;
    return o;
}

/* A per-head parameter tensor the variant needs (sink, ssmax_c): present, q's float dtype, [heads]. */
static bool check_head_param(qkv_ctx *ctx, const char *fn, const qkv_tensor *q, const qkv_tensor *t,
                             const char *name, const char *variant, int heads) {
    if (!t)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: q is %s: variant %s needs options.%s, a [heads] = [%d] tensor; it is NULL",
                         fn, QKV_SHAPE(q), variant, name, heads),
               false;
    if (!qkv_check_float_(ctx, fn, name, t) || !qkv_check_same_dtype_(ctx, fn, q, "q", t, name)) return false;
    if (t->ndim != 1 || t->shape[0] != heads)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: q is %s, %s is %s: variant %s needs %s of shape [heads] = [%d]", fn,
                         QKV_SHAPE(q), name, QKV_SHAPE(t), variant, name, heads),
               false;
    return true;
}

/* Query heads per key/value head of the options: heads / kv_heads, 1 without grouping (kv_heads 0 or heads). */
static int64_t kv_group(const qkv_attention_options *o) {
    return o->kv_heads > 0 && o->kv_heads != o->heads && o->heads % o->kv_heads == 0 ? o->heads / o->kv_heads : 1;
}

/* The options of qkv_attention_ex, checked, into va (SSMax's c into *ssmax_c); false with the error stored. */
static bool check_options(qkv_ctx *ctx, const char *fn, const qkv_tensor *q, const qkv_tensor *k,
                          const qkv_attention_options *o, variant_args *va, qkv_tensor **ssmax_c) {
    int64_t batch = q->ndim == 3 ? q->shape[0] : 1, n_k = k->shape[k->ndim - 2];
    if ((int)o->variant < 0 || o->variant >= QKV_ATTN_VARIANT_COUNT)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: q is %s, k is %s: variant %d is not a qkv_attn_variant (0 .. %d)", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), (int)o->variant, QKV_ATTN_VARIANT_COUNT - 1),
               false;
    const char *name = VARIANT_NAMES[o->variant];
    if (o->heads < 1 || batch % o->heads != 0)
        return qkv_fail_(ctx, QKV_ERR_SHAPE, "%s: q is %s, k is %s: heads %d does not divide the batch %lld", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), o->heads, (long long)batch),
               false;
    if (!isfinite(o->softcap) || o->softcap < 0.0)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: q is %s, k is %s: softcap %g must be finite and >= 0 (0 = off)", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), o->softcap),
               false;
    *va = (variant_args){o->variant, NULL, o->heads, 0.0, 0.0, o->softcap, kv_group(o)};
    *ssmax_c = NULL;
    switch (o->variant) {
    case QKV_ATTN_SINK:
        if (!check_head_param(ctx, fn, q, o->sink, "sink", name, o->heads)) return false;
        va->sink = o->sink;
        break;
    case QKV_ATTN_SSMAX:
        if (!check_head_param(ctx, fn, q, o->ssmax_c, "ssmax_c", name, o->heads)) return false;
        *ssmax_c = o->ssmax_c;
        va->variant = QKV_ATTN_SOFTMAX; /* the softmax of the scaled q */
        break;
    case QKV_ATTN_SIGMOID:
        if (isinf(o->sigmoid_bias))
            return qkv_fail_(ctx, QKV_ERR_ARG,
                             "%s: q is %s, k is %s: sigmoid_bias %g is not finite (NaN means -log(n_k))", fn,
                             QKV_SHAPE(q), QKV_SHAPE(k), o->sigmoid_bias),
                   false;
        // b = -log(n_k) by default (0 when there is no key: every row is empty then)
        va->bias = isnan(o->sigmoid_bias) ? (n_k > 0 ? -log((double)n_k) : 0.0) : o->sigmoid_bias;
        break;
    case QKV_ATTN_SOFTPICK:
        if (!isfinite(o->softpick_eps) || !(o->softpick_eps > 0.0))
            return qkv_fail_(ctx, QKV_ERR_ARG, "%s: q is %s, k is %s: softpick_eps %g must be finite and > 0", fn,
                             QKV_SHAPE(q), QKV_SHAPE(k), o->softpick_eps),
                   false;
        va->eps = o->softpick_eps;
        break;
    default:
        break;
    }
    return true;
}

/* SSMax's factor of each query row: log(n_i), n_i the keys row i of batch b keeps (mask and causal), into
 * logn [B n_q]; 0 where n_i is 0 or 1. */
static void keys_kept_log(const plan *p, double *logn) {
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->n_q; i++) {
            int64_t len = p->causal ? min64(i + 1, p->n_k) : p->n_k, n = len;
            if (p->mask) {
                qkv_attn_tile_ t = tile_of(p, b, i, 0, 1, p->n_k);
                n = 0;
                for (int64_t j = 0; j < len; j++) n += t.mask[j] != 0;
            }
            logn[b * p->n_q + i] = n > 1 ? log((double)n) : 0.0;
        }
}

typedef struct ssmax_saved {
    const double *logn; /* [B n_q] */
    const void *c;      /* a copy of c [heads] as the forward used it */
    int64_t heads, batch, n_q, d_k;
} ssmax_saved;

// dq_i += c_h log(n_i) dq'_i;  dc_h += sum over the rows i of the batch elements of head h of log(n_i) q_i . dq'_i
static void ssmax_backward(qkv_ctx *ctx, qkv_node_ *node) {
    qkv_tensor *q = node->in[0], *c = node->in[1];
    const ssmax_saved *sv = node->saved;
    const qkv_tensor *dqs = node->out->grad;
    bool f64 = q->dtype == QKV_F64;
    qkv_tensor *gq = qkv_wants_grad_(q) ? qkv_grad_of_(ctx, q) : NULL;
    qkv_tensor *gc = qkv_wants_grad_(c) ? qkv_grad_of_(ctx, c) : NULL;
    if ((qkv_wants_grad_(q) && !gq) || (qkv_wants_grad_(c) && !gc)) return;
    for (int64_t h = 0; h < sv->heads; h++) {
        double ch = f64 ? ((const double *)sv->c)[h] : (double)((const float *)sv->c)[h], acc = 0.0;
        for (int64_t b = h; b < sv->batch; b += sv->heads)
            for (int64_t i = 0; i < sv->n_q; i++) {
                int64_t row = b * sv->n_q + i, base = row * sv->d_k;
                double ln = sv->logn[row], dot = 0.0;
                if (f64) {
                    const double *x = (const double *)q->data + base, *g = (const double *)dqs->data + base;
                    for (int64_t e = 0; e < sv->d_k; e++) dot += x[e] * g[e];
                    if (gq)
                        for (int64_t e = 0; e < sv->d_k; e++) ((double *)gq->data)[base + e] += ch * ln * g[e];
                } else {
                    const float *x = (const float *)q->data + base, *g = (const float *)dqs->data + base;
                    float f = (float)(ch * ln);
                    for (int64_t e = 0; e < sv->d_k; e++) dot += (double)x[e] * g[e];
                    if (gq)
                        for (int64_t e = 0; e < sv->d_k; e++) ((float *)gq->data)[base + e] += f * g[e];
                }
                acc += ln * dot;
            }
        if (gc) {
            if (f64) ((double *)gc->data)[h] += acc;
            else ((float *)gc->data)[h] += (float)acc;
        }
    }
}

// q'_i = c_h log(n_i) q_i    q [B, n_q, d_k] -> q' [B, n_q, d_k], h = b % heads
static qkv_tensor *ssmax_scale_q(qkv_ctx *ctx, const char *fn, qkv_tensor *q, qkv_tensor *c, const plan *p) {
    double *logn = qkv_arena_array_(ctx, fn, (size_t)(p->batch * p->n_q), sizeof(double));
    qkv_tensor *qs = logn ? qkv_new_like_(ctx, fn, q) : NULL;
    void *c_copy = qs ? qkv_arena_array_(ctx, fn, (size_t)p->heads, p->es) : NULL;
    if (!c_copy) return NULL;
    memcpy(c_copy, c->data, (size_t)p->heads * p->es);
    keys_kept_log(p, logn);
    for (int64_t row = 0; row < p->batch * p->n_q; row++) {
        int64_t h = (row / p->n_q) % p->heads, base = row * p->d_k;
        if (p->f64) {
            double f = ((const double *)c_copy)[h] * logn[row];
            for (int64_t e = 0; e < p->d_k; e++) ((double *)qs->data)[base + e] = f * ((const double *)q->data)[base + e];
        } else {
            float f = (float)((double)((const float *)c_copy)[h] * logn[row]);
            for (int64_t e = 0; e < p->d_k; e++) ((float *)qs->data)[base + e] = f * ((const float *)q->data)[base + e];
        }
    }
    qkv_tensor *in[2] = {q, c};
    if (qkv_needs_grad_(ctx, in, 2)) {
        ssmax_saved *sv = qkv_arena_alloc_(ctx, fn, sizeof *sv);
        if (!sv) return NULL;
        *sv = (ssmax_saved){logn, c_copy, p->heads, p->batch, p->n_q, p->d_k};
        qkv_node_ *node = qkv_record_(ctx, fn, ssmax_backward, qs, in, 2);
        if (!node) return NULL;
        node->saved = sv;
    }
    return qs;
}

/* ---- the composed variants: the oracle of the tests, and attn of qkv_attention_ex ------------------- */

/* The u8 keep mask [B, n_q, n_k] of mask and causal (1 keep), with no gradient. */
static qkv_tensor *keep_mask(qkv_ctx *ctx, const char *fn, const plan *p) {
    qkv_tensor *m = qkv_new_tensor_(ctx, fn, QKV_U8, 3, (int64_t[]){p->batch, p->n_q, p->n_k});
    if (!m) return NULL;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->n_q; i++) {
            uint8_t *row = (uint8_t *)m->data + (b * p->n_q + i) * p->n_k;
            qkv_attn_tile_ t = tile_of(p, b, i, 0, 1, p->n_k);
            int64_t len = qkv_tile_row_len_(&t, 0);
            for (int64_t j = 0; j < p->n_k; j++) row[j] = j < len && (!t.mask || t.mask[j]);
        }
    return m;
}

/* The per-head parameter x [heads] as [B, n_q, 1]: batch element b gets x[b % heads] (index_select, reshape,
 * expand: the gradient flows back to x). */
static qkv_tensor *per_head_column(qkv_ctx *ctx, const char *fn, qkv_tensor *x, const plan *p) {
    qkv_tensor *idx = qkv_new_tensor_(ctx, fn, QKV_I32, 1, (int64_t[]){p->batch});
    if (!idx) return NULL;
    for (int64_t b = 0; b < p->batch; b++) ((int32_t *)idx->data)[b] = (int32_t)(b % p->heads);
    qkv_tensor *xb = qkv_reshape(ctx, qkv_index_select(ctx, x, 0, idx), 3, (int64_t[]){p->batch, 1, 1});
    return qkv_expand(ctx, xb, 3, (int64_t[]){p->batch, p->n_q, 1});
}

/* The weights w [B, n_q, n_k] of a variant (not SSMax, whose caller scales q), from the public operators. */
static qkv_tensor *composed_weights(qkv_ctx *ctx, const char *fn, qkv_tensor *q3, qkv_tensor *k3, const plan *p,
                                    const variant_args *va, const qkv_tensor *mask, int flags) {
    qkv_tensor *x = qkv_scale(ctx, qkv_matmul(ctx, q3, k3, QKV_TRANS_B), p->scale); // x = s Q K^T
    if (x && va->cap > 0) x = qkv_softcap(ctx, x, va->cap);                         // x' = cap tanh(x / cap)
    if (!x) return NULL;
    if (va->variant == QKV_ATTN_SOFTMAX) return qkv_softmax(ctx, x, mask, flags);
    qkv_tensor *keep = keep_mask(ctx, fn, p);
    if (!keep) return NULL;
    qkv_tensor *zeros = qkv_new_tensor_(ctx, fn, x->dtype, 3, (int64_t[]){p->batch, p->n_q, p->n_k});
    if (!zeros) return NULL;
    memset(zeros->data, 0, (size_t)zeros->numel * p->es);
    switch (va->variant) {
    case QKV_ATTN_SOFTMAX1:
    case QKV_ATTN_SINK: {
        // w = softmax([b, x])[1:]  (the extra logit b = 0 or b_h first, always kept)
        qkv_tensor *col = NULL;
        if (va->variant == QKV_ATTN_SINK) {
            col = per_head_column(ctx, fn, va->sink, p);
        } else {
            col = qkv_new_tensor_(ctx, fn, x->dtype, 3, (int64_t[]){p->batch, p->n_q, 1});
            if (col) memset(col->data, 0, (size_t)col->numel * p->es);
        }
        qkv_tensor *ext_mask = qkv_new_tensor_(ctx, fn, QKV_U8, 3, (int64_t[]){p->batch, p->n_q, p->n_k + 1});
        if (!col || !ext_mask) return NULL;
        for (int64_t r = 0; r < p->batch * p->n_q; r++) {
            uint8_t *row = (uint8_t *)ext_mask->data + r * (p->n_k + 1);
            row[0] = 1;
            memcpy(row + 1, (const uint8_t *)keep->data + r * p->n_k, (size_t)p->n_k);
        }
        qkv_tensor *parts[2] = {col, x};
        qkv_tensor *w = qkv_softmax(ctx, qkv_concat(ctx, parts, 2, 2), ext_mask, 0);
        return qkv_narrow(ctx, w, 2, 1, p->n_k);
    }
    case QKV_ATTN_SIGMOID:
        // w = sigma(x + b) where kept, 0 elsewhere
        return qkv_where(ctx, keep, qkv_sigmoid(ctx, qkv_add_scalar(ctx, x, va->bias)), zeros);
    case QKV_ATTN_SOFTPICK: {
        // u = e^x - 1 (x = 0 where dropped, so u = 0 there);  w = relu(u) / (sum |u| + eps)
        qkv_tensor *u = qkv_add_scalar(ctx, qkv_exp(ctx, qkv_where(ctx, keep, x, zeros)), -1.0);
        qkv_tensor *den = qkv_add_scalar(ctx, qkv_sum_dim(ctx, qkv_abs(ctx, u), 2, true), va->eps);
        return qkv_div(ctx, qkv_relu(ctx, u), den);
    }
    default:
        return NULL;
    }
}

/* Grouped-query attention composed: k or v [B / group, n, d] repeated to q's batch, row b from row b / group
 * (qkv_index_select, whose backward adds the copies in index order); t itself without grouping. */
static qkv_tensor *kv_repeated(qkv_ctx *ctx, const char *fn, qkv_tensor *t, const plan *p) {
    if (p->group == 1) return t;
    qkv_tensor *idx = qkv_new_tensor_(ctx, fn, QKV_I32, 1, (int64_t[]){p->batch});
    if (!idx) return NULL;
    for (int64_t b = 0; b < p->batch; b++) ((int32_t *)idx->data)[b] = (int32_t)(b / p->group);
    return qkv_index_select(ctx, t, 0, idx);
}

/* q, k, v as 3-D (a 2-D operand is a batch of one: a reshape, so gradients flow). */
static qkv_tensor *as_3d(qkv_ctx *ctx, qkv_tensor *t) {
    return t->ndim == 3 ? t : qkv_reshape(ctx, t, 3, (int64_t[]){1, t->shape[0], t->shape[1]});
}

/* The checks of qkv_attention_ex and its plan (mask validated); false with the error stored. */
static bool ex_prepare(qkv_ctx *ctx, const char *fn, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                       const qkv_attention_options *o, plan *p, variant_args *va, qkv_tensor **ssmax_c) {
    if (!ctx || ctx->status || !qkv_check_float_(ctx, fn, "q", q) || !qkv_check_float_(ctx, fn, "k", k) ||
        !qkv_check_float_(ctx, fn, "v", v))
        return false;
    if (o->kv_heads < 0 || (o->kv_heads > 0 && (o->heads < 1 || o->heads % o->kv_heads != 0)))
        return qkv_fail_(ctx, QKV_ERR_SHAPE,
                         "%s: q is %s, k is %s: kv_heads %d does not divide heads %d (0: no grouping)", fn,
                         QKV_SHAPE(q), QKV_SHAPE(k), o->kv_heads, o->heads),
               false;
    if (!check_qkv_grouped(ctx, fn, q, k, v, o->heads, (int)kv_group(o))) return false;
    double s;
    if (!resolve_scale(ctx, fn, q, k, o->scale, &s)) return false;
    if (o->flags & ~QKV_CAUSAL)
        return qkv_fail_(ctx, QKV_ERR_ARG, "%s: q is %s, k is %s: flags 0x%x has unknown bits (only QKV_CAUSAL)",
                         fn, QKV_SHAPE(q), QKV_SHAPE(k), (unsigned)o->flags),
               false;
    if (!check_options(ctx, fn, q, k, o, va, ssmax_c)) return false;
    plan_init(p, ctx, q, k, v, s, o->flags);
    p->variant = va->variant;
    p->heads = va->heads;
    p->bias = va->bias;
    p->eps = va->eps;
    p->cap = va->cap;
    p->group = va->group;
    if (o->mask && !check_mask(ctx, fn, q, k, o->mask, p)) return false;
    return true;
}

/* The weights of attention_ex composed of the public operators (q already scaled for SSMax). */
static qkv_tensor *ex_weights(qkv_ctx *ctx, const char *fn, qkv_tensor *q, qkv_tensor *k, const plan *p,
                              const variant_args *va, const qkv_attention_options *o) {
    qkv_tensor *w = composed_weights(ctx, fn, as_3d(ctx, q), as_3d(ctx, k), p, va, o->mask, o->flags);
    if (w && q->ndim == 2) w = qkv_reshape(ctx, w, 2, (int64_t[]){p->n_q, p->n_k});
    return w;
}

qkv_tensor *qkv_attention_composed_ex_(qkv_ctx *ctx, const char *fn, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                       const qkv_attention_options *options, qkv_tensor **attn) {
    if (attn) *attn = NULL;
    qkv_attention_options o = options ? *options : qkv_attention_default_options();
    plan p;
    variant_args va;
    qkv_tensor *c = NULL;
    if (!ex_prepare(ctx, fn, q, k, v, &o, &p, &va, &c)) return NULL;
    k = kv_repeated(ctx, fn, k, &p); // grouped: each query row's own copy of its key/value row
    v = kv_repeated(ctx, fn, v, &p);
    if (!k || !v) return NULL;
    qkv_tensor *qx = q;
    if (c) { // q' = c_h log(n_i) q: q * (c column * log n column)
        qkv_tensor *logn = qkv_new_tensor_(ctx, fn, q->dtype, 3, (int64_t[]){p.batch, p.n_q, 1});
        double *ln = logn ? qkv_arena_array_(ctx, fn, (size_t)(p.batch * p.n_q), sizeof(double)) : NULL;
        if (!ln) return NULL;
        keys_kept_log(&p, ln);
        for (int64_t r = 0; r < p.batch * p.n_q; r++) {
            if (p.f64) ((double *)logn->data)[r] = ln[r];
            else ((float *)logn->data)[r] = (float)ln[r];
        }
        qkv_tensor *factor = qkv_mul(ctx, per_head_column(ctx, fn, c, &p), logn);
        qx = qkv_mul(ctx, as_3d(ctx, q), qkv_expand(ctx, factor, 3, (int64_t[]){p.batch, p.n_q, p.d_k}));
        if (qx && q->ndim == 2) qx = qkv_reshape(ctx, qx, 2, (int64_t[]){p.n_q, p.d_k});
    }
    qkv_tensor *w = qx ? ex_weights(ctx, fn, qx, k, &p, &va, &o) : NULL;
    qkv_tensor *out = qkv_matmul(ctx, w, v, 0); // out = w V
    qkv_name_caller_(ctx, fn);
    if (!out) return NULL;
    if (attn) *attn = w;
    return out;
}

qkv_tensor *qkv_attention_ex(qkv_ctx *ctx, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                             const qkv_attention_options *options, qkv_tensor **attn) {
    const char *fn = "qkv_attention_ex";
    if (attn) *attn = NULL;
    qkv_attention_options o = options ? *options : qkv_attention_default_options();
    plan p;
    variant_args va;
    qkv_tensor *c = NULL;
    if (!ex_prepare(ctx, fn, q, k, v, &o, &p, &va, &c)) return NULL;
    qkv_tensor *qx = c ? ssmax_scale_q(ctx, fn, q, c, &p) : q; // SSMax: q' = c_h log(n_i) q_i
    if (!qx) return NULL;
    qkv_tensor *out = fused_attention(ctx, fn, qx, k, v, o.mask, p.scale, o.flags, &va);
    if (!out || !attn) return out;
    qkv_tensor *kr = kv_repeated(ctx, fn, k, &p);
    qkv_tensor *w = kr ? ex_weights(ctx, fn, qx, kr, &p, &va, &o) : NULL;
    qkv_name_caller_(ctx, fn);
    if (!w) return NULL;
    *attn = w;
    return out;
}
