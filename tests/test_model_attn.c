/*
 * test_model_attn.c — a user's attention weights inside qkv_model (config.attn_weights): the softmax rebuilt
 * from primitives gives the built-in model's logits and gradients; a variant (softmax plus one, built from
 * primitives) passes the model's gradcheck; inspection shows the user's weights; checkpoints record the name,
 * qkv_model_load refuses to guess the function and qkv_model_restore checks it; a function that misbehaves
 * (wrong shape, NULL, weight on the future, an error inside) is refused with a message naming it.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "qkv.h"
#include "model_cases.h"
#include "test_ops.h"

/* s with the masked entries at -inf (a mask [n, n] broadcasts over the batch of scores). */
static qkv_tensor *masked(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask) {
    if (!mask) return s;
    qkv_tensor *ninf = qkv_full(ctx, s->dtype, 0, NULL, -INFINITY);
    return qkv_where(ctx, mask, s, ninf);
}

/* The softmax, from primitives. */
static qkv_tensor *softmax_again(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask, void *user) {
    if (user) ++*(int *)user;
    return qkv_softmax_dim(ctx, masked(ctx, s, mask), -1);
}

/* Softmax plus one, e^s_i / (1 + sum_j e^s_j) = softmax(s) sigmoid(logsumexp(s)), from primitives. */
static qkv_tensor *plus_one(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask, void *user) {
    (void)user;
    qkv_tensor *sm = masked(ctx, s, mask);
    qkv_tensor *lse = qkv_logsumexp_dim(ctx, sm, -1, true);
    return qkv_div(ctx, qkv_softmax_dim(ctx, sm, -1), qkv_add_scalar(ctx, qkv_exp(ctx, qkv_neg(ctx, lse)), 1.0));
}

/* A model whose attention is the softmax rebuilt by the user gives the built-in model's logits and every
 * parameter's gradient (1e-12 in f64), causal and not; the function runs once per layer. */
