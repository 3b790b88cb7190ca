/*
 * tape.c — the reverse-mode tape: recording nodes, grad modes, and qkv_backward.
 *
 * The tape is a singly linked list of nodes in the step arena, newest first. Nodes are appended in the
 * order operators run, which is a topological order of the graph, so walking the list from the loss's
 * node back to the first node visits every node after all the nodes that use its output. Each node's
 * backward reads out->grad and adds (+=) into the grads of its inputs. No recursion: a chain of any
 * length needs no stack.
 */
#include "qkv_internal.h"

#include <math.h>

bool qkv_needs_grad_(const qkv_ctx *ctx, qkv_tensor *const *inputs, int n) {
    if (!ctx->grad_enabled) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) return true;
    return false;
}

qkv_node_ *qkv_record_(qkv_ctx *ctx, const char *op, qkv_backward_fn_ backward, qkv_tensor *out,
                       qkv_tensor *const *inputs, int n_in) {
    qkv_node_ *node = qkv_arena_alloc_(ctx, op, sizeof *node);
    if (!node) return NULL;
    memset(node, 0, sizeof *node);
    node->prev = ctx->tape;
    node->op = op;
    node->backward = backward;
    node->out = out;
    node->n_in = n_in;
    for (int i = 0; i < n_in && i < QKV_NODE_MAX_INPUTS; i++) node->in[i] = inputs[i];
    ctx->tape = node;
    out->node_ = node;
    out->requires_grad = true;
    return node;
}

/* g += dloss (1 when dloss is NULL), or g = dloss when g is fresh (made for this call, not zeroed: every
 * element is stored, and a same-dtype dloss is one memcpy). A loop per dtype pair, with no branch inside: a
 * [32*128, 256] dloss is a million elements, which a per-element dtype test made cost more than many
 * operators' backward; and a fresh gradient zeroed, then added into, cost a third pass over it. */
static void seed_loss_grad(qkv_tensor *g, const qkv_tensor *dloss, bool fresh) {
    int64_t n = g->numel;
    if (!dloss) {
        for (int64_t i = 0; i < n; i++) {
            if (g->dtype == QKV_F64) ((double *)g->data)[i] = (fresh ? 0.0 : ((double *)g->data)[i]) + 1.0;
            else ((float *)g->data)[i] = (fresh ? 0.0f : ((float *)g->data)[i]) + 1.0f;
        }
        return;
    }
    if (fresh && g->dtype == dloss->dtype) { // g = dloss
        memcpy(g->data, dloss->data, (size_t)n * qkv_dtype_size(g->dtype));
    } else if (fresh && g->dtype == QKV_F32) { // g = (float)dloss
        float *restrict gv = g->data;
        const double *restrict dv = dloss->data;
        for (int64_t i = 0; i < n; i++) gv[i] = (float)dv[i];
    } else if (fresh) { // g = (double)dloss
        double *restrict gv = g->data;
        const float *restrict dv = dloss->data;
        for (int64_t i = 0; i < n; i++) gv[i] = (double)dv[i];
    } else if (g->dtype == QKV_F32 && dloss->dtype == QKV_F32) {
        float *restrict gv = g->data;
        const float *restrict dv = dloss->data;
        for (int64_t i = 0; i < n; i++) gv[i] += dv[i];
    } else if (g->dtype == QKV_F64 && dloss->dtype == QKV_F64) {
        double *restrict gv = g->data;
        const double *restrict dv = dloss->data;
        for (int64_t i = 0; i < n; i++) gv[i] += dv[i];
    } else if (g->dtype == QKV_F32) {
        float *restrict gv = g->data;
        const double *restrict dv = dloss->data;
        for (int64_t i = 0; i < n; i++) gv[i] += (float)dv[i];
    } else {
        double *restrict gv = g->data;
        const float *restrict dv = dloss->data;
        for (int64_t i = 0; i < n; i++) gv[i] += (double)dv[i];
    }
}

/* True when the loss's gradient can be dloss itself, not a copy (as PyTorch's out.backward(dy) hands dy to
 * the graph): the loss is an operator's step tensor with no gradient yet (so nothing else adds into it),
 * and dloss is a tensor of its dtype that the walk cannot write: not the loss, and not a gradient (the walk
 * adds into gradients; a step tensor's are made only by a walk, and this step has none yet; a persistent
 * tensor's gradient is QKV_HANDLE_GRAD_). Either a step tensor, which lives exactly as long as the loss's
 * gradient would, or a kept tensor (persistent, not a parameter: an optimizer step writes a parameter's
 * values), which outlives the step; if it is freed first, qkv_free takes it back from the loss
 * (qkv_take_back_dloss_), so one is lent a step (a second backward in the step, after a rewind, copies).
 * Saves a copy of dloss (at [32*128, 256], a pass over 8 MB). */
