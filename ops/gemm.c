/*
 * gemm.c — f32/f64 GEMM: C[m,p] (+)= op(A)[m,k] op(B)[k,p], A stored [m,k] or [k,m] (trans_a), B stored
 * [k,p] or [p,k] (trans_b), all row-major and contiguous; accumulate chooses C += over C =.
 *
 * qkv_gemm_f64_ref_ and qkv_gemm_f32_ref_ are the reference: plain loops, the oracle the fast kernels are
 * tested against (the f32 one accumulates in float, as a fast f32 kernel does).
 *
 * qkv_gemm_f32_ is the fast path every f32 operator calls. It dispatches on size and CPU:
 *   - when op(B) fits in 16 KiB (k*p <= QKV_GEMM_SMALL_B) and the CPU has AVX2 or AVX-512, the small path:
 *     the ISA's tiles read A and B where they lie (B transposed first if stored [p,k]), nothing packed;
 *   - otherwise tiny problems (m*k*p below QKV_GEMM_SMALL) run the reference loops, and so does a single
 *     row with B not transposed (c += a[l] * B[l,:]: a sweep over B that packing only slows);
 *   - the rest run the packed, cache-blocked GEMM of ops/kernels/ with the best micro-kernel the CPU has
 *     (AVX-512F, else AVX2+FMA, else portable C), chosen once from cpuid and cached.
 *
 * qkv_gemm_f64_ is the f64 fast path (every f64 operator and qkv_gradcheck's evaluations go through it):
 * tiny problems and a single row with B not transposed take the reference loops as above; the rest the
 * packed GEMM of ops/kernels/ in f64 (gemm_f64_avx2.c's 6 x 8 tile when the CPU has AVX2+FMA, AVX-512 CPUs
 * included, else gemm_f64_portable.c's). Each element of C is one chain of fused or plain multiply-adds in
 * f64, in blocks of KC along the depth: f64 accuracy, a different rounding order from the reference loops.
 *
 * Same inputs, same bits, every call: the blocking is fixed and nothing depends on timing. (Results may
 * differ in the last bits between the tiny and packed paths, and between ISAs.)
 *
 * Packing buffers: QKV_GEMM_APACK + QKV_GEMM_BPACK floats (560 KiB, see ops/kernels/gemm_kernels.h) per
 * thread (the small path transposes B into it), allocated on the heap at the thread's first GEMM that needs
 * it and freed when the thread exits (see thread_pack_block below). Each thread has its own, so GEMMs
 * running at once never share a buffer.
 */
#include "qkv_internal.h"

#include <pthread.h>
#include <stdlib.h>

#include "kernels/gemm_kernels.h"

/* A element (i, l) of op(A): A is [m,k] row-major, or [k,m] when transposed. */
#define OP_A(i, l) (trans_a ? a[(l) * m + (i)] : a[(i) * k + (l)])

#define GEMM_BODY(T)                                                                                   \
    for (int64_t i = 0; i < m; i++) {                                                                  \
        T *c_row = c + i * p;                                                                          \
        if (!accumulate)                                                                               \
            for (int64_t j = 0; j < p; j++) c_row[j] = 0;                                              \
        if (trans_b) {                                                                                 \
            for (int64_t j = 0; j < p; j++) {                                                          \
                T dot = 0; /* c[i,j] += sum_l op(A)[i,l] B[j,l] */                                     \
                for (int64_t l = 0; l < k; l++) dot += OP_A(i, l) * b[j * k + l];                      \
                c_row[j] += dot;                                                                       \
            }                                                                                          \
        } else {                                                                                       \
            for (int64_t l = 0; l < k; l++) {                                                          \
                T a_il = OP_A(i, l); /* c[i,:] += op(A)[i,l] B[l,:] */                                 \
                const T *b_row = b + l * p;                                                            \
                for (int64_t j = 0; j < p; j++) c_row[j] += a_il * b_row[j];                           \
            }                                                                                          \
        }                                                                                              \
    }

void qkv_gemm_f64_ref_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p,
                       bool trans_a, bool trans_b, bool accumulate) {
    if (m <= 0 || p <= 0) return; /* C is empty: no loop over m rows of nothing (m may be 2^40) */
    GEMM_BODY(double)
}

void qkv_gemm_f32_ref_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                       bool trans_a, bool trans_b, bool accumulate) {
    if (m <= 0 || p <= 0) return; /* C is empty */
    GEMM_BODY(float)
}

/* ---- the fast path ------------------------------------------------------------------------------- */

/* QKV_GEMM_SMALL and QKV_GEMM_SMALL_B, the sizes that pick a path: kernels/gemm_kernels.h */