Test(model_attn, the_softmax_rebuilt_gives_the_built_in_model) {
    for (int causal = 0; causal < 2; causal++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        int calls = 0;
        qkv_model_config c = small_config(QKV_F64);
        qkv_model *builtin = qkv_model_new(ctx, &c);
        c.attn_weights = softmax_again, c.attn_weights_user = &calls, c.attn_weights_name = "softmax_again";
        qkv_model *user = qkv_model_new(ctx, &c);
        cr_assert(builtin && user, "%s", qkv_errmsg(ctx));
        qkv_tensor *ids = qkv_keep(ctx, make_ids(ctx, 2, 7, 11, causal));
        qkv_tensor *targets = qkv_keep(ctx, qkv_next_token_targets(ctx, ids));
        double logits[2][2 * 7 * 11];
        for (int k = 0; k < 2; k++) {
            qkv_model *m = k ? user : builtin;
            qkv_tensor *lg = qkv_model_forward(ctx, m, ids, causal ? QKV_CAUSAL : 0);
            cr_assert_not_null(lg, "%s", qkv_errmsg(ctx));
            memcpy(logits[k], qkv_f64(lg), sizeof logits[k]);
            cr_assert_eq(qkv_backward(ctx, qkv_model_loss(ctx, lg, targets), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
            qkv_step_end(ctx);
        }
        cr_expect_eq(calls, 2, "the function ran %d times for 2 layers", calls);
        for (int i = 0; i < 2 * 7 * 11; i++)
            cr_expect(fabs(logits[0][i] - logits[1][i]) < 1e-12, "causal %d logit %d: %.17g against %.17g", causal, i,
                      logits[0][i], logits[1][i]);
        for (int p = 0; p < qkv_model_param_count(builtin); p++) {
            const qkv_tensor *g0 = qkv_model_params(builtin)[p]->grad, *g1 = qkv_model_params(user)[p]->grad;
            cr_assert(g0 && g1, "parameter %s has no gradient", qkv_model_param_names(builtin)[p]);
            for (int64_t i = 0; i < g0->numel; i++)
                cr_expect(fabs(qkv_f64_const(g0)[i] - qkv_f64_const(g1)[i]) < 1e-12, "causal %d d%s[%lld]", causal,
                          qkv_model_param_names(builtin)[p], (long long)i);
        }
        qkv_ctx_free(ctx);
    }
}

typedef struct model_case {
    qkv_model *m;
    qkv_tensor *ids, *targets;
} model_case;

static qkv_tensor *model_loss_fn(qkv_ctx *ctx, qkv_tensor *const *in, int n, void *user) {
    (void)in, (void)n;
    model_case *mc = user;
    return qkv_model_loss(ctx, qkv_model_forward(ctx, mc->m, mc->ids, QKV_CAUSAL), mc->targets);
}

/* Every parameter's gradient of a model with softmax-plus-one attention (and with a soft-cap before it) matches
 * finite differences in f64; the inspected pattern is the user's weights, whose rows sum to less than 1. */
Test(model_attn, softmax_plus_one_passes_the_model_gradcheck_and_is_inspected) {
    for (int cap = 0; cap < 2; cap++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_model_config c = small_config(QKV_F64);
        c.vocab = 7, c.n_ctx = 5, c.d_model = 4, c.d_mlp = 6, c.norm_eps = 1e-3;
        c.attn_softcap = cap ? 1.5 : 0.0;
        c.attn_weights = plus_one, c.attn_weights_name = "softmax_plus_one";
        model_case mc = {qkv_model_new(ctx, &c), NULL, NULL};
        cr_assert_not_null(mc.m, "%s", qkv_errmsg(ctx));
        for (int i = 0; i < qkv_model_param_count(mc.m); i++) { // away from the symmetric init
            qkv_tensor *p = qkv_model_params(mc.m)[i];
            qkv_tensor *noise = qkv_randn(ctx, QKV_F64, p->ndim, p->shape, 0, 0.3);
            for (int64_t j = 0; j < p->numel; j++) qkv_f64(p)[j] += qkv_f64(noise)[j];
        }
        mc.ids = qkv_keep(ctx, make_ids(ctx, 2, 5, 7, 3));
        mc.targets = qkv_keep(ctx, qkv_next_token_targets(ctx, mc.ids));
        qkv_step_end(ctx);
        qkv_gradcheck_result r;
        qkv_status st = qkv_gradcheck(ctx, model_loss_fn, qkv_model_params(mc.m), qkv_model_param_count(mc.m), &mc,
                                      NULL, &r);
        cr_expect_eq(st, QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect(r.passed && r.checked == qkv_model_param_elements(mc.m), "cap %d: %s (%lld checked)", cap, r.message,
                  (long long)r.checked);
        qkv_step_end(ctx);

        qkv_model_set_inspect(mc.m, true);
        cr_assert_not_null(qkv_model_forward(ctx, mc.m, mc.ids, QKV_CAUSAL), "%s", qkv_errmsg(ctx));
        const qkv_tensor *a = qkv_model_inspect(ctx, mc.m, QKV_INSPECT_PATTERN, 0);
        cr_assert_not_null(a, "%s", qkv_errmsg(ctx));
        for (int64_t row = 0; row < a->numel / 5; row++) {
            double sum = 0;
            for (int j = 0; j < 5; j++) sum += qkv_f64_const(a)[row * 5 + j];
            cr_expect(sum > 0 && sum < 1, "row %lld sums to %.17g", (long long)row, sum);
        }
        qkv_ctx_free(ctx);
    }
}

static char *temp_path(const char *tag) {
    static char buf[2][256];
    static int k;
    char *p = buf[k++ % 2];
    snprintf(p, 256, "/tmp/qkv-test-model-attn-%d-%s.safetensors", (int)getpid(), tag);
    return p;
}

/* The checkpoint records the function's name; qkv_model_load refuses it naming the function and the way to
 * restore; qkv_model_restore into a model with the function gives the same logits, and into a model with
 * another function or the softmax is refused naming config.attn_weights. A softmax model's file records
 * "softmax", and a file without the key (older) loads as softmax. */
Test(model_attn, checkpoints_record_the_function_and_restore_checks_it) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F32);
    char name[32] = "softmax_plus_one";
    c.attn_weights = plus_one, c.attn_weights_name = name;
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    strcpy(name, "changed after"); // the model keeps its own copy
    cr_expect_str_eq(qkv_model_get_config(m)->attn_weights_name, "softmax_plus_one");
    qkv_tensor *ids = qkv_keep(ctx, make_ids(ctx, 1, 6, 11, 2));
    qkv_tensor *l0 = qkv_keep(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    char *path = temp_path("plus-one");
    cr_assert_eq(qkv_model_save(ctx, m, path, NULL, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));

    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.attn_weights"), "softmax_plus_one");
    qkv_model_config back;
    cr_assert_eq(qkv_model_config_from_checkpoint(ctx, st, &back), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(back.attn_weights == NULL && back.attn_weights_name && !strcmp(back.attn_weights_name, "softmax_plus_one"));

    cr_expect_null(qkv_model_load(ctx, path));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_model_load") && strstr(qkv_errmsg(ctx), "user function \"softmax_plus_one\"") &&
                  strstr(qkv_errmsg(ctx), "qkv_model_restore"),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);

    back.attn_weights = plus_one; // rebuilt with the function
    qkv_model *again = qkv_model_new(ctx, &back);
    cr_assert_not_null(again, "%s", qkv_errmsg(ctx));
    cr_assert_eq(qkv_model_restore(ctx, again, st, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_tensor *l1 = qkv_model_forward(ctx, again, ids, QKV_CAUSAL);
    cr_assert_not_null(l1, "%s", qkv_errmsg(ctx));
    cr_expect_eq(memcmp(l0->data, l1->data, (size_t)l0->numel * sizeof(float)), 0, "restored logits differ");

    qkv_model_config other = small_config(QKV_F32);
    qkv_model *softmax_model = qkv_model_new(ctx, &other);
    other.attn_weights = softmax_again, other.attn_weights_name = "softmax_again";
    qkv_model *renamed = qkv_model_new(ctx, &other);
    cr_expect_eq(qkv_model_restore(ctx, softmax_model, st, NULL), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "config.attn_weights is softmax_plus_one in the checkpoint and softmax in the model"),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_model_restore(ctx, renamed, st, NULL), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "softmax_plus_one in the checkpoint and softmax_again in the model"), "%s",
              qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    qkv_safetensors_free(ctx, st);

    // a softmax model's file says "softmax"; without the key (a file from before it) it loads as the softmax
    char *plain = temp_path("softmax");
    cr_assert_eq(qkv_model_save(ctx, softmax_model, plain, NULL, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    st = qkv_safetensors_load(ctx, plain);
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.attn_weights"), "softmax");
    qkv_safetensors_free(ctx, st);
    cr_expect_not_null(qkv_model_load(ctx, plain), "%s", qkv_errmsg(ctx));
    unlink(path), unlink(plain);
    qkv_ctx_free(ctx);
}

/* ---- misbehaving functions and configurations ------------------------------------------------------ */

static qkv_tensor *wrong_shape(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask, void *user) {
    (void)mask, (void)user;
    return qkv_sum_dim(ctx, s, -1, true);
}
static qkv_tensor *null_without_error(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask, void *user) {
    (void)ctx, (void)s, (void)mask, (void)user;
    return NULL;
}
static qkv_tensor *sees_the_future(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask, void *user) {
    (void)mask, (void)user;
    return qkv_softmax_dim(ctx, s, -1); // ignores the mask
}
static qkv_tensor *fails_inside(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask, void *user) {
    (void)mask, (void)user;
    return qkv_div(ctx, s, qkv_ones(ctx, s->dtype, 1, (int64_t[]){3}));
}
static qkv_tensor *sets_an_error(qkv_ctx *ctx, qkv_tensor *s, const qkv_tensor *mask, void *user) {
    (void)s, (void)mask, (void)user;
    qkv_set_error(ctx, QKV_ERR_ARG, "temperature %g is negative", -1.0);
    return NULL;
}

Test(model_attn, misbehaving_functions_are_refused_naming_them) {
    static const struct {
        qkv_attn_weights_fn fn;
        qkv_status status;
        const char *says;
    } cases[] = {
        {wrong_shape, QKV_ERR_SHAPE, "config.attn_weights \"bad\" (layer 0) returned f32 [2,6,1] for scores f32 [2,6,6]"},
        {null_without_error, QKV_ERR_ARG, "config.attn_weights \"bad\" (layer 0) returned NULL without setting an error"},
        {sees_the_future, QKV_ERR_NUMERIC, "to key 1 of query 0 (row 0), which the causal mask hides"},
        {fails_inside, QKV_ERR_SHAPE, "qkv_model_forward: config.attn_weights \"bad\" (layer 0): qkv_div: a is [2,6,6]"},
        {sets_an_error, QKV_ERR_ARG, "(layer 0): temperature -1 is negative"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_model_config c = small_config(QKV_F32);
        c.n_head = 2;
        c.attn_weights = cases[k].fn, c.attn_weights_name = "bad";
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        qkv_tensor *lg = qkv_model_forward(ctx, m, make_ids(ctx, 1, 6, 11, 0), QKV_CAUSAL);
        cr_expect_null(lg, "case %zu: logits despite the error", k);
        cr_expect_eq(qkv_error(ctx), cases[k].status, "case %zu: %s (%s)", k, qkv_status_name(qkv_error(ctx)),
                     qkv_errmsg(ctx));
        cr_expect(strstr(qkv_errmsg(ctx), cases[k].says), "case %zu: \"%s\" lacks \"%s\"", k, qkv_errmsg(ctx),
                  cases[k].says);
        qkv_ctx_free(ctx);
    }
    // the same function that ignores the mask is fine where nothing is masked
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F32);
    c.attn_weights = sees_the_future, c.attn_weights_name = "bidirectional";
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_expect_not_null(qkv_model_forward(ctx, m, make_ids(ctx, 1, 6, 11, 0), 0), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

static void no_name(qkv_model_config *c) { c->attn_weights = plus_one; }
static void no_function(qkv_model_config *c) { c->attn_weights_name = "orphan"; }
static void reserved(qkv_model_config *c) { c->attn_weights = plus_one, c->attn_weights_name = "softmax"; }
static void empty(qkv_model_config *c) { c->attn_weights = plus_one, c->attn_weights_name = ""; }
static void control(qkv_model_config *c) { c->attn_weights = plus_one, c->attn_weights_name = "two\nlines"; }
static void too_long(qkv_model_config *c) {
    static char name[80];
    memset(name, 'x', 79);
    c->attn_weights = plus_one, c->attn_weights_name = name;
}

Test(model_attn, the_configuration_is_checked) {
    static const struct {
        void (*apply)(qkv_model_config *);
        const char *says;
    } cases[] = {
        {no_name, "config.attn_weights is set but config.attn_weights_name is NULL"},
        {no_function, "config.attn_weights is NULL but config.attn_weights_name is set"},
        {reserved, "config.attn_weights_name \"softmax\" is not a name"},
        {empty, "config.attn_weights_name \"\" is not a name"},
        {control, "is not a name of 1 to 63 printable characters"},
        {too_long, "is not a name of 1 to 63 printable characters"},
    };
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        qkv_model_config c = small_config(QKV_F32);
        cases[k].apply(&c);
        cr_expect_null(qkv_model_new(ctx, &c), "case %zu accepted", k);
        cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG, "case %zu: %s", k, qkv_errmsg(ctx));
        cr_expect(strstr(qkv_errmsg(ctx), "qkv_model_new") && strstr(qkv_errmsg(ctx), cases[k].says),
                  "case %zu: \"%s\" lacks \"%s\"", k, qkv_errmsg(ctx), cases[k].says);
        qkv_clear_error(ctx);
    }
    qkv_ctx_free(ctx);
}
