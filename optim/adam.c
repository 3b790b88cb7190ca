/*
 * adam.c — Adam and AdamW's update of one parameter, as torch.optim.Adam / AdamW (PyTorch 1.13,
 * single-tensor path, amsgrad off). The optimizer object and its step loop are in sgd.c.
 *   p [any shape], g = p->grad, m = exp_avg, v = exp_avg_sq [p's shape], all of p's dtype
 *
 * Computed in double, stored in p's dtype. t is the parameter's own step number (1 on its first update).
 */
#include "qkv_internal.h"

#include <math.h>

/* The per-step scalars, shared by every element. */
typedef struct adam_scalars {
    double b1, b2;     /* betas                                                      */
    double l2;         /* Adam: wd (added to the gradient); AdamW: 0                 */
    double decay;      /* AdamW: 1 - lr wd (multiplies p); Adam: 1                   */
    double step_size;  /* lr / (1 - b1^t)                                            */
    double inv_bc2;    /* 1 / sqrt(1 - b2^t): one multiply per element, not a divide */
    double eps;
} adam_scalars;

static inline double adam_element(const adam_scalars *s, double p, double g, double *m, double *v) {
    if (s->decay != 1.0) p = p * s->decay;         // AdamW: p = p (1 - lr wd)
    if (s->l2 != 0.0) g = g + s->l2 * p;           // Adam:  g = g + wd p
    *m = *m * s->b1 + (1.0 - s->b1) * g;           // m = b1 m + (1 - b1) g
    *v = *v * s->b2 + (1.0 - s->b2) * g * g;       // v = b2 v + (1 - b2) g^2
    double denom = sqrt(*v) * s->inv_bc2 + s->eps; // denom = sqrt(v) / sqrt(1 - b2^t) + eps
    return p + -s->step_size * (*m / denom);       // p = p - lr / (1 - b1^t) * m / denom
}

void qkv_adam_update_(const qkv_optim_options *o, double t, qkv_tensor *p, const qkv_tensor *g,
                      qkv_tensor *m, qkv_tensor *v) {
    adam_scalars s;
    s.b1 = o->beta1;
    s.b2 = o->beta2;
    s.eps = o->eps;
    bool decoupled = o->kind == QKV_OPTIM_ADAMW;
    s.l2 = decoupled ? 0.0 : o->weight_decay;
    s.decay = decoupled ? 1.0 - o->lr * o->weight_decay : 1.0;
    s.step_size = o->lr / (1.0 - pow(o->beta1, t)); // lr / bias_correction1
    s.inv_bc2 = 1.0 / sqrt(1.0 - pow(o->beta2, t)); // 1 / sqrt(bias_correction2)
    if (p->dtype == QKV_F64) {
        double *pp = p->data, *mm = m->data, *vv = v->data;
        const double *gg = g->data;
        for (int64_t i = 0; i < p->numel; i++) pp[i] = adam_element(&s, pp[i], gg[i], &mm[i], &vv[i]);
    } else {
        float *pp = p->data, *mm = m->data, *vv = v->data;
        const float *gg = g->data;
        for (int64_t i = 0; i < p->numel; i++) {
            double mi = mm[i], vi = vv[i];
            pp[i] = (float)adam_element(&s, pp[i], gg[i], &mi, &vi);
            mm[i] = (float)mi;
            vv[i] = (float)vi;
        }
    }
}
