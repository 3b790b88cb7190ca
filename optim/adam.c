/*
 * adam.c — Adam and AdamW's update of one parameter, as torch.optim.Adam / AdamW (PyTorch 1.13,
 * single-tensor path, amsgrad off). The optimizer object and its step loop are in optimizer.c.
 *   p [any shape], g = p->grad, m = exp_avg, v = exp_avg_sq [p's shape], all of p's dtype
 *
 * Computed in double, stored in p's dtype. t is the parameter's own step number (1 on its first update).
 * The element loops run over restrict arrays, one loop per decay kind (no branch inside), in functions
 * cloned per CPU (QKV_VECTOR_LOOP); every clone gives the bits of the scalar code: no FMA contraction
 * (GCC's -std=c17 turns it off; the pragma does for clang), and vector sqrt, divide and f32 <-> f64
 * conversions round as the scalar ones do. A large parameter's elements are split between threads in ranges
 * (each element's update depends on that element only: the same bits with any count).
 */
#include "qkv_internal.h"
#include "update.h"

#include <math.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The per-step scalars, shared by every element. */
typedef struct adam_scalars {
    double b1, b2;         /* betas                                                      */
    double one_b1, one_b2; /* 1 - b1, 1 - b2                                             */
    double l2;             /* Adam: wd (added to the gradient); AdamW: 0                 */
    double decay;          /* AdamW: 1 - lr wd (multiplies p); Adam: 1                   */
    double neg_step;       /* -lr / (1 - b1^t)                                           */
    double inv_bc2;        /* 1 / sqrt(1 - b2^t): one multiply per element, not a divide */
    double eps;
} adam_scalars;

/* Which decay a loop applies: fixed for the whole loop, so the loop has no branch. */
typedef enum adam_decay { ADAM_NO_DECAY, ADAM_L2, ADAM_DECOUPLED } adam_decay;

static inline double adam_element(adam_scalars s, adam_decay k, double p, double g, double *m, double *v) {
    if (k == ADAM_DECOUPLED) p = p * s.decay;    // AdamW: p = p (1 - lr wd)
    if (k == ADAM_L2) g = g + s.l2 * p;          // Adam:  g = g + wd p
    *m = *m * s.b1 + s.one_b1 * g;               // m = b1 m + (1 - b1) g
    *v = *v * s.b2 + s.one_b2 * g * g;           // v = b2 v + (1 - b2) g^2
    double denom = sqrt(*v) * s.inv_bc2 + s.eps; // denom = sqrt(v) / sqrt(1 - b2^t) + eps
    return p + s.neg_step * (*m / denom);        // p = p - lr / (1 - b1^t) * m / denom
}

static inline void adam_loop_f64(adam_scalars s, adam_decay k, double *restrict p, const double *restrict g,
                                 double *restrict m, double *restrict v, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = adam_element(s, k, p[i], g[i], &m[i], &v[i]);
}

/* f32: each element read into double, updated, rounded back (p from the unrounded m and v) */
static inline void adam_loop_f32(adam_scalars s, adam_decay k, float *restrict p, const float *restrict g,
                                 float *restrict m, float *restrict v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double mi = m[i], vi = v[i];
        p[i] = (float)adam_element(s, k, p[i], g[i], &mi, &vi);
        m[i] = (float)mi;
        v[i] = (float)vi;
    }
}

/* One loop per decay kind, each with its kind a constant (as SGD_CASES in sgd.c). */
#define ADAM_CASES(loop)                                                                                   \
    case ADAM_NO_DECAY: loop(s, ADAM_NO_DECAY, p, g, m, v, n); break;                                     \
    case ADAM_L2: loop(s, ADAM_L2, p, g, m, v, n); break;                                                 \
    case ADAM_DECOUPLED: loop(s, ADAM_DECOUPLED, p, g, m, v, n); break

QKV_VECTOR_LOOP
static void adam_f64(adam_scalars s, adam_decay k, double *restrict p, const double *restrict g,
                     double *restrict m, double *restrict v, int64_t n) {
    switch (k) { ADAM_CASES(adam_loop_f64); }
}

QKV_VECTOR_LOOP
static void adam_f32(adam_scalars s, adam_decay k, float *restrict p, const float *restrict g,
                     float *restrict m, float *restrict v, int64_t n) {
    switch (k) { ADAM_CASES(adam_loop_f32); }
}

void qkv_adam_update_(const qkv_optim_options *o, double t, qkv_tensor *p, const qkv_tensor *g,
                      qkv_tensor *m, qkv_tensor *v, int threads) {
    adam_scalars s;
    s.b1 = o->beta1;
    s.b2 = o->beta2;
    s.one_b1 = 1.0 - o->beta1;
    s.one_b2 = 1.0 - o->beta2;
    s.eps = o->eps;
    bool decoupled = o->kind == QKV_OPTIM_ADAMW;
    s.l2 = decoupled ? 0.0 : o->weight_decay;
    s.decay = decoupled ? 1.0 - o->lr * o->weight_decay : 1.0;
    s.neg_step = -(o->lr / (1.0 - pow(o->beta1, t))); // -lr / bias_correction1
    s.inv_bc2 = 1.0 / sqrt(1.0 - pow(o->beta2, t));   // 1 / sqrt(bias_correction2)
    /* as before, a decay that changes nothing is not applied: g + 0 p is not g when p is inf */
    adam_decay k = s.decay != 1.0 ? ADAM_DECOUPLED : s.l2 != 0.0 ? ADAM_L2 : ADAM_NO_DECAY;
    /* each thread at least QKV_ADAM_GRAIN_ elements (about 0.1 ms), in ranges of whole 64-byte lines */
    int64_t n = p->numel, nt = threads < 1 ? 1 : threads;
    if (n / QKV_ADAM_GRAIN_ < nt) nt = n / QKV_ADAM_GRAIN_;
    if (nt < 1) nt = 1;
    int64_t chunk = ((n + nt - 1) / nt + 15) / 16 * 16;
#ifdef QKV_HAVE_OPENMP
#pragma omp parallel for schedule(static, 1) num_threads((int)nt) if (nt > 1)
#endif
    for (int64_t t = 0; t < nt; t++) {
        int64_t i0 = t * chunk, count = i0 + chunk < n ? chunk : n - i0;
        if (count <= 0) continue;
        if (p->dtype == QKV_F64)
            adam_f64(s, k, (double *)p->data + i0, (const double *)g->data + i0, (double *)m->data + i0,
                     (double *)v->data + i0, count);
        else
            adam_f32(s, k, (float *)p->data + i0, (const float *)g->data + i0, (float *)m->data + i0,
                     (float *)v->data + i0, count);
    }
}