/* Packing buffers: one 64-byte aligned block per thread that runs a packed GEMM, allocated at its first
 * such GEMM and freed when the thread exits (a pthread key's destructor; the main thread's goes with the
 * process). Only a pointer lives in thread-local storage: 560 KiB of static TLS would be carved out of the
 * stack of every thread of every program that links libqkv, whether it calls qkv or not. The block is the
 * one allocation that does not go through a context's hooks (a GEMM has no context); if it cannot be made,
 * the GEMM takes the reference loops, slower but correct. */
static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;
static bool pack_key_made;
static _Thread_local float *pack_block;

static void make_pack_key(void) { pack_key_made = pthread_key_create(&pack_key, free) == 0; }

static float *thread_pack_block(void) {
    if (pack_block) return pack_block;
    pthread_once(&pack_once, make_pack_key);
    if (!pack_key_made) return NULL;
    float *block = aligned_alloc(64, (size_t)(QKV_GEMM_APACK + QKV_GEMM_BPACK) * sizeof(float));
    if (!block) return NULL;
    if (pthread_setspecific(pack_key, block) != 0) {
        free(block);
        return NULL;
    }
    return pack_block = block;
}

typedef bool (*packed_gemm_fn)(const float *, const float *, float *, int64_t, int64_t, int64_t, bool, bool,
                               bool, float *, float *);

static const packed_gemm_fn isa_gemm[QKV_ISA_COUNT_] = {
    [QKV_ISA_PORTABLE_] = qkv_gemm_f32_portable_,
    [QKV_ISA_AVX2_] = qkv_gemm_f32_avx2_,
    [QKV_ISA_AVX512_] = qkv_gemm_f32_avx512_,
};

const char *qkv_isa_name_(qkv_isa_ isa) {
    switch (isa) {
    case QKV_ISA_PORTABLE_: return "portable";
    case QKV_ISA_AVX2_: return "avx2";
    case QKV_ISA_AVX512_: return "avx512";
    default: return "unknown";
    }
}

/* Was this ISA's kernel compiled in? (Its entry point answers false when it was not.) */
static bool isa_compiled(qkv_isa_ isa) {
    float one = 1.0f, out = 0.0f;
    _Alignas(64) float ap[QKV_GEMM_MC], bp[QKV_GEMM_NC];
    return isa_gemm[isa](&one, &one, &out, 1, 1, 1, false, false, false, ap, bp);
}

/* Bit i set: ISA i is compiled in and this CPU has it (cpuid, and the OS saves its registers). */
static int detect_isas(void) {
    int mask = 1 << QKV_ISA_PORTABLE_;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && isa_compiled(QKV_ISA_AVX2_)) mask |= 1 << QKV_ISA_AVX2_;
    if (avx2 && __builtin_cpu_supports("avx512f") && isa_compiled(QKV_ISA_AVX512_)) mask |= 1 << QKV_ISA_AVX512_;
#endif
    return mask;
}

static int supported_isas(void) {
    static _Atomic int cached = -1; /* decided once; a race only repeats the same answer */
    int mask = cached;
    if (mask < 0) cached = mask = detect_isas();
    return mask;
}

bool qkv_isa_supported_(qkv_isa_ isa) {
    return (unsigned)isa < QKV_ISA_COUNT_ && (supported_isas() >> isa & 1);
}

qkv_isa_ qkv_isa_best_(void) {
    int mask = supported_isas(), best = QKV_ISA_PORTABLE_;
    for (int isa = 0; isa < QKV_ISA_COUNT_; isa++)
        if (mask >> isa & 1) best = isa;
    return (qkv_isa_)best;
}

void qkv_gemm_f32_isa_(qkv_isa_ isa, const float *a, const float *b, float *c, int64_t m, int64_t k,
                       int64_t p, bool trans_a, bool trans_b, bool accumulate) {
    if (m <= 0 || p <= 0) return;
    if (k <= 0) { // C = 0 (or unchanged with accumulate): an empty sum
        if (!accumulate) memset(c, 0, (size_t)m * (size_t)p * sizeof *c);
        return;
    }
    float *pack = qkv_isa_supported_(isa) ? thread_pack_block() : NULL;
    if (!pack || !isa_gemm[isa](a, b, c, m, k, p, trans_a, trans_b, accumulate, pack, pack + QKV_GEMM_APACK))
        qkv_gemm_f32_ref_(a, b, c, m, k, p, trans_a, trans_b, accumulate);
}

/* ---- f64 ----------------------------------------------------------------------------------------- */

typedef bool (*packed_gemm_f64_fn)(const double *, const double *, double *, int64_t, int64_t, int64_t, bool,
                                   bool, bool, double *, double *);

