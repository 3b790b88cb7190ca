/*
 * custom.c — user-defined operators (qkv/custom.h): a forward and a backward written by the user, recorded
 * on the tape as one node.
 *   inputs [n_inputs tensors, any dtype] -> outputs [n_outputs new step tensors]
 * The node keeps a copy of the definition (its name too) and of the call (inputs, outputs, saved tensors) in
 * the step arena, so the caller's structures may go. Its first float output is the node's out, the others its
 * more_out: the walk runs the node once when any of them has a gradient (autograd/tape.c).
 */
#include "qkv_internal.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>

enum { NAME_MAX_LEN = 63 };

typedef struct custom_node {
    qkv_custom_op op;               /* the definition, op.name pointing at name below */
    char name[NAME_MAX_LEN + 1];
    char forward_fn[NAME_MAX_LEN + 32];  /* "qkv_custom: NAME: forward", errors are prefixed with it  */
    char backward_fn[NAME_MAX_LEN + 32]; /* "qkv_custom: NAME: backward"                              */
    qkv_custom_call call;
    qkv_tensor *more_out[QKV_CUSTOM_MAX_OUTPUTS];
} custom_node;

qkv_status qkv_set_error(qkv_ctx *ctx, qkv_status status, const char *fmt, ...) {
    if (!ctx) return QKV_ERR_NULL;
    if (status == QKV_OK || ctx->status != QKV_OK) return ctx->status;
    char msg[QKV_ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    if (fmt) vsnprintf(msg, sizeof msg, fmt, ap);
    else snprintf(msg, sizeof msg, "%s", qkv_status_name(status));
    va_end(ap);
    if ((int)status < 0 || status >= QKV_STATUS_COUNT) status = QKV_ERR_ARG; /* not a status qkv knows */
    return qkv_failc_(ctx, status, "%s", msg);
}

/* Run cb with recording off and the context marked as inside a callback; an error it raised or returned
 * becomes the context's, prefixed with where ("qkv_custom: NAME: forward"). */
static qkv_status run_callback(qkv_ctx *ctx, qkv_custom_fn cb, qkv_custom_call *call, const char *where) {
    bool recording = ctx->grad_enabled;
    ctx->grad_enabled = false;
    ctx->in_custom++;
    qkv_status returned = cb(ctx, call);
    ctx->in_custom--;
    ctx->grad_enabled = recording;
    if (ctx->status == QKV_OK && returned != QKV_OK)
        qkv_failc_(ctx, (int)returned > 0 && returned < QKV_STATUS_COUNT ? returned : QKV_ERR_ARG,
                   "returned %s (%d) without setting an error", qkv_status_name(returned), (int)returned);
    qkv_name_caller_(ctx, where);
    return ctx->status;
}

/* The node's backward: the gradients of every output (zeros where none flowed), the inputs' gradients to
 * add into, and the user's backward with recording off. */
static void custom_backward(qkv_ctx *ctx, qkv_node_ *node) {
    custom_node *c = node->saved;
    qkv_custom_call call = c->call; /* the callback's copy: what it changes stays in this walk */
    const char *fn = c->backward_fn;
    if (!c->op.backward) {
        qkv_failc_(ctx, QKV_ERR_STATE,
                   "%s: the operator has no backward (its qkv_custom_op.backward is NULL), and the loss depends "
                   "on its outputs; compute them with recording off (qkv_set_grad_enabled) or give it a backward",
                   fn);
        return;
    }
    char what[48];
    for (int k = 0; k < call.n_saved; k++) {
        snprintf(what, sizeof what, "saved tensor %d", k);
        if (!qkv_check_tensor_(ctx, fn, what, call.saved[k])) return;
    }
    for (int k = 0; k < call.n_outputs; k++) {
        qkv_tensor *out = call.outputs[k];
        call.grad_outputs[k] = NULL;
        if (!qkv_is_float_(out->dtype)) continue;
        if (out->grad) {
            call.grad_outputs[k] = out->grad;
            continue;
        }
        qkv_tensor *zeros = qkv_new_like_(ctx, fn, out); // dL/d out = 0: the loss does not depend on it
        if (!zeros) return;
        memset(zeros->data, 0, (size_t)zeros->numel * qkv_dtype_size(zeros->dtype));
        call.grad_outputs[k] = zeros;
    }
    for (int i = 0; i < call.n_inputs; i++) {
        qkv_tensor *in = call.inputs[i];
        call.grad_inputs[i] = NULL;
        if (qkv_is_float_(in->dtype) && qkv_wants_grad_(in) && !(call.grad_inputs[i] = qkv_grad_of_(ctx, in))) return;
    }
    run_callback(ctx, c->op.backward, &call, fn);
}

/* The definition is usable: a name of 1-63 printable characters, a forward, counts in range. */
static bool check_definition(qkv_ctx *ctx, const char *fn, const qkv_custom_op *op) {
    if (!op) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: op is NULL", fn), false;
    size_t len = 0;
    while (op->name && len <= NAME_MAX_LEN && op->name[len]) len++;
    if (len == 0 || len > NAME_MAX_LEN)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: op->name is %s; an operator needs a name of 1 to %d characters", fn,
                          op->name ? (len ? "too long" : "empty") : "NULL", NAME_MAX_LEN),
               false;
    for (size_t i = 0; i < len; i++)
        if (!isprint((unsigned char)op->name[i]))
            return qkv_failc_(ctx, QKV_ERR_ARG, "%s: op->name has the unprintable byte 0x%02x at %zu", fn,
                              (unsigned char)op->name[i], i),
                   false;
    if (!op->forward) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: %s: op->forward is NULL", fn, op->name), false;
    if (op->n_inputs < 1 || op->n_inputs > QKV_CUSTOM_MAX_INPUTS)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: %s: n_inputs is %d, must be 1 to %d", fn, op->name, op->n_inputs,
                          QKV_CUSTOM_MAX_INPUTS),
               false;
    if (op->n_outputs < 1 || op->n_outputs > QKV_CUSTOM_MAX_OUTPUTS)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: %s: n_outputs is %d, must be 1 to %d", fn, op->name, op->n_outputs,
                          QKV_CUSTOM_MAX_OUTPUTS),
               false;
    return true;
}

