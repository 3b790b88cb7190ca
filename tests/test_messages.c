/*
 * test_messages.c — an error message names the public function the user called, never a function the
 * library called on its behalf (qkv_ones used to say "qkv_full:", the initialisers "qkv_rand_uniform:",
 * qkv_copy "qkv_to_dtype:", attention with A "qkv_softmax:" or "qkv_matmul:").
 *
 * Two tables. Bad arguments: each call is made once on a fresh context. Failed allocations: each call is
 * made again and again on a fresh context whose allocator fails its k-th allocation after the call starts,
 * k = 1, 2, ... until the call makes no more (the step arena grows by tiny chunks, so nearly every arena
 * allocation is a malloc that can fail). Every message must start with "<function>: ".
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "qkv.h"
#include "test_alloc.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static counting *armed;  /* the allocator of the context being run */
static long fail_after;  /* which allocation of the call fails: 1 is the first */

/* From here on, the fail_after-th allocation fails (the inputs are made before, with no failure). */
static void arm(void) { armed->fail_at = armed->calls + fail_after; }

static qkv_tensor *ones(qkv_ctx *c, int ndim, const int64_t *shape) {
    qkv_tensor *t = qkv_ones(c, QKV_F32, ndim, shape);
    cr_assert_not_null(t, "%s", qkv_errmsg(c));
    return t;
}

static qkv_tensor *grad_ones(qkv_ctx *c, int ndim, const int64_t *shape) {
    qkv_tensor *t = ones(c, ndim, shape);
    qkv_set_requires_grad(c, t, true);
    return t;
}

typedef struct msg_case {
    const char *fn; /* the public function called: the message must start with it */
    void (*run)(qkv_ctx *c);
} msg_case;

/* ---- bad arguments ----------------------------------------------------------------------------------- */

static void ones_rank(qkv_ctx *c) { qkv_ones(c, QKV_F32, SHAPE(1, 2, 3, 4, 5)); }
static void ones_overflow(qkv_ctx *c) { qkv_ones(c, QKV_F64, SHAPE(1LL << 40, 1LL << 40)); }
static void scalar_dtype(qkv_ctx *c) { qkv_scalar(c, (qkv_dtype)9, 1.0); }
static void full_negative(qkv_ctx *c) { qkv_full(c, QKV_F32, SHAPE(2, -1), 3.0); }
static void xavier_dtype(qkv_ctx *c) { qkv_xavier_uniform(c, QKV_I32, 3, 4); }
static void xavier_overflow(qkv_ctx *c) { qkv_xavier_uniform(c, QKV_F32, INT64_MAX, 1); }
static void he_dtype(qkv_ctx *c) { qkv_he_normal(c, QKV_U8, 3, 4); }
static void he_overflow(qkv_ctx *c) { qkv_he_normal(c, QKV_F64, 1LL << 40, 1LL << 40); }
static void copy_null(qkv_ctx *c) { qkv_copy(c, NULL); }
static void to_dtype_bad(qkv_ctx *c) { qkv_to_dtype(c, ones(c, SHAPE(2)), (qkv_dtype)7); }
static void keep_null(qkv_ctx *c) { qkv_keep(c, NULL); }
static void print_null(qkv_ctx *c) { qkv_print(c, ones(c, SHAPE(2)), NULL); }
static void attention_a_mask(qkv_ctx *c) {
    qkv_tensor *q = ones(c, SHAPE(2, 3, 4)), *attn;
    qkv_attention(c, q, q, q, qkv_ones(c, QKV_U8, SHAPE(3, 5)), QKV_SCALE_DEFAULT, 0, &attn);
}
static void attention_a_flags(qkv_ctx *c) {
    qkv_tensor *q = ones(c, SHAPE(2, 3, 4)), *attn;
    qkv_attention(c, q, q, q, NULL, QKV_SCALE_DEFAULT, 8, &attn);
}
static void self_attention_a_mask(qkv_ctx *c) {
    qkv_tensor *x = ones(c, SHAPE(2, 3, 4)), *w = ones(c, SHAPE(4, 4)), *attn;
    qkv_self_attention(c, x, w, w, w, qkv_ones(c, QKV_U8, SHAPE(2, 2)), QKV_SCALE_DEFAULT, 0, &attn);
}
static void self_attention_mask(qkv_ctx *c) {
    qkv_tensor *x = ones(c, SHAPE(2, 3, 4)), *w = ones(c, SHAPE(4, 4));
    qkv_self_attention(c, x, w, w, w, qkv_ones(c, QKV_U8, SHAPE(2, 2)), QKV_SCALE_DEFAULT, 0, NULL);
}