/* The f64 kernel of each ISA: AVX-512 CPUs run the AVX2 one (there is no AVX-512 f64 kernel yet). */
static const packed_gemm_f64_fn isa_gemm_f64[QKV_ISA_COUNT_] = {
    [QKV_ISA_PORTABLE_] = qkv_gemm_f64_portable_,
    [QKV_ISA_AVX2_] = qkv_gemm_f64_avx2_,
    [QKV_ISA_AVX512_] = qkv_gemm_f64_avx2_,
};

void qkv_gemm_f64_isa_(qkv_isa_ isa, const double *a, const double *b, double *c, int64_t m, int64_t k,
                       int64_t p, bool trans_a, bool trans_b, bool accumulate) {
    if (m <= 0 || p <= 0) return;
    if (k <= 0) { // C = 0 (or unchanged with accumulate): an empty sum
        if (!accumulate) memset(c, 0, (size_t)m * (size_t)p * sizeof *c);
        return;
    }
    /* the thread's f32 block, in doubles: QKV_GEMM_F64_* fit it (gemm_kernels.h), 64-byte aligned both */
    double *pack = qkv_isa_supported_(isa) ? (double *)(void *)thread_pack_block() : NULL;
    if (!pack || !isa_gemm_f64[isa](a, b, c, m, k, p, trans_a, trans_b, accumulate, pack,
                                    pack + QKV_GEMM_F64_APACK))
        qkv_gemm_f64_ref_(a, b, c, m, k, p, trans_a, trans_b, accumulate);
}

void qkv_gemm_f64_(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t p, bool trans_a,
                   bool trans_b, bool accumulate) {
    if (m <= 0 || p <= 0) return;
    if ((double)m * (double)k * (double)p < QKV_GEMM_SMALL || (m == 1 && !trans_b)) {
        qkv_gemm_f64_ref_(a, b, c, m, k, p, trans_a, trans_b, accumulate);
        return;
    }
    qkv_gemm_f64_isa_(qkv_isa_best_(), a, b, c, m, k, p, trans_a, trans_b, accumulate);
}


bool qkv_gemm_f32_small_isa_(qkv_isa_ isa, const float *a, const float *b, float *c, int64_t m, int64_t k,
                             int64_t p, bool trans_a, bool trans_b, bool accumulate) {
    if (!qkv_isa_supported_(isa) || isa == QKV_ISA_PORTABLE_ || k * p > QKV_GEMM_SMALL_B) return false;
    if (trans_b) { // B stored [p, k]: bt [k, p] = b^T, in this thread's packing block
        float *bt = thread_pack_block();
        if (!bt) return false;
        /* AVX-512's masked stores even under AVX2 tiles: AVX2's (vmaskmovps) are slow on AMD cores */
        if (qkv_isa_supported_(QKV_ISA_AVX512_)) qkv_transpose_f32_avx512_(b, p, k, bt);
        else qkv_transpose_f32_avx2_(b, p, k, bt);
        b = bt;
    }
    return isa == QKV_ISA_AVX512_ ? qkv_gemm_f32_small_avx512_(a, b, c, m, k, p, trans_a, accumulate)
                                  : qkv_gemm_f32_small_avx2_(a, b, c, m, k, p, trans_a, accumulate);
}

/* One row, m = 1 and B not transposed (a decoding step's projections): c[0, :] (= or +=) sum_l a[l] B[l, :],
 * the reference loops' operations in their order (l outer, no contraction into FMAs: the same bits), on the
 * CPU's widest vectors (QKV_VECTOR_LOOP) instead of the library's baseline. */
QKV_VECTOR_LOOP
static void gemv_f32(const float *restrict a, const float *restrict b, float *restrict c, int64_t k, int64_t p,
                     bool accumulate) {
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
    if (!accumulate)
        for (int64_t j = 0; j < p; j++) c[j] = 0.0f;
    for (int64_t l = 0; l < k; l++) { // c[:] += a[l] B[l, :]
        float a_l = a[l];
        const float *b_row = b + l * p;
        for (int64_t j = 0; j < p; j++) c[j] += a_l * b_row[j];
    }
}

