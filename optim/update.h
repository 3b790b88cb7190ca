/*
 * update.h — the update of one parameter by each optimizer kind, called by the step loop in optimizer.c.
 * Each reads g, writes p and its state tensors in place (all of p's dtype and shape), computes in double
 * and allocates nothing; the options are the optimizer's, already checked.
 */
#ifndef QKV_OPTIM_UPDATE_H
#define QKV_OPTIM_UPDATE_H

#include "qkv_internal.h"

/* SGD (sgd.c): first is the parameter's first step (buf = d); buf is the momentum buffer, NULL without
 * momentum. */
void qkv_sgd_update_(const qkv_optim_options *o, bool first, qkv_tensor *p, const qkv_tensor *g,
                     qkv_tensor *buf);

/* Adam and AdamW (adam.c): moments m, v at the parameter's step t (1 on its first update); a parameter of
 * at least 2 QKV_ADAM_GRAIN_ elements (qkv_internal.h) is updated on up to `threads` threads (the same bits with any count). */
void qkv_adam_update_(const qkv_optim_options *o, double t, qkv_tensor *p, const qkv_tensor *g, qkv_tensor *m,
                      qkv_tensor *v, int threads);

#endif
