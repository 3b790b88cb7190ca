/*
 * avx512_emulation.h — runs the AVX-512 kernel sources (ops/kernels/gemm_avx512.c, attention_avx512.c,
 * attention_f64_avx512.c, gelu_avx512.c, layer_norm_avx512.c) on a CPU without AVX-512, for
 * tests/test_avx512_emulated.c only (never in the library).
 *
 * tests/meson.build compiles those files a second time with -include of this header, -mavx2 -mfma and
 * WITHOUT -mavx512f, and -DQKV_EMULATE_AVX512, which their ISA guard accepts in place of __AVX512F__. Then:
 *   - <immintrin.h> comes first (the compiler's own AVX-512 declarations and its __m512, __m512d, __m512i,
 *     __mmask16 types), then <sleef.h>, then SIMDe 0.7.4 (libsimde-dev, header-only) with its native paths
 *     for AVX-512 off and SIMDE_ENABLE_NATIVE_ALIASES: every _mm512_* the kernels call becomes a macro for
 *     SIMDe's portable version, on the compiler's __m512 type (SIMDe takes that type when immintrin.h
 *     defined it). SIMDe builds the 512-bit operations out of two native AVX2 / FMA halves (fused
 *     multiply-adds stay fused), so the AVX2 intrinsics the files also use run natively;
 *   - the intrinsics SIMDe 0.7.4 lacks are defined below, each as the Intel manual describes it, element
 *     by element: the masked loads and stores read and write only the lanes of their mask, as the hardware
 *     does (a masked-off lane past the end of a buffer is not touched, and AddressSanitizer sees any
 *     lane that is); the reductions follow GCC's avx512fintrin.h step for step (the order of each sum and
 *     max, so the bits are those of a GCC build on an AVX-512 CPU);
 *   - SLEEF's Sleef_expf16_u10avx512f, and its inline form qkv_expf16_avx512_ (ops/kernels/expf_avx512.h), are
 *     two calls of Sleef_expf8_u10avx2 on the halves: SLEEF builds both from one source (sleefsimdsp.c, its
 *     1-ulp expf with FMA), lane by lane the same algorithm; likewise
 *     Sleef_expd8_u10avx512f from Sleef_expd4_u10avx2 (sleefsimddp.c);
 *   - the entry points are renamed (qkv_emu_*), so the emulated build links beside the real one.
 * A compiler whose headers define an intrinsic as a macro (clang: those with an immediate operand) has it
 * #undef'd first. GCC warns that an __m512 passed by value without -mavx512f changes the ABI: every such
 * function is static in its one file, so tests/meson.build passes -Wno-psabi to these files only.
 * Needs an x86-64 CPU with AVX2 and FMA (the test checks, and skips without).
 */
#ifndef QKV_AVX512_EMULATION_H
#define QKV_AVX512_EMULATION_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#ifdef QKV_HAVE_SLEEF
#include <sleef.h>
#endif

/* SIMDe's AVX-512 families: emulated, never native (they are not here anyway without -mavx512f). */
#define SIMDE_X86_AVX512F_NO_NATIVE
#define SIMDE_X86_AVX512VL_NO_NATIVE
#define SIMDE_X86_AVX512BW_NO_NATIVE
#define SIMDE_X86_AVX512DQ_NO_NATIVE
#define SIMDE_X86_AVX512CD_NO_NATIVE
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

/* The emulated build's entry points, beside the library's qkv_gemm_f32_avx512_ and qkv_attn_kernels_avx512_. */
#define qkv_gemm_f32_avx512_ qkv_emu_gemm_f32_avx512_
#define qkv_gemm_f32_avx512_rows_ qkv_emu_gemm_f32_avx512_rows_
#define qkv_gemm_f32_small_avx512_ qkv_emu_gemm_f32_small_avx512_
#define qkv_transpose_f32_avx512_ qkv_emu_transpose_f32_avx512_
#define qkv_attn_kernels_avx512_ qkv_emu_attn_kernels_avx512_
#define qkv_attn_f64_kernels_avx512_ qkv_emu_attn_f64_kernels_avx512_
#define qkv_gelu_kernels_avx512_ qkv_emu_gelu_kernels_avx512_
#define qkv_layer_norm_kernels_avx512_ qkv_emu_layer_norm_kernels_avx512_

/* ---- what SIMDe 0.7.4 lacks ---------------------------------------------------------------------- */

