/*
 * expf_simd.h — SLEEF's 1-ulp float exp, written once for any vector width: included by expf_avx2.h (8 lanes)
 * and expf_avx512.h (16 lanes), each of which defines the macros below, includes this file and undefines them.
 * The result has the bits of SLEEF's own function of that width (Sleef_expf8_u10avx2, Sleef_expf16_u10avx512f)
 * for every one of the 2^32 inputs; see expf_avx2.h for why it is inline and tests/test_expf_avx2.c for the
 * check. The method is SLEEF's (Cody-Waite reduction, a degree-5 polynomial in FMAs, 2^q in two halves):
 *   q = round(x / ln 2) (to nearest even);  s = x - q ln 2, with ln 2 split in two parts (two FMAs, exact q ln 2_hi)
 *   e^s ~ 1 + s + s^2 P(s), P of degree 5 (Horner in FMAs)
 *   e^x = e^s 2^(q >> 1) 2^(q - (q >> 1))   (two factors, so that q in [-150, 145] needs no subnormal 2^q)
 *   x < -104: +0;  x > 100: +inf;  NaN: NaN.
 *
 * The macros: EXPF_NAME (the function), EXPF_POW2I (the name of its 2^e helper), EXPF_VF and EXPF_VI (the float
 * and int32 vector types), EXPF_SET1(f), EXPF_SET1_I(i), EXPF_MUL(a, b), EXPF_ADD(a, b), EXPF_FMA(a, b, c) (a b + c,
 * fused), EXPF_CVT_I(x) (round to int32, ties to even), EXPF_CVT_F(i), EXPF_ADD_I(a, b), EXPF_SUB_I(a, b),
 * EXPF_SRAI(i, n), EXPF_SLLI(i, n), EXPF_AS_F(i) (the bits of i as floats), EXPF_ZERO_BELOW(x, c, u) (u with +0
 * in the lanes where x < c, NaN x kept) and EXPF_INF_ABOVE(x, c, u) (u with +inf in the lanes where c < x).
 *
 * The bits hold only without contraction: a multiply and an add fused into one FMA round once, not twice. The
 * library is C17, in which GCC does not contract (-ffp-contract=off); clang is told here.
 */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* 2^e for e in [-126, 127], built from its exponent field. */
static inline EXPF_VF EXPF_POW2I(EXPF_VI e) { return EXPF_AS_F(EXPF_SLLI(EXPF_ADD_I(e, EXPF_SET1_I(0x7f)), 23)); }

static inline EXPF_VF EXPF_NAME(EXPF_VF x) {
    const EXPF_VF inv_ln2 = EXPF_SET1(1.442695040888963407359924681001892137426645954152985934135449406931f);
    const EXPF_VF ln2_hi = EXPF_SET1(-0.693145751953125f), ln2_lo = EXPF_SET1(-1.428606765330187045e-06f);
    EXPF_VI q = EXPF_CVT_I(EXPF_MUL(x, inv_ln2)); // round(x / ln 2), ties to even
    EXPF_VF qf = EXPF_CVT_F(q);
    EXPF_VF s = EXPF_FMA(qf, ln2_hi, x); // s = x - q ln 2 in two steps
    s = EXPF_FMA(qf, ln2_lo, s);
    EXPF_VF p = EXPF_SET1(0.000198527617612853646278381f); // P(s), Horner
    p = EXPF_FMA(p, s, EXPF_SET1(0.00139304355252534151077271f));
    p = EXPF_FMA(p, s, EXPF_SET1(0.00833336077630519866943359f));
    p = EXPF_FMA(p, s, EXPF_SET1(0.0416664853692054748535156f));
    p = EXPF_FMA(p, s, EXPF_SET1(0.166666671633720397949219f));
    p = EXPF_FMA(p, s, EXPF_SET1(0.5f));
    EXPF_VF u = EXPF_ADD(EXPF_SET1(1.0f), EXPF_FMA(EXPF_MUL(s, s), p, s)); // e^s = 1 + s + s^2 P
    EXPF_VI half = EXPF_SRAI(q, 1);                                        // 2^q in two factors
    u = EXPF_MUL(EXPF_MUL(u, EXPF_POW2I(half)), EXPF_POW2I(EXPF_SUB_I(q, half)));
    u = EXPF_ZERO_BELOW(x, EXPF_SET1(-104.0f), u); // underflow: +0
    return EXPF_INF_ABOVE(x, EXPF_SET1(100.0f), u);
}