static bool borrows_dloss(const qkv_ctx *ctx, const qkv_tensor *loss, const qkv_tensor *dloss) {
    if (!dloss || dloss == loss || loss->grad || !loss->node_ || loss->epoch_ == 0 || dloss->dtype != loss->dtype)
        return false;
    uint32_t made_in = 0;
    qkv_handle_kind_ kind = qkv_classify_(ctx, dloss, &made_in);
    if (kind == QKV_HANDLE_STEP_) return true;
    if (kind != QKV_HANDLE_PERSISTENT_ || ctx->lent_dloss) return false; /* one kept dloss lent a step */
    for (int i = 0; i < ctx->n_params; i++)
        if (ctx->params[i] == dloss) return false;
    return true;
}

void qkv_take_back_dloss_(qkv_ctx *ctx, const qkv_tensor *t) {
    if (!ctx->lent_dloss || ctx->lent_dloss != t) return;
    qkv_tensor *loss = ctx->lent_to;
    /* the loss's header may have been released since (a rewind): only a live step tensor still holding t */
    if (loss->magic_ == QKV_TENSOR_MAGIC && loss->epoch_ == ctx->epoch && loss->grad == t) loss->grad = NULL;
    ctx->lent_dloss = NULL;
    ctx->lent_to = NULL;
}

bool qkv_set_grad_enabled(qkv_ctx *ctx, bool enabled) {
    if (!ctx) return false;
    bool previous = ctx->grad_enabled;
    ctx->grad_enabled = enabled;
    return previous;
}

bool qkv_grad_enabled(const qkv_ctx *ctx) { return ctx && ctx->grad_enabled; }

void qkv_set_anomaly_mode(qkv_ctx *ctx, bool enabled) {
    if (ctx) ctx->anomaly = enabled;
}

qkv_status qkv_set_requires_grad(qkv_ctx *ctx, qkv_tensor *t, bool requires_grad) {
    const char *fn = "qkv_set_requires_grad";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!qkv_check_float_(ctx, fn, "tensor", t)) return ctx->status;
    if (t->node_)
        return qkv_failc_(ctx, QKV_ERR_STATE,
                          "%s: tensor %s was made by %s; only leaves (tensors no operator made) can change",
                          fn, QKV_SHAPE(t), t->node_->op);
    t->requires_grad = requires_grad;
    return QKV_OK;
}

qkv_status qkv_zero_grad(qkv_ctx *ctx, qkv_tensor *t) {
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (!qkv_check_tensor_(ctx, "qkv_zero_grad", "tensor", t)) return ctx->status;
    if (t->grad) memset(t->grad->data, 0, (size_t)t->grad->numel * qkv_dtype_size(t->grad->dtype));
    return QKV_OK;
}

void qkv_zero_grads(qkv_ctx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < ctx->n_params; i++) {
        qkv_tensor *g = ctx->params[i]->grad;
        if (g) memset(g->data, 0, (size_t)g->numel * qkv_dtype_size(g->dtype));
    }
}

/* Index of the first NaN or inf in t, or -1. */
static int64_t first_nonfinite(const qkv_tensor *t) {
    for (int64_t i = 0; i < t->numel; i++) {
        double v = t->dtype == QKV_F64 ? ((const double *)t->data)[i] : ((const float *)t->data)[i];
        if (!isfinite(v)) return i;
    }
    return -1;
}

/* Anomaly mode: after a node's backward, check every input gradient it touched. */
static bool check_node_grads(qkv_ctx *ctx, const qkv_node_ *node) {
    for (int i = 0; i < node->n_in; i++) {
        const qkv_tensor *in = node->in[i];
        if (!in || !in->requires_grad || !in->grad) continue;
        int64_t bad = first_nonfinite(in->grad);
        if (bad >= 0) {
            double v = in->grad->dtype == QKV_F64 ? ((const double *)in->grad->data)[bad]
                                                  : ((const float *)in->grad->data)[bad];
            qkv_fail_(ctx, QKV_ERR_NUMERIC,
                      "qkv_backward: anomaly in the backward of %s: gradient of input %d %s is %g at flat "
                      "index %lld",
                      node->op, i, QKV_SHAPE(in), v, (long long)bad);
            return false;
        }
    }
    return true;
}

/* The inputs a node saved were checked when it was recorded; one may have been freed since (qkv_free of a
 * parameter or of a kept mask between the forward and the backward). Checked again by address, before the
 * node's backward reads or writes into them. */
static bool check_node_inputs(qkv_ctx *ctx, const qkv_node_ *node) {
    char name[64]; /* formatted only for the message: a backward walks thousands of nodes */
    for (int i = 0; i < node->n_in && i < QKV_NODE_MAX_INPUTS; i++) {
        if (!node->in[i] || qkv_tensor_is_live_(ctx, node->in[i])) continue;
        snprintf(name, sizeof name, "input %d of %s", i, node->op);
        return qkv_check_tensor_(ctx, "qkv_backward", name, node->in[i]);
    }
    if (node->aux && !qkv_tensor_is_live_(ctx, node->aux)) {
        snprintf(name, sizeof name, "the mask or targets of %s", node->op);
        return qkv_check_tensor_(ctx, "qkv_backward", name, node->aux);
    }
    return true;
}

