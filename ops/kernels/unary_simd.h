/*
 * unary_simd.h — the body of unary_avx2.c and unary_avx512.c: the maps of unary_kernels.h over W lanes with
 * SLEEF's 1-ulp float functions, written once over the macros each file defines (V_F, V_SET1, V_LOAD, V_STORE,
 * V_ADD, V_DIV, V_MAX(a, b) (b where either is NaN: the possibly-NaN operand goes second), V_ABS, V_NEG,
 * V_GE_SELECT(x, a, b): x >= 0 ? a : b lanewise, V_EQ_SELECT(x, c, a, b): x == c ? a : b, V_SQRT, and S_EXP,
 * S_LOG, S_TANH, S_TANH_FAST, S_LOG1P, S_POW: the SLEEF functions). A NaN x gives NaN in every map. The tail past
 * the last whole vector runs through a padded vector, so every element takes the same path.
 */

static inline V_F map_vector(qkv_vf_ f, V_F x, V_F p) {
    switch (f) {
    case QKV_VF_EXP_: return S_EXP(V_MAX(V_SET1(-104.0f), x)); /* below, e^x rounds to 0 (and SLEEF is slow) */
    case QKV_VF_LOG_: return S_LOG(x);
    case QKV_VF_TANH_: return S_TANH(x);
    case QKV_VF_TANH_FAST_: return S_TANH_FAST(x);
    case QKV_VF_SIGMOID_: { // e = e^-|x|; x >= 0: 1 / (1 + e), else e / (1 + e): the numerator chosen first, one division
        V_F e = S_EXP(V_MAX(V_SET1(-104.0f), V_NEG(V_ABS(x))));
        V_F one_e = V_ADD(V_SET1(1.0f), e);
        return V_DIV(V_GE_SELECT(x, V_SET1(1.0f), e), one_e);
    }
    case QKV_VF_SOFTPLUS_: { // max(x, 0) + log1p(e^-|x|)
        V_F e = S_EXP(V_MAX(V_SET1(-104.0f), V_NEG(V_ABS(x))));
        return V_ADD(V_MAX(V_SET1(0.0f), x), S_LOG1P(e));
    }
    case QKV_VF_SQRT_POW_: { // x^0.5 as pow gives it: sqrt x (correctly rounded), but +0 at -0 and +inf at -inf
        V_F r = V_SQRT(V_ADD(x, V_SET1(0.0f)));               /* -0 + 0 = +0 */
        return V_EQ_SELECT(x, V_SET1(-__builtin_inff()), V_SET1(__builtin_inff()), r);
    }
    default: return S_POW(x, p);
    }
}

/* y = f(x) over n floats, with f fixed for the loop (the switch of map_vector folded away, so one vector's
 * chain of FMAs overlaps the next one's: exp and sigmoid ran 1.3x slower with the switch in the loop). */
static inline void map_fixed(qkv_vf_ f, const float *x, float *y, int64_t n, float p) {
    V_F vp = V_SET1(p);
    int64_t i = 0;
    for (; i + W <= n; i += W) V_STORE(y + i, map_vector(f, V_LOAD(x + i), vp));
    if (i < n) { // the tail through a padded vector (1s: in every function's domain)
        float in[W], out[W];
        for (int k = 0; k < W; k++) in[k] = i + k < n ? x[i + k] : 1.0f;
        V_STORE(out, map_vector(f, V_LOAD(in), vp));
        for (int k = 0; i + k < n; k++) y[i + k] = out[k];
    }
}

static void map_simd(qkv_vf_ f, const float *x, float *y, int64_t n, float p) {
    switch (f) {
    case QKV_VF_EXP_: map_fixed(QKV_VF_EXP_, x, y, n, p); break;
    case QKV_VF_LOG_: map_fixed(QKV_VF_LOG_, x, y, n, p); break;
    case QKV_VF_TANH_: map_fixed(QKV_VF_TANH_, x, y, n, p); break;
    case QKV_VF_TANH_FAST_: map_fixed(QKV_VF_TANH_FAST_, x, y, n, p); break;
    case QKV_VF_SIGMOID_: map_fixed(QKV_VF_SIGMOID_, x, y, n, p); break;
    case QKV_VF_SOFTPLUS_: map_fixed(QKV_VF_SOFTPLUS_, x, y, n, p); break;
    default:
        if (p == 0.5f) map_fixed(QKV_VF_SQRT_POW_, x, y, n, p); // pow's own x^(1/2) (the gradient of x^1.5)
        else map_fixed(QKV_VF_POW_, x, y, n, p);
        break;
    }
}