void qkv_gemm_f32_(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p, bool trans_a,
                   bool trans_b, bool accumulate) {
    if (m <= 0 || p <= 0) return;
    if (k > 0 && k * p <= QKV_GEMM_SMALL_B) {
        /* 8 columns or fewer: AVX2's 8-wide tiles rather than half-masked 16-wide ones (on Zen 4 two 256-bit
         * FMAs issue per cycle against one 512-bit: the same flops; never fewer elsewhere) */
        qkv_isa_ isa = qkv_isa_best_();
        if (isa == QKV_ISA_AVX512_ && p <= 8 && qkv_isa_supported_(QKV_ISA_AVX2_)) isa = QKV_ISA_AVX2_;
        if (qkv_gemm_f32_small_isa_(isa, a, b, c, m, k, p, trans_a, trans_b, accumulate)) return;
    }
    if (m == 1 && !trans_b) { // op(A) is one row, a[0..k) either way
        gemv_f32(a, b, c, k, p, accumulate);
        return;
    }
    if ((double)m * (double)k * (double)p < QKV_GEMM_SMALL) {
        qkv_gemm_f32_ref_(a, b, c, m, k, p, trans_a, trans_b, accumulate);
        return;
    }
    qkv_gemm_f32_isa_(qkv_isa_best_(), a, b, c, m, k, p, trans_a, trans_b, accumulate);
}

/* ---- threads ------------------------------------------------------------------------------------- */

typedef bool (*packed_rows_fn)(const float *, const float *, float *, int64_t, int64_t, int64_t, bool, bool, bool,
                               float *, float *, int64_t, int64_t);

static const packed_rows_fn isa_gemm_rows[QKV_ISA_COUNT_] = {
    [QKV_ISA_PORTABLE_] = qkv_gemm_f32_portable_rows_,
    [QKV_ISA_AVX2_] = qkv_gemm_f32_avx2_rows_,
    [QKV_ISA_AVX512_] = qkv_gemm_f32_avx512_rows_,
};

/* Rows [i0, i1) of C by the reference loops (a thread whose packing block could not be allocated). */
static void gemm_f32_ref_rows(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                              bool trans_a, bool trans_b, bool accumulate, int64_t i0, int64_t i1) {
    const float *a_rows = trans_a ? a + i0 : a + i0 * k; /* op(A)[i0, 0] */
    for (int64_t i = 0; i < i1 - i0; i++) {
        float *c_row = c + (i0 + i) * p;
        if (!accumulate)
            for (int64_t j = 0; j < p; j++) c_row[j] = 0;
        for (int64_t l = 0; l < k; l++) { // c[i,:] += op(A)[i,l] op(B)[l,:]
            float a_il = trans_a ? a_rows[l * m + i] : a_rows[i * k + l];
            for (int64_t j = 0; j < p; j++) c_row[j] += a_il * (trans_b ? b[j * k + l] : b[l * p + j]);
        }
    }
}

void qkv_gemm_f32_threads_(int threads, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t p,
                           bool trans_a, bool trans_b, bool accumulate) {
    qkv_isa_ isa = qkv_isa_best_();
    /* only what qkv_gemm_f32_ sends to the packed GEMM (the small path, one row, tiny products stay on
     * this thread), and each thread at least QKV_GEMM_GRAIN_ multiply-adds and one panel of rows */
    double macs = (double)m * (double)k * (double)p;
    bool packed = m > 0 && p > 0 && k > 0 && !(k * p <= QKV_GEMM_SMALL_B && isa != QKV_ISA_PORTABLE_) &&
                  !(m == 1 && !trans_b) && macs >= QKV_GEMM_SMALL;
    int64_t panel = isa == QKV_ISA_AVX512_ ? 12 : 6; /* the micro-tile's rows (GEMM_MR of each ISA file) */
    int64_t nt = threads;
    if (macs / QKV_GEMM_GRAIN_ < (double)nt) nt = (int64_t)(macs / QKV_GEMM_GRAIN_);
    if (m / panel < nt) nt = m / panel;
    if (!packed || nt <= 1) {
        qkv_gemm_f32_(a, b, c, m, k, p, trans_a, trans_b, accumulate);
        return;
    }
    /* thread t takes rows [t chunk, (t + 1) chunk), chunk a whole number of panels */
    int64_t chunk = ((m + nt - 1) / nt + panel - 1) / panel * panel;
    nt = (m + chunk - 1) / chunk;
#ifdef QKV_HAVE_OPENMP
#pragma omp parallel for schedule(static, 1) num_threads((int)nt)
#endif
    for (int64_t t = 0; t < nt; t++) {
        int64_t i0 = t * chunk, i1 = i0 + chunk < m ? i0 + chunk : m;
        float *pack = qkv_isa_supported_(isa) ? thread_pack_block() : NULL;
        if (!pack || !isa_gemm_rows[isa](a, b, c, m, k, p, trans_a, trans_b, accumulate, pack,
                                         pack + QKV_GEMM_APACK, i0, i1))
            gemm_f32_ref_rows(a, b, c, m, k, p, trans_a, trans_b, accumulate, i0, i1);
    }
}