/* release_grads, after node's backward: nothing reads node->out->grad any more (every node that used out
 * came later on the tape and has run), so an intermediate's gradient goes back to the arena and out->grad
 * becomes NULL; its header is cleared, so the old pointer is no live tensor. The backward's own allocations
 * (logged by the arena since the last node) go back too, except the gradients it made for its inputs. A
 * borrowed dloss (the loss's gradient when borrows_dloss) is only let go of: the caller's tensor stays. */
static void release_out_grad(qkv_ctx *ctx, qkv_tensor *out, const qkv_tensor *borrowed) {
    qkv_tensor *g = out->grad;
    if (!g || g->epoch_ == 0) return; /* none, or a persistent tensor's gradient (one made by an operator, then kept) */
    out->grad = NULL;
    if (g == borrowed) return; /* the caller's dloss (see borrows_dloss): theirs, not the walk's */
    g->magic_ = 0;
    qkv_arena_release_(ctx, g->data, (size_t)g->numel * qkv_dtype_size(g->dtype));
}

static void release_node(qkv_ctx *ctx, qkv_node_ *node, const qkv_tensor *borrowed) {
    qkv_arena_ *a = &ctx->arena;
    for (int j = 0; j < a->n_log; j++) {
        bool grad = false;
        for (int i = 0; i < node->n_in && i < QKV_NODE_MAX_INPUTS; i++)
            if (node->in[i] && node->in[i]->grad && node->in[i]->grad->data == a->log[j]) grad = true;
        if (!grad) qkv_arena_release_(ctx, a->log[j], a->log_size[j]);
    }
    a->n_log = 0;
    release_out_grad(ctx, node->out, borrowed);
    for (int k = 0; k < node->n_more_out; k++) release_out_grad(ctx, node->more_out[k], borrowed);
}

/* The loss depends on node: one of its outputs has a gradient (a user-defined operator has several). */
static bool node_has_grad(const qkv_node_ *node) {
    if (node->out->grad) return true;
    for (int k = 0; k < node->n_more_out; k++)
        if (node->more_out[k]->grad) return true;
    return false;
}

qkv_status qkv_backward(qkv_ctx *ctx, qkv_tensor *loss, const qkv_tensor *dloss) {
    const char *fn = "qkv_backward";
    if (!ctx) return QKV_ERR_NULL;
    if (ctx->status) return ctx->status;
    if (ctx->in_custom)
        return qkv_failc_(ctx, QKV_ERR_STATE,
                          "%s: called from a callback of a user-defined operator; a callback may not walk the tape",
                          fn);
    if (!qkv_check_float_(ctx, fn, "loss", loss)) return ctx->status;
    if (ctx->tape_consumed)
        return qkv_failc_(ctx, QKV_ERR_STATE,
                          "%s: this step's tape was already walked by a backward; call qkv_step_end and "
                          "build the graph again",
                          fn);
    if (!loss->requires_grad)
        return qkv_failc_(ctx, QKV_ERR_STATE,
                          "%s: loss %s does not require grad (no input requires grad, or it was made with "
                          "grad recording off)",
                          fn, QKV_SHAPE(loss));
    if (dloss) {
        if (!qkv_check_float_(ctx, fn, "dloss", dloss)) return ctx->status;
        if (!qkv_same_shape_(loss, dloss))
            return qkv_failc_(ctx, QKV_ERR_SHAPE, "%s: loss is %s but dloss is %s; they must match", fn,
                              QKV_SHAPE(loss), QKV_SHAPE(dloss));
    } else if (loss->numel != 1) {
        return qkv_failc_(ctx, QKV_ERR_SHAPE,
                          "%s: loss %s is not a single element; pass dloss, its upstream gradient", fn,
                          QKV_SHAPE(loss));
    }

    const qkv_tensor *borrowed = NULL;
    if (borrows_dloss(ctx, loss, dloss)) {
        loss->grad = (qkv_tensor *)dloss; /* read, never written, by the walk */
        borrowed = dloss;
        if (dloss->epoch_ == 0) ctx->lent_dloss = dloss, ctx->lent_to = loss;
    } else {
        bool fresh;
        qkv_tensor *g = qkv_grad_to_write_(ctx, loss, &fresh); /* a step tensor's: made here, not zeroed */
        if (!g) return ctx->status;
        seed_loss_grad(g, dloss, fresh);
    }

    ctx->tape_consumed = true;
    if (ctx->release_grads) qkv_arena_reuse_(ctx, true);
    for (qkv_node_ *node = loss->node_; node; node = node->prev) {
        if (!node_has_grad(node)) continue; /* the loss does not depend on this node */
        if (!check_node_inputs(ctx, node)) break;
        node->backward(ctx, node);
        /* a node's backward reports in its operator's name (out of memory in qkv_softmax's scratch): the
         * user called qkv_backward, so the message starts with it ("qkv_backward: qkv_softmax: ...") */
        if (ctx->status) {
            qkv_name_caller_(ctx, fn);
            break;
        }
        if (ctx->anomaly && !check_node_grads(ctx, node)) break;
        if (ctx->release_grads) release_node(ctx, node, borrowed);
    }
    if (ctx->release_grads) qkv_arena_reuse_(ctx, false);
    return ctx->status;
}