static const msg_case bad_args[] = {
    {"qkv_ones", ones_rank},
    {"qkv_ones", ones_overflow},
    {"qkv_scalar", scalar_dtype},
    {"qkv_full", full_negative},
    {"qkv_xavier_uniform", xavier_dtype},
    {"qkv_xavier_uniform", xavier_overflow},
    {"qkv_he_normal", he_dtype},
    {"qkv_he_normal", he_overflow},
    {"qkv_copy", copy_null},
    {"qkv_to_dtype", to_dtype_bad},
    {"qkv_keep", keep_null},
    {"qkv_print", print_null},
    {"qkv_attention", attention_a_mask},
    {"qkv_attention", attention_a_flags},
    {"qkv_self_attention", self_attention_a_mask},
    {"qkv_self_attention", self_attention_mask},
};

/* ---- failed allocations ------------------------------------------------------------------------------ */

static void f_ones(qkv_ctx *c) { arm(); qkv_ones(c, QKV_F32, SHAPE(3, 4)); }
static void f_full(qkv_ctx *c) { arm(); qkv_full(c, QKV_F64, SHAPE(3, 4), 2.0); }
static void f_scalar(qkv_ctx *c) { arm(); qkv_scalar(c, QKV_F32, 2.0); }
static void f_zeros(qkv_ctx *c) { arm(); qkv_zeros(c, QKV_F32, SHAPE(3, 4)); }
static void f_randn(qkv_ctx *c) { arm(); qkv_randn(c, QKV_F32, SHAPE(3, 4), 0, 1); }
static void f_rand_uniform(qkv_ctx *c) { arm(); qkv_rand_uniform(c, QKV_F32, SHAPE(3, 4), 0, 1); }
static void f_xavier(qkv_ctx *c) { arm(); qkv_xavier_uniform(c, QKV_F32, 3, 4); }
static void f_he(qkv_ctx *c) { arm(); qkv_he_normal(c, QKV_F64, 3, 4); }
static void f_copy(qkv_ctx *c) {
    qkv_tensor *t = ones(c, SHAPE(3, 4));
    arm(); qkv_copy(c, t);
}
static void f_to_dtype(qkv_ctx *c) {
    qkv_tensor *t = ones(c, SHAPE(3, 4));
    arm(); qkv_to_dtype(c, t, QKV_F64);
}
static void f_keep(qkv_ctx *c) {
    qkv_tensor *t = ones(c, SHAPE(3, 4));
    arm(); qkv_keep(c, t);
}
static void f_param(qkv_ctx *c) {
    qkv_tensor *t = ones(c, SHAPE(3, 4));
    arm(); qkv_param(c, t);
}
static void f_matmul(qkv_ctx *c) {
    qkv_tensor *a = grad_ones(c, SHAPE(2, 3, 4)), *b = ones(c, SHAPE(2, 5, 4));
    arm(); qkv_matmul(c, a, b, QKV_TRANS_B);
}
static void f_projection(qkv_ctx *c) {
    qkv_tensor *x = grad_ones(c, SHAPE(2, 3, 4)), *w = ones(c, SHAPE(4, 5)), *b = ones(c, SHAPE(5));
    arm(); qkv_projection(c, x, w, b);
}
static void f_split_heads(qkv_ctx *c) {
    qkv_tensor *x = grad_ones(c, SHAPE(2, 3, 4));
    arm(); qkv_split_heads(c, x, 2);
}
static void f_attention(qkv_ctx *c) {
    qkv_tensor *q = grad_ones(c, SHAPE(2, 3, 4));
    arm(); qkv_attention(c, q, q, q, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL);
}
static void f_attention_a(qkv_ctx *c) {
    qkv_tensor *q = grad_ones(c, SHAPE(2, 3, 4)), *attn;
    arm(); qkv_attention(c, q, q, q, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, &attn);
}
static void f_attention_a_mask(qkv_ctx *c) {
    qkv_tensor *q = grad_ones(c, SHAPE(2, 3, 4)), *mask = qkv_ones(c, QKV_U8, SHAPE(3, 3)), *attn;
    arm(); qkv_attention(c, q, q, q, mask, 0.5, 0, &attn);
}
static void f_self_attention(qkv_ctx *c) {
    qkv_tensor *x = grad_ones(c, SHAPE(2, 3, 4)), *w = ones(c, SHAPE(4, 4));
    arm(); qkv_self_attention(c, x, w, w, w, NULL, QKV_SCALE_DEFAULT, 0, NULL);
}
static void f_self_attention_a(qkv_ctx *c) {
    qkv_tensor *x = grad_ones(c, SHAPE(2, 3, 4)), *w = ones(c, SHAPE(4, 4)), *attn;
    arm(); qkv_self_attention(c, x, w, w, w, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, &attn);
}