/* SIMDe has these, but no native alias for them */
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4(a, b, imm) simde_mm512_shuffle_f32x4((a), (b), (imm))
#undef _mm512_shuffle_f64x2
#define _mm512_shuffle_f64x2(a, b, imm) simde_mm512_shuffle_f64x2((a), (b), (imm))
#undef _mm512_slli_epi32
#define _mm512_slli_epi32(a, imm) simde_mm512_slli_epi32((a), (imm))

/* dst[i] = a[i] >> imm, arithmetic (the sign fills in; imm above 31 gives 0 or -1) */
static inline simde__m512i qkv_emu_srai_epi32(simde__m512i a, unsigned imm) {
    simde__m512i_private a_ = simde__m512i_to_private(a), r_;
    for (int i = 0; i < 16; i++) r_.i32[i] = imm > 31 ? (a_.i32[i] < 0 ? -1 : 0) : a_.i32[i] >> imm;
    return simde__m512i_from_private(r_);
}
#undef _mm512_srai_epi32
#define _mm512_srai_epi32(a, imm) qkv_emu_srai_epi32((a), (imm))

/* Lane i of the mask k. */
#define QKV_EMU_LANE(k, i) (((unsigned)(k) >> (i)) & 1u)

/* dst[i] = (a[i] != b[i]), 32-bit integer lanes */
static inline simde__mmask16 qkv_emu_cmpneq_epi32_mask(simde__m512i a, simde__m512i b) {
    simde__m512i_private a_ = simde__m512i_to_private(a), b_ = simde__m512i_to_private(b);
    unsigned k = 0;
    for (int i = 0; i < 16; i++) k |= (unsigned)(a_.i32[i] != b_.i32[i]) << i;
    return (simde__mmask16)k;
}
#undef _mm512_cmpneq_epi32_mask
#define _mm512_cmpneq_epi32_mask(a, b) qkv_emu_cmpneq_epi32_mask((a), (b))

/* dst[i] = zero-extended byte i of a, 16 bytes into 16 32-bit lanes */
static inline simde__m512i qkv_emu_cvtepu8_epi32(simde__m128i a) {
    simde__m128i_private a_ = simde__m128i_to_private(a);
    simde__m512i_private r_;
    for (int i = 0; i < 16; i++) r_.i32[i] = (int32_t)a_.u8[i];
    return simde__m512i_from_private(r_);
}
#undef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32(a) qkv_emu_cvtepu8_epi32(a)

/* dst[i] = zero-extended byte i of a, the low 8 bytes into 8 64-bit lanes */
static inline simde__m512i qkv_emu_cvtepu8_epi64(simde__m128i a) {
    simde__m128i_private a_ = simde__m128i_to_private(a);
    simde__m512i_private r_;
    for (int i = 0; i < 8; i++) r_.i64[i] = (int64_t)a_.u8[i];
    return simde__m512i_from_private(r_);
}
#undef _mm512_cvtepu8_epi64
#define _mm512_cvtepu8_epi64(a) qkv_emu_cvtepu8_epi64(a)

/* 8 doubles rounded to 8 floats (round to nearest, as the default MXCSR) */
static inline simde__m256 qkv_emu_cvtpd_ps(simde__m512d a) {
    simde__m512d_private a_ = simde__m512d_to_private(a);
    simde__m256_private r_;
    for (int i = 0; i < 8; i++) r_.f32[i] = (float)a_.f64[i];
    return simde__m256_from_private(r_);
}
#undef _mm512_cvtpd_ps
#define _mm512_cvtpd_ps(a) qkv_emu_cvtpd_ps(a)

/* 8 floats widened to 8 doubles (exact) */
static inline simde__m512d qkv_emu_cvtps_pd(simde__m256 a) {
    simde__m256_private a_ = simde__m256_to_private(a);
    simde__m512d_private r_;
    for (int i = 0; i < 8; i++) r_.f64[i] = (double)a_.f32[i];
    return simde__m512d_from_private(r_);
}
#undef _mm512_cvtps_pd
#define _mm512_cvtps_pd(a) qkv_emu_cvtps_pd(a)

/* dst[i] = k[i] ? mem[i] : 0; only the lanes of k are read */
static inline simde__m512 qkv_emu_maskz_loadu_ps(simde__mmask16 k, const void *mem) {
    const float *p = (const float *)mem;
    simde__m512_private r_;
    for (int i = 0; i < 16; i++) r_.f32[i] = QKV_EMU_LANE(k, i) ? p[i] : 0.0f;
    return simde__m512_from_private(r_);
}
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps(k, mem) qkv_emu_maskz_loadu_ps((k), (mem))

