/*
 * sgd.c — SGD's update of one parameter, as torch.optim.SGD (PyTorch 1.13, single-tensor path,
 * maximize=False). The optimizer object and its step loop are in optimizer.c.
 *   p [any shape], g = p->grad [p's shape], buf (momentum buffer) [p's shape], all of p's dtype
 *
 * Computed in double, stored in p's dtype. The element loops run over restrict arrays, one loop per
 * variant (no branch inside), in functions cloned per CPU (QKV_VECTOR_LOOP); every clone gives the bits
 * of the scalar code (no FMA contraction: GCC's -std=c17 turns it off; the pragma does for clang).
 */
#include "qkv_internal.h"
#include "update.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The per-step scalars, shared by every element. */
typedef struct sgd_scalars {
    double wd;      /* weight decay (the loop without it never reads this) */
    double mu;      /* momentum                                            */
    double one_tau; /* 1 - dampening                                       */
    double neg_lr;  /* -lr                                                 */
} sgd_scalars;

/* What a loop does with the momentum buffer: fixed for the whole loop, so the loop has no branch. */
typedef enum sgd_kind {
    SGD_PLAIN,          /* no momentum: no buffer                             */
    SGD_FIRST,          /* momentum, the parameter's first step: buf = d      */
    SGD_FIRST_NESTEROV, /* the same, then nesterov                            */
    SGD_MOMENTUM,       /* momentum, later steps: buf = mu buf + (1 - tau) d  */
    SGD_NESTEROV        /* the same, then nesterov                            */
} sgd_kind;

// One element: d = g + wd p;  buf = d (first) or momentum buf + (1 - dampening) d;
//              d = d + momentum buf (nesterov) or buf;  p = p - lr d
static inline double sgd_element(sgd_scalars s, sgd_kind k, bool wd, double p, double g, double *buf) {
    bool first = k == SGD_FIRST || k == SGD_FIRST_NESTEROV;
    bool nesterov = k == SGD_FIRST_NESTEROV || k == SGD_NESTEROV;
    double d = g;
    if (wd) d = d + s.wd * p; // d = g + wd p
    if (k != SGD_PLAIN) {
        *buf = first ? d : s.mu * *buf + s.one_tau * d; // buf = d, or mu buf + (1 - tau) d
        d = nesterov ? d + s.mu * *buf : *buf;          // d = d + mu buf, or buf
    }
    return p + s.neg_lr * d; // p = p - lr d
}

static inline void sgd_loop_f64(sgd_scalars s, sgd_kind k, bool wd, double *restrict p,
                                const double *restrict g, double *restrict buf, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double b = k == SGD_MOMENTUM || k == SGD_NESTEROV ? buf[i] : 0.0;
        p[i] = sgd_element(s, k, wd, p[i], g[i], &b);
        if (k != SGD_PLAIN) buf[i] = b;
    }
}

/* f32: each element read into double, updated, rounded back (p from the unrounded buffer) */
static inline void sgd_loop_f32(sgd_scalars s, sgd_kind k, bool wd, float *restrict p,
                                const float *restrict g, float *restrict buf, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double b = k == SGD_MOMENTUM || k == SGD_NESTEROV ? buf[i] : 0.0;
        p[i] = (float)sgd_element(s, k, wd, p[i], g[i], &b);
        if (k != SGD_PLAIN) buf[i] = (float)b;
    }
}

/* One loop per (kind, weight decay or not), so that none branches per element. */
#define SGD_CASES(loop)                                                                                    \
    case 2 * SGD_PLAIN: loop(s, SGD_PLAIN, false, p, g, buf, n); break;                                   \
    case 2 * SGD_PLAIN + 1: loop(s, SGD_PLAIN, true, p, g, buf, n); break;                                \
    case 2 * SGD_FIRST: loop(s, SGD_FIRST, false, p, g, buf, n); break;                                   \
    case 2 * SGD_FIRST + 1: loop(s, SGD_FIRST, true, p, g, buf, n); break;                                \
    case 2 * SGD_FIRST_NESTEROV: loop(s, SGD_FIRST_NESTEROV, false, p, g, buf, n); break;                 \
    case 2 * SGD_FIRST_NESTEROV + 1: loop(s, SGD_FIRST_NESTEROV, true, p, g, buf, n); break;              \
    case 2 * SGD_MOMENTUM: loop(s, SGD_MOMENTUM, false, p, g, buf, n); break;                             \
    case 2 * SGD_MOMENTUM + 1: loop(s, SGD_MOMENTUM, true, p, g, buf, n); break;                          \
    case 2 * SGD_NESTEROV: loop(s, SGD_NESTEROV, false, p, g, buf, n); break;                             \
    case 2 * SGD_NESTEROV + 1: loop(s, SGD_NESTEROV, true, p, g, buf, n); break

QKV_VECTOR_LOOP
static void sgd_f64(sgd_scalars s, int variant, double *restrict p, const double *restrict g,
                    double *restrict buf, int64_t n) {
    switch (variant) { SGD_CASES(sgd_loop_f64); }
}

QKV_VECTOR_LOOP
static void sgd_f32(sgd_scalars s, int variant, float *restrict p, const float *restrict g,
                    float *restrict buf, int64_t n) {
    switch (variant) { SGD_CASES(sgd_loop_f32); }
}

/* One SGD update of p from g; buf is the momentum buffer (NULL without momentum). */
void qkv_sgd_update_(const qkv_optim_options *o, bool first, qkv_tensor *p, const qkv_tensor *g,
                     qkv_tensor *buf) {
    sgd_scalars s = {o->weight_decay, o->momentum, 1.0 - o->dampening, -o->lr};
    sgd_kind k = !buf ? SGD_PLAIN
                 : first ? (o->nesterov ? SGD_FIRST_NESTEROV : SGD_FIRST)
                         : (o->nesterov ? SGD_NESTEROV : SGD_MOMENTUM);
    int variant = 2 * (int)k + (o->weight_decay != 0);
    if (p->dtype == QKV_F64)
        sgd_f64(s, variant, p->data, g->data, buf ? buf->data : NULL, p->numel);
    else
        sgd_f32(s, variant, p->data, g->data, buf ? buf->data : NULL, p->numel);
}