/* qkv_model_new makes its parameters with qkv_randn, qkv_full and qkv_param (which used to name themselves). */
static qkv_model_config tiny_model(qkv_dtype dt) {
    qkv_model_config cfg = qkv_model_default_config();
    cfg.vocab = 7;
    cfg.n_ctx = 4;
    cfg.d_model = 4;
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.d_mlp = 6;
    cfg.dtype = dt;
    return cfg;
}
static void f_model_new(qkv_ctx *c) {
    qkv_model_config cfg = tiny_model(QKV_F32);
    arm(); qkv_model_free(qkv_model_new(c, &cfg));
}
static void f_model_new_rms_sinusoidal(qkv_ctx *c) {
    qkv_model_config cfg = tiny_model(QKV_F64);
    cfg.norm = QKV_NORM_RMS;
    cfg.qk_norm = QKV_NORM_LAYER;
    cfg.positions = QKV_POS_SINUSOIDAL;
    arm(); qkv_model_free(qkv_model_new(c, &cfg));
}
/* qkv_backward over a graph of several operators: each node's backward allocates (scratch, the gradients of
 * step tensors, the persistent gradients of parameters) in its operator's name. */
static void f_backward_graph(qkv_ctx *c) {
    qkv_tensor *x = grad_ones(c, SHAPE(2, 3, 4));
    qkv_tensor *w = qkv_param(c, qkv_randn(c, QKV_F32, SHAPE(4, 4), 0, 0.5));
    qkv_tensor *b = qkv_param(c, qkv_full(c, QKV_F32, SHAPE(4), 0.1));
    qkv_tensor *g = qkv_param(c, qkv_ones(c, QKV_F32, SHAPE(4)));
    qkv_tensor *h = qkv_projection(c, x, w, b);                                   // h = x W + b
    qkv_tensor *n = qkv_layer_norm(c, h, g, NULL, 1e-5);                          // n = LN(h) g
    qkv_tensor *a = qkv_gelu(c, n, QKV_GELU_ERF);                                 // a = gelu(n)
    qkv_tensor *s = qkv_scale(c, qkv_matmul(c, a, a, QKV_TRANS_B), 0.5);          // s = a a^T / 2
    qkv_tensor *p = qkv_softmax(c, s, NULL, QKV_CAUSAL);                          // p = softmax(s)
    qkv_tensor *o = qkv_attention(c, a, n, h, NULL, QKV_SCALE_DEFAULT, 0, NULL);  // o = attn(a, n, h)
    qkv_tensor *y = qkv_add(c, qkv_matmul(c, p, o, 0), x);                        // y = p o + x
    qkv_tensor *loss = qkv_mean(c, qkv_mul(c, y, y));                             // loss = mean(y^2)
    cr_assert_not_null(loss, "%s", qkv_errmsg(c));
    arm(); qkv_backward(c, loss, NULL);
}
/* The same through a model: forward, cross-entropy, then qkv_backward of the loss. */
static void f_backward_model(qkv_ctx *c) {
    qkv_model_config cfg = tiny_model(QKV_F32);
    qkv_model *m = qkv_model_new(c, &cfg);
    qkv_tensor *ids = qkv_zeros(c, QKV_I32, SHAPE(2, 3));
    cr_assert_not_null(ids, "%s", qkv_errmsg(c));
    for (int i = 0; i < 6; i++) qkv_i32(ids)[i] = (int32_t)((i * 3 + 1) % 7);
    qkv_tensor *loss = qkv_model_loss(c, qkv_model_forward(c, m, ids, 0), ids);
    cr_assert_not_null(loss, "%s", qkv_errmsg(c));
    arm(); qkv_backward(c, loss, NULL);
}