/* mem[i] = a[i] where k[i]; the other lanes of mem are not written (nor read) */
static inline void qkv_emu_mask_storeu_ps(void *mem, simde__mmask16 k, simde__m512 a) {
    float *p = (float *)mem;
    simde__m512_private a_ = simde__m512_to_private(a);
    for (int i = 0; i < 16; i++)
        if (QKV_EMU_LANE(k, i)) p[i] = a_.f32[i];
}
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps(mem, k, a) qkv_emu_mask_storeu_ps((mem), (k), (a))

/* the same in doubles, 8 lanes */
static inline simde__m512d qkv_emu_maskz_loadu_pd(simde__mmask8 k, const void *mem) {
    const double *p = (const double *)mem;
    simde__m512d_private r_;
    for (int i = 0; i < 8; i++) r_.f64[i] = QKV_EMU_LANE(k, i) ? p[i] : 0.0;
    return simde__m512d_from_private(r_);
}
#undef _mm512_maskz_loadu_pd
#define _mm512_maskz_loadu_pd(k, mem) qkv_emu_maskz_loadu_pd((k), (mem))

static inline void qkv_emu_mask_storeu_pd(void *mem, simde__mmask8 k, simde__m512d a) {
    double *p = (double *)mem;
    simde__m512d_private a_ = simde__m512d_to_private(a);
    for (int i = 0; i < 8; i++)
        if (QKV_EMU_LANE(k, i)) p[i] = a_.f64[i];
}
#undef _mm512_mask_storeu_pd
#define _mm512_mask_storeu_pd(mem, k, a) qkv_emu_mask_storeu_pd((mem), (k), (a))

/* within each pair of doubles, dst[2j + b] = a[2j + imm bit (2j + b)] */
static inline simde__m512d qkv_emu_permute_pd(simde__m512d a, int imm) {
    simde__m512d_private a_ = simde__m512d_to_private(a), r_;
    for (int i = 0; i < 8; i++) r_.f64[i] = a_.f64[(i & ~1) + ((imm >> i) & 1)];
    return simde__m512d_from_private(r_);
}
#undef _mm512_permute_pd
#define _mm512_permute_pd(a, imm) qkv_emu_permute_pd((a), (imm))

/* within each 128-bit block, dst[4q + c] = a[4q + imm bits (2c, 2c+1)] */
static inline simde__m512 qkv_emu_permute_ps(simde__m512 a, int imm) {
    simde__m512_private a_ = simde__m512_to_private(a), r_;
    for (int i = 0; i < 16; i++) r_.f32[i] = a_.f32[(i & ~3) + ((imm >> (2 * (i & 3))) & 3)];
    return simde__m512_from_private(r_);
}
#undef _mm512_permute_ps
#define _mm512_permute_ps(a, imm) qkv_emu_permute_ps((a), (imm))

/* dst = a in the low 256 bits, 0 in the high 256 */
static inline simde__m512 qkv_emu_zextps256_ps512(simde__m256 a) {
    simde__m256_private a_ = simde__m256_to_private(a);
    simde__m512_private r_;
    for (int i = 0; i < 16; i++) r_.f32[i] = i < 8 ? a_.f32[i] : 0.0f;
    return simde__m512_from_private(r_);
}
#undef _mm512_zextps256_ps512
#define _mm512_zextps256_ps512(a) qkv_emu_zextps256_ps512(a)

/* The reductions, in GCC's order (avx512fintrin.h __MM512_REDUCE_OP): high half op low half, then the
 * upper 128 bits op the lower, then lanes {2,3} op {0,1}, then lane 1 op lane 0 (for max: with the
 * operands of MAXPS, which gives its second one when either is NaN or both are zero). */
static inline float qkv_emu_max(float a, float b) { return a > b ? a : b; }

static inline float qkv_emu_reduce_add_ps(simde__m512 x) {
    simde__m512_private x_ = simde__m512_to_private(x);
    float t3[8], t6[4], t8[2];
    for (int i = 0; i < 8; i++) t3[i] = x_.f32[8 + i] + x_.f32[i];
    for (int i = 0; i < 4; i++) t6[i] = t3[4 + i] + t3[i];
    for (int i = 0; i < 2; i++) t8[i] = t6[i] + t6[i + 2];
    return t8[0] + t8[1];
}
#undef _mm512_reduce_add_ps
#define _mm512_reduce_add_ps(x) qkv_emu_reduce_add_ps(x)