/* What the forward left: every output a new step tensor of this step, none an input or another output;
 * every saved tensor live. */
static bool check_results(qkv_ctx *ctx, const custom_node *c) {
    const char *fn = c->forward_fn;
    const qkv_custom_call *call = &c->call;
    for (int k = 0; k < call->n_outputs; k++) {
        const qkv_tensor *out = call->outputs[k];
        if (!out) return qkv_failc_(ctx, QKV_ERR_ARG, "%s: it left output %d NULL", fn, k), false;
        uint32_t made_in = 0;
        qkv_handle_kind_ kind = qkv_classify_(ctx, out, &made_in);
        if (kind != QKV_HANDLE_STEP_) {
            char what[32];
            snprintf(what, sizeof what, "output %d", k);
            if (kind != QKV_HANDLE_PERSISTENT_ && kind != QKV_HANDLE_GRAD_)
                return qkv_handle_fail_(ctx, fn, what, kind, made_in);
            return qkv_failc_(ctx, QKV_ERR_ARG,
                              "%s: output %d %s is a kept tensor or a gradient; outputs are new step tensors the "
                              "forward makes (copy it with qkv_copy if it must be returned)",
                              fn, k, QKV_SHAPE(out)),
                   false;
        }
        for (int i = 0; i < call->n_inputs; i++)
            if (out == call->inputs[i])
                return qkv_failc_(ctx, QKV_ERR_ARG,
                                  "%s: output %d is input %d itself; outputs are new tensors the forward makes", fn,
                                  k, i),
                       false;
        for (int j = 0; j < k; j++)
            if (out == call->outputs[j])
                return qkv_failc_(ctx, QKV_ERR_ARG, "%s: outputs %d and %d are the same tensor", fn, j, k), false;
        if (out->node_ || out->requires_grad)
            return qkv_failc_(ctx, QKV_ERR_ARG,
                              "%s: output %d %s was made by a recorded operator before the call, not by the forward",
                              fn, k, QKV_SHAPE(out)),
                   false;
    }
    if (call->n_saved < 0 || call->n_saved > QKV_CUSTOM_MAX_SAVED)
        return qkv_failc_(ctx, QKV_ERR_ARG, "%s: n_saved is %d, must be 0 to %d", fn, call->n_saved,
                          QKV_CUSTOM_MAX_SAVED),
               false;
    char what[32];
    for (int k = 0; k < call->n_saved; k++) {
        snprintf(what, sizeof what, "saved tensor %d", k);
        if (!qkv_check_tensor_(ctx, fn, what, call->saved[k])) return false;
    }
    return true;
}