static const msg_case faults[] = {
    {"qkv_model_new", f_model_new},
    {"qkv_model_new", f_model_new_rms_sinusoidal},
    {"qkv_backward", f_backward_graph},
    {"qkv_backward", f_backward_model},
    {"qkv_ones", f_ones},
    {"qkv_full", f_full},
    {"qkv_scalar", f_scalar},
    {"qkv_zeros", f_zeros},
    {"qkv_randn", f_randn},
    {"qkv_rand_uniform", f_rand_uniform},
    {"qkv_xavier_uniform", f_xavier},
    {"qkv_he_normal", f_he},
    {"qkv_copy", f_copy},
    {"qkv_to_dtype", f_to_dtype},
    {"qkv_keep", f_keep},
    {"qkv_param", f_param},
    {"qkv_matmul", f_matmul},
    {"qkv_projection", f_projection},
    {"qkv_split_heads", f_split_heads},
    {"qkv_attention", f_attention},
    {"qkv_attention", f_attention_a},
    {"qkv_attention", f_attention_a_mask},
    {"qkv_self_attention", f_self_attention},
    {"qkv_self_attention", f_self_attention_a},
};

/* ---- the walks --------------------------------------------------------------------------------------- */

static qkv_ctx *fresh(counting *cnt) {
    memset(cnt, 0, sizeof *cnt);
    armed = cnt;
    qkv_options o = qkv_default_options();
    o.allocator = counting_allocator(cnt);
    o.arena_chunk = 64; /* the arena grows a chunk at a time: most arena allocations are mallocs */
    qkv_ctx *c = qkv_ctx_new(&o);
    cr_assert_not_null(c);
    return c;
}

/* Does the message start with "fn: "? If not, it is logged with the case. */
static bool names(const char *fn, const char *msg, const char *what, int i, long k) {
    size_t n = strlen(fn);
    if (strncmp(msg, fn, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ') return true;
    cr_log_error("%s case %d (%s), allocation %ld: \"%s\"", what, i, fn, k, msg);
    return false;
}

Test(messages, a_bad_argument_is_reported_in_the_name_of_the_function_called) {
    int wrong = 0, n = (int)(sizeof bad_args / sizeof bad_args[0]);
    for (int i = 0; i < n; i++) {
        counting cnt;
        qkv_ctx *c = fresh(&cnt);
        bad_args[i].run(c);
        if (qkv_error(c) == QKV_OK) {
            cr_log_error("bad-argument case %d (%s) stored no error", i, bad_args[i].fn);
            wrong++;
        } else if (!names(bad_args[i].fn, qkv_errmsg(c), "bad-argument", i, 0)) {
            wrong++;
        }
        qkv_ctx_free(c);
    }
    cr_expect_eq(wrong, 0, "%d of %d bad-argument cases do not name the function called", wrong, n);
}

Test(messages, a_failed_allocation_is_reported_in_the_name_of_the_function_called) {
    int wrong = 0, n = (int)(sizeof faults / sizeof faults[0]);
    long walked = 0;
    for (int i = 0; i < n; i++) {
        bool done = false;
        for (long k = 1; k <= 2000 && !done; k++) {
            counting cnt;
            qkv_ctx *c = fresh(&cnt);
            fail_after = k;
            faults[i].run(c);
            if (cnt.failed == 0) { /* the call made fewer than k allocations: every one has been failed */
                cr_expect_eq(qkv_error(c), QKV_OK, "case %d (%s): %s", i, faults[i].fn, qkv_errmsg(c));
                cr_expect(k > 1, "case %d (%s) made no allocation to fail", i, faults[i].fn);
                done = true;
            } else if (qkv_error(c) != QKV_OK) {
                walked++;
                if (!names(faults[i].fn, qkv_errmsg(c), "fault", i, k)) wrong++;
            }
            qkv_ctx_free(c);
        }
        cr_expect(done, "case %d (%s): more than 2000 allocations", i, faults[i].fn);
    }
    cr_expect_eq(wrong, 0, "%d failed allocations (of %ld) reported in another function's name", wrong, walked);
    cr_expect(walked >= n, "only %ld failed allocations reported", walked);
}