static inline double qkv_emu_reduce_add_pd(simde__m512d x) {
    simde__m512d_private x_ = simde__m512d_to_private(x);
    double t3[4], t6[2];
    for (int i = 0; i < 4; i++) t3[i] = x_.f64[4 + i] + x_.f64[i];
    for (int i = 0; i < 2; i++) t6[i] = t3[2 + i] + t3[i];
    return t6[0] + t6[1];
}
#undef _mm512_reduce_add_pd
#define _mm512_reduce_add_pd(x) qkv_emu_reduce_add_pd(x)

static inline float qkv_emu_reduce_max_ps(simde__m512 x) {
    simde__m512_private x_ = simde__m512_to_private(x);
    float t3[8], t6[4], t8[4];
    for (int i = 0; i < 8; i++) t3[i] = qkv_emu_max(x_.f32[8 + i], x_.f32[i]); /* max(T1 = high, T2 = low) */
    for (int i = 0; i < 4; i++) t6[i] = qkv_emu_max(t3[4 + i], t3[i]);
    static const int s7[4] = {2, 3, 0, 1};
    for (int i = 0; i < 4; i++) t8[i] = qkv_emu_max(t6[i], t6[s7[i]]);
    return qkv_emu_max(t8[0], t8[1]); /* T10[0] = max(T8[0], T9[0] = T8[1]) */
}
#undef _mm512_reduce_max_ps
#define _mm512_reduce_max_ps(x) qkv_emu_reduce_max_ps(x)

static inline double qkv_emu_max_pd1(double a, double b) { return a > b ? a : b; }

static inline double qkv_emu_reduce_max_pd(simde__m512d x) {
    simde__m512d_private x_ = simde__m512d_to_private(x);
    double t3[4], t6[2];
    for (int i = 0; i < 4; i++) t3[i] = qkv_emu_max_pd1(x_.f64[4 + i], x_.f64[i]); /* max(high, low) */
    for (int i = 0; i < 2; i++) t6[i] = qkv_emu_max_pd1(t3[2 + i], t3[i]);
    return qkv_emu_max_pd1(t6[0], t6[1]); /* T8[0] = max(T6[0], T7[0] = T6[1]) */
}
#undef _mm512_reduce_max_pd
#define _mm512_reduce_max_pd(x) qkv_emu_reduce_max_pd(x)

/* the lanes outside k count as -inf */
static inline float qkv_emu_mask_reduce_max_ps(simde__mmask16 k, simde__m512 x) {
    return qkv_emu_reduce_max_ps(simde_mm512_mask_mov_ps(simde_mm512_set1_ps(-INFINITY), k, x));
}
#undef _mm512_mask_reduce_max_ps
#define _mm512_mask_reduce_max_ps(k, x) qkv_emu_mask_reduce_max_ps((k), (x))

/* ---- SLEEF's AVX-512 exp -------------------------------------------------------------------------- */

#ifdef QKV_HAVE_SLEEF
static inline simde__m512 qkv_emu_expf16_u10(simde__m512 x) {
    simde__m512_private x_ = simde__m512_to_private(x), r_;
    r_.m256[0] = Sleef_expf8_u10avx2(x_.m256[0]);
    r_.m256[1] = Sleef_expf8_u10avx2(x_.m256[1]);
    return simde__m512_from_private(r_);
}
#undef Sleef_expf16_u10avx512f
#define Sleef_expf16_u10avx512f(x) qkv_emu_expf16_u10(x)

/* ops/kernels/expf_avx512.h, the inline form of Sleef_expf16_u10avx512f with its bits, is the same two halves:
 * its include guard is taken here, so the kernels' #include of it adds nothing */
#define QKV_EXPF_AVX512_H
static inline simde__m512 qkv_expf16_avx512_(simde__m512 x) { return qkv_emu_expf16_u10(x); }

/* Sleef_expd8_u10avx512f as two Sleef_expd4_u10avx2 (sleefsimddp.c's 1-ulp exp; the f64 attention kernels
 * are checked against the composed operators within a tolerance, not bit for bit) */
static inline simde__m512d qkv_emu_expd8_u10(simde__m512d x) {
    simde__m512d_private x_ = simde__m512d_to_private(x), r_;
    r_.m256d[0] = Sleef_expd4_u10avx2(x_.m256d[0]);
    r_.m256d[1] = Sleef_expd4_u10avx2(x_.m256d[1]);
    return simde__m512d_from_private(r_);
}
#undef Sleef_expd8_u10avx512f
#define Sleef_expd8_u10avx512f(x) qkv_emu_expd8_u10(x)
#endif

#endif /* QKV_AVX512_EMULATION_H */