qkv_status qkv_custom(qkv_ctx *ctx, const qkv_custom_op *op, qkv_tensor *const *inputs, qkv_tensor **outputs) {
    const char *fn = "qkv_custom";
    if (!ctx) return QKV_ERR_NULL;
    bool counts_ok = op && op->n_outputs >= 1 && op->n_outputs <= QKV_CUSTOM_MAX_OUTPUTS;
    if (outputs && counts_ok) // the outputs the definition declares, and no more
        for (int k = 0; k < op->n_outputs; k++) outputs[k] = NULL;
    if (ctx->status) return ctx->status;
    if (ctx->in_custom > 64)
        return qkv_failc_(ctx, QKV_ERR_STATE, "%s: user-defined operators nested more than 64 deep", fn);
    if (!check_definition(ctx, fn, op)) return ctx->status;
    if (!inputs) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: %s: inputs is NULL", fn, op->name);
    if (!outputs) return qkv_failc_(ctx, QKV_ERR_NULL, "%s: %s: outputs is NULL", fn, op->name);
    char what[64];
    for (int i = 0; i < op->n_inputs; i++) {
        snprintf(what, sizeof what, "%s: input %d", op->name, i);
        if (!qkv_check_tensor_(ctx, fn, what, inputs[i])) return ctx->status;
    }

    custom_node *c = qkv_arena_alloc_(ctx, fn, sizeof *c);
    if (!c) return ctx->status;
    memset(c, 0, sizeof *c);
    c->op = *op;
    memcpy(c->name, op->name, strlen(op->name) + 1);
    c->op.name = c->name;
    snprintf(c->forward_fn, sizeof c->forward_fn, "qkv_custom: %s: forward", c->name);
    snprintf(c->backward_fn, sizeof c->backward_fn, "qkv_custom: %s: backward", c->name);
    qkv_custom_call *call = &c->call;
    call->name = c->name;
    call->user = op->user;
    call->n_inputs = op->n_inputs;
    call->n_outputs = op->n_outputs;
    for (int i = 0; i < op->n_inputs; i++) call->inputs[i] = inputs[i];

    qkv_custom_call seen = *call; /* the forward's copy: it may change anything but outputs and saved */
    if (run_callback(ctx, op->forward, &seen, c->forward_fn)) return ctx->status;
    memcpy(call->outputs, seen.outputs, sizeof call->outputs);
    call->n_saved = seen.n_saved;
    if (seen.n_saved > 0 && seen.n_saved <= QKV_CUSTOM_MAX_SAVED)
        memcpy(call->saved, seen.saved, (size_t)seen.n_saved * sizeof call->saved[0]);
    if (!check_results(ctx, c)) return ctx->status;

    // one node for the operator when a float input needs a gradient: out = the first float output
    qkv_tensor *float_in[QKV_CUSTOM_MAX_INPUTS];
    int n_float_in = 0;
    for (int i = 0; i < call->n_inputs; i++)
        if (qkv_is_float_(call->inputs[i]->dtype)) float_in[n_float_in++] = call->inputs[i];
    qkv_tensor *first = NULL;
    int n_more = 0;
    for (int k = 0; k < call->n_outputs; k++) {
        if (!qkv_is_float_(call->outputs[k]->dtype)) continue;
        if (!first) first = call->outputs[k];
        else c->more_out[n_more++] = call->outputs[k];
    }
    if (first && qkv_needs_grad_(ctx, float_in, n_float_in)) {
        qkv_node_ *node = qkv_record_(ctx, c->name, custom_backward, first, call->inputs, call->n_inputs);
        if (!node) return ctx->status;
        node->saved = c;
        node->more_out = c->more_out;
        node->n_more_out = n_more;
        for (int k = 0; k < n_more; k++) c->more_out[k]->node_ = node, c->more_out[k]->requires_grad = true;
    }
    for (int k = 0; k < call->n_outputs; k++) outputs[k] = call->outputs[k];
    return QKV_OK;
}

qkv_tensor *qkv_custom1(qkv_ctx *ctx, const qkv_custom_op *op, qkv_tensor *const *inputs) {
    if (!ctx || ctx->status) return NULL;
    if (op && op->n_outputs != 1)
        return qkv_fail_(ctx, QKV_ERR_ARG, "qkv_custom1: %s has %d outputs; qkv_custom1 is for one (use qkv_custom)",
                         op->name ? op->name : "the operator", op->n_outputs);
    qkv_tensor *out = NULL;
    qkv_custom(ctx, op, inputs, &out);
    return out;
}
