/*
 * test_model_gated.c — the model-level attention changes that add weights: config.attn_gate and config.attn_diff.
 *
 * config.attn_gate (gated attention output, Qiu et al. 2025): a gate of exactly 1/2 is the ungated model with
 * W_O halved (bit for bit), the gate's weights pass an f64 gradcheck, the gate works with every attention variant
 * and trains, the hook point blocks.L.attn.hook_gate reads, replaces and ablates (per head) the gate, the
 * key/value cache of sampling gives the rerun's tokens, checkpoints record the gate (older files load as none),
 * and a bad value is refused naming the field. (The values themselves are checked against PyTorch by
 * test_model_twin and test_hooks, the gate_* twin cases.)
 *
 * config.attn_diff (differential attention, Ye et al. 2024): the parameters and their init, the first block's z
 * against the formula, an f64 gradcheck of lambda's vectors and the norm's gain, training, the cache, hook_pattern
 * replacement, checkpoints and older files, and the refused settings (the diff_* twin cases check the values).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model_cases.h"
#include "qkv.h"

static const qkv_attn_gate_kind GATES[] = {QKV_GATE_HEAD, QKV_GATE_ELEMENT};

static qkv_model_config gate_config(qkv_attn_gate_kind g, qkv_dtype dt) {
    qkv_model_config c = small_config(dt);
    c.attn_gate = g;
    return c;
}

/* Copy every parameter of src that dst has (by name) into dst. */
static void copy_params(qkv_model *dst, const qkv_model *src) {
    for (int i = 0; i < qkv_model_param_count(dst); i++) {
        const char *name = qkv_model_param_names(dst)[i];
        qkv_tensor *d = qkv_model_params(dst)[i], *s = qkv_model_param(src, name);
        cr_assert(s && s->numel == d->numel && s->dtype == d->dtype, "%s", name);
        memcpy(d->data, s->data, (size_t)d->numel * qkv_dtype_size(d->dtype));
    }
}

/* Parameters and shapes: W_G [d_model, n_head] (head) or [d_model, d_model] (element), b_G only with attn_bias,
 * none without a gate; W_G drawn with init_std (its sample std near 0.02 over 8 x 8 draws). */
Test(model_gated, the_gate_weights_have_the_documented_shapes) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *plain = qkv_model_new(ctx, &c);
    cr_assert_not_null(plain, "%s", qkv_errmsg(ctx));
    cr_expect_null(qkv_model_param(plain, "blocks.0.attn.W_G"));
    for (int k = 0; k < 2; k++) {
        c = gate_config(GATES[k], QKV_F64);
        c.attn_bias = k == 1;
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        cr_expect_eq(qkv_model_param_count(m), qkv_model_param_count(plain) + 2 * (k == 1 ? 6 : 1));
        for (int l = 0; l < 2; l++) {
            char name[64];
            snprintf(name, sizeof name, "blocks.%d.attn.W_G", l);
            qkv_tensor *w = qkv_model_param(m, name);
            cr_assert_not_null(w, "%s", name);
            cr_expect(w->ndim == 2 && w->shape[0] == 8 && w->shape[1] == (k == 0 ? 2 : 8), "%s", name);
            double ss = 0;
            for (int64_t i = 0; i < w->numel; i++) ss += qkv_f64(w)[i] * qkv_f64(w)[i];
            double std = sqrt(ss / (double)w->numel);
            cr_expect(std > 0.01 && std < 0.035, "%s: std %g, init_std 0.02", name, std);
            snprintf(name, sizeof name, "blocks.%d.attn.b_G", l);
            qkv_tensor *b = qkv_model_param(m, name);
            if (k == 1) cr_expect(b && b->numel == 8 && qkv_get_flat(ctx, b, 3) == 0.0, "%s", name);
            else cr_expect_null(b, "%s without attn_bias", name);
        }
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* With W_G = 0 (and no bias) every gate is sigmoid(0) = 1/2: the model equals the ungated one with W_O halved,
 * bit for bit (both are the same products scaled by a power of two), for both kinds and a variant, and
 * hook_z is the gated z: half the ungated model's. */
Test(model_gated, a_gate_of_one_half_is_the_ungated_model_with_W_O_halved) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 2; k++)
        for (int variant = 0; variant < 2; variant++) {
            qkv_model_config c = gate_config(GATES[k], QKV_F64);
            c.attn_variant = variant ? QKV_ATTN_SOFTPICK : QKV_ATTN_SOFTMAX;
            qkv_model *gated = qkv_model_new(ctx, &c);
            c.attn_gate = QKV_GATE_NONE;
            qkv_model *plain = qkv_model_new(ctx, &c);
            cr_assert(gated && plain, "%s", qkv_errmsg(ctx));
            copy_params(plain, gated);
            for (int l = 0; l < 2; l++) {
                char name[64];
                snprintf(name, sizeof name, "blocks.%d.attn.W_G", l);
                qkv_tensor *w = qkv_model_param(gated, name);
                memset(w->data, 0, (size_t)w->numel * sizeof(double));
                snprintf(name, sizeof name, "blocks.%d.attn.W_O", l);
                qkv_tensor *o = qkv_model_param(plain, name);
                for (int64_t i = 0; i < o->numel; i++) qkv_f64(o)[i] *= 0.5;
            }
            qkv_tensor *ids = make_ids(ctx, 2, 8, 11, 4);
            qkv_tensor *a = qkv_model_run_with_cache(ctx, gated, ids, QKV_CAUSAL, "blocks.0.attn.hook_*");
            qkv_tensor *b = qkv_model_run_with_cache(ctx, plain, ids, QKV_CAUSAL, "blocks.0.attn.hook_z");
            cr_assert(a && b, "%s", qkv_errmsg(ctx));
            cr_expect_eq(memcmp(a->data, b->data, (size_t)a->numel * sizeof(double)), 0,
                         "%s gate, %s: the logits differ from the halved W_O's", qkv_attn_gate_kind_name(GATES[k]),
                         variant ? "softpick" : "softmax");
            qkv_tensor *g = qkv_model_cached(ctx, gated, "blocks.0.attn.hook_gate");
            qkv_tensor *zg = qkv_model_cached(ctx, gated, "blocks.0.attn.hook_z");
            qkv_tensor *zp = qkv_model_cached(ctx, plain, "blocks.0.attn.hook_z");
            cr_assert(g && zg && zp, "%s", qkv_errmsg(ctx));
            // the gate's shape: heads [B*H, n, 1] (head) or [B*H, n, d_head] (element)
            cr_expect(g->ndim == 3 && g->shape[0] == 4 && g->shape[1] == 8 && g->shape[2] == (k == 0 ? 1 : 4),
                      "hook_gate's shape");
            for (int64_t i = 0; i < g->numel; i++) cr_assert_eq(qkv_f64(g)[i], 0.5);
            for (int64_t i = 0; i < zg->numel; i++) cr_assert_eq(qkv_f64(zg)[i], 0.5 * qkv_f64(zp)[i]);
            qkv_step_end(ctx);
            qkv_model_free(gated);
            qkv_model_free(plain);
        }
    qkv_ctx_free(ctx);
}

/* A hook that replaces the gate acts: a gate of ones gives the ungated model's logits (W_G then does nothing),
 * and the replacement's shape is checked. */
static qkv_tensor *ones_gate(qkv_ctx *ctx, const char *name, qkv_tensor *value, void *user) {
    (void)name, (void)user;
    return qkv_full(ctx, value->dtype, value->ndim, value->shape, 1.0);
}

Test(model_gated, replacing_hook_gate_by_ones_gives_the_ungated_model) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 2; k++) {
        qkv_model_config c = gate_config(GATES[k], QKV_F64);
        qkv_model *gated = qkv_model_new(ctx, &c);
        c.attn_gate = QKV_GATE_NONE;
        qkv_model *plain = qkv_model_new(ctx, &c);
        cr_assert(gated && plain, "%s", qkv_errmsg(ctx));
        copy_params(plain, gated);
        qkv_tensor *ids = make_ids(ctx, 2, 7, 11, 2);
        qkv_tensor *before = qkv_model_forward(ctx, gated, ids, QKV_CAUSAL);
        for (int l = 0; l < 2; l++) {
            char name[64];
            snprintf(name, sizeof name, "blocks.%d.attn.hook_gate", l);
            cr_assert_eq(qkv_model_add_hook(ctx, gated, name, ones_gate, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        }
        qkv_tensor *a = qkv_model_forward(ctx, gated, ids, QKV_CAUSAL), *b = qkv_model_forward(ctx, plain, ids, QKV_CAUSAL);
        cr_assert(before && a && b, "%s", qkv_errmsg(ctx));
        cr_expect_eq(memcmp(a->data, b->data, (size_t)a->numel * sizeof(double)), 0,
                     "%s: a gate of ones differs from no gate", qkv_attn_gate_kind_name(GATES[k]));
        double moved = 0;
        for (int64_t i = 0; i < a->numel; i++) moved = fmax(moved, fabs(qkv_f64(a)[i] - qkv_f64(before)[i]));
        cr_expect_gt(moved, 1e-3, "the trained gate must matter (it halves z at init)");
        qkv_step_end(ctx);
        qkv_model_free(gated);
        qkv_model_free(plain);
    }
    qkv_ctx_free(ctx);
}

/* hook_gate is a per-head point for patching and ablation: zeroing head 1's gate at position 3 is zeroing head 1's
 * z there (bit for bit), for both kinds. */
Test(model_gated, ablating_a_heads_gate_is_ablating_its_output) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 2; k++) {
        qkv_model_config c = gate_config(GATES[k], QKV_F64);
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        qkv_tensor *ids = make_ids(ctx, 2, 7, 11, 6);
        qkv_tensor *clean = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
        cr_assert_eq(qkv_model_ablate(ctx, m, "blocks.0.attn.hook_gate", 3, 1, QKV_ABLATE_ZERO, NULL), QKV_OK, "%s",
                     qkv_errmsg(ctx));
        qkv_tensor *a = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
        qkv_model_clear_hooks(m);
        cr_assert_eq(qkv_model_ablate(ctx, m, "blocks.0.attn.hook_z", 3, 1, QKV_ABLATE_ZERO, NULL), QKV_OK, "%s",
                     qkv_errmsg(ctx));
        qkv_tensor *b = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
        cr_assert(clean && a && b, "%s", qkv_errmsg(ctx));
        cr_expect_eq(memcmp(a->data, b->data, (size_t)a->numel * sizeof(double)), 0, "%s: the two ablations differ",
                     qkv_attn_gate_kind_name(GATES[k]));
        cr_expect_neq(memcmp(a->data, clean->data, (size_t)a->numel * sizeof(double)), 0, "the ablation did nothing");
        qkv_step_end(ctx);
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* The loss's gradient reaches W_G (and b_G) correctly: f64 gradcheck, head gate with a sink variant and the
 * biases, element gate with grouped-query attention and rope. W_G made larger than its init so the gates differ. */
typedef struct loss_case {
    qkv_model *m;
    qkv_tensor *ids;
} loss_case;

static qkv_tensor *model_loss(qkv_ctx *ctx, qkv_tensor *const *inputs, int n_inputs, void *user) {
    (void)inputs, (void)n_inputs; // the inputs are the model's own parameter tensors
    loss_case *lc = user;
    return qkv_model_loss(ctx, qkv_model_forward(ctx, lc->m, lc->ids, QKV_CAUSAL), qkv_next_token_targets(ctx, lc->ids));
}

Test(model_gated, the_gate_weights_pass_gradcheck) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 2; k++) {
        qkv_model_config c = gate_config(GATES[k], QKV_F64);
        if (k == 0) c.attn_variant = QKV_ATTN_SINK, c.attn_bias = true;
        else c.n_kv_head = 1, c.positions = QKV_POS_ROPE;
        c.init_std = 0.5;
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        qkv_tensor *inputs[3] = {qkv_model_param(m, "blocks.0.attn.W_G"), qkv_model_param(m, "blocks.1.attn.W_G"),
                                 qkv_model_param(m, "blocks.1.attn.b_G")};
        int n = k == 0 ? 3 : 2;
        if (k == 0)
            for (int i = 0; i < 2; i++) qkv_set_flat(ctx, inputs[2], i, 0.3 - 0.9 * i);
        loss_case lc = {m, qkv_keep(ctx, make_ids(ctx, 2, 7, 11, 3))};
        qkv_gradcheck_result r;
        qkv_gradcheck_options o = {0};
        o.atol = 1e-8, o.rtol = 1e-5;
        cr_assert_eq(qkv_gradcheck(ctx, model_loss, inputs, n, &lc, &o, &r), QKV_OK, "%s", qkv_errmsg(ctx));
        int64_t want = k == 0 ? 16 + 16 + 2 : 64 + 64;
        cr_expect(r.passed && r.checked == want, "%s: %lld of %lld outside (want %lld checked)",
                  qkv_attn_gate_kind_name(GATES[k]), (long long)r.failed, (long long)r.checked, (long long)want);
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* Every gate with every attention variant trains: 60 AdamW steps on one repeated batch lower the loss by a
 * third (f32). */
Test(model_gated, every_gate_with_every_variant_trains) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 2; k++)
        for (int v = 0; v < QKV_ATTN_VARIANT_COUNT; v++) {
            qkv_model_config c = gate_config(GATES[k], QKV_F32);
            c.attn_variant = (qkv_attn_variant)v;
            qkv_model *m = qkv_model_new(ctx, &c);
            cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
            qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
            oo.lr = 1e-2;
            qkv_optimizer *opt = qkv_optim_new(ctx, &oo, qkv_model_params(m), qkv_model_param_count(m));
            cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
            double first = 0, last = 0;
            for (int step = 0; step < 60; step++) {
                qkv_tensor *ids = make_ids(ctx, 4, 8, 11, 0);
                qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL),
                                                  qkv_next_token_targets(ctx, ids));
                cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
                last = qkv_get_flat(ctx, loss, 0);
                if (step == 0) first = last;
                cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
                qkv_optim_step(opt);
                qkv_optim_zero_grad(opt);
                qkv_step_end(ctx);
            }
            cr_expect_lt(last, first * 2 / 3, "%s gate, %s: loss %g -> %g", qkv_attn_gate_kind_name(GATES[k]),
                         qkv_attn_variant_name((qkv_attn_variant)v), first, last);
            qkv_optim_free(opt);
            qkv_model_free(m);
        }
    qkv_ctx_free(ctx);
}

/* Sampling with the key/value cache gives the tokens of rerunning the window: the gate of a cached step reads
 * the new token's h only, as the rerun's last row does. */
Test(model_gated, the_cache_gives_the_reruns_tokens) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 2; k++) {
        qkv_model_config c = gate_config(GATES[k], QKV_F64);
        c.n_ctx = 16;
        c.attn_variant = k ? QKV_ATTN_SSMAX : QKV_ATTN_SOFTMAX;
        c.init_std = c.init_embed_std = 1.0; // sharp gates, attention and logits: a wrong gate changes the draws
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        const int32_t prompt[3] = {1, 4, 2};
        int32_t out[2][10];
        qkv_sample_options draw = {1.0, 0}; // drawn at temperature 1 from the same RNG stream both ways
        for (int way = 0; way < 2; way++) {
            qkv_model_set_sample_cache(m, way == 0);
            qkv_seed(ctx, 99);
            cr_assert_eq(qkv_model_sample(ctx, m, prompt, 3, 10, &draw, out[way]), QKV_OK, "%s", qkv_errmsg(ctx));
        }
        cr_expect_eq(memcmp(out[0], out[1], sizeof out[0]), 0, "%s: cached and rerun samples differ",
                     qkv_attn_gate_kind_name(GATES[k]));
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* The checkpoint records the gate (qkv.model.attn_gate) and holds W_G; loading gives the same logits; a model
 * with the other gate refuses to restore it naming config.attn_gate; a file without the key (older) has none. */
Test(model_gated, checkpoints_record_the_gate) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = gate_config(QKV_GATE_ELEMENT, QKV_F32), other = gate_config(QKV_GATE_HEAD, QKV_F32),
                     plain = small_config(QKV_F32);
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    char path[256];
    snprintf(path, sizeof path, "/tmp/qkv-test-model-gated-%d.safetensors", (int)getpid());
    qkv_model *old = checkpoint_round_trip(ctx, m, path, "qkv.model.attn_gate", "element", "blocks.1.attn.W_G", &other,
                                           "config.attn_gate", &plain);
    cr_expect_eq(qkv_model_get_config(old)->attn_gate, QKV_GATE_NONE);
    qkv_ctx_free(ctx);
}

/* A value outside the enum is refused naming the field; the names are the documented ones. */
Test(model_gated, a_bad_gate_is_refused_naming_the_field) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = gate_config((qkv_attn_gate_kind)7, QKV_F32);
    cr_expect_null(qkv_model_new(ctx, &c));
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_model_new: config.attn_gate is 7: not a qkv_attn_gate_kind (none, head, "
                                      "element)"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_str_eq(qkv_attn_gate_kind_name(QKV_GATE_NONE), "none");
    cr_expect_str_eq(qkv_attn_gate_kind_name(QKV_GATE_HEAD), "head");
    cr_expect_str_eq(qkv_attn_gate_kind_name(QKV_GATE_ELEMENT), "element");
    cr_expect_null(qkv_attn_gate_kind_name(QKV_GATE_KIND_COUNT));
    qkv_ctx_free(ctx);
}

/* ---- differential attention (config.attn_diff) ------------------------------------------------------------- */

static qkv_model_config diff_config(qkv_dtype dt) {
    qkv_model_config c = small_config(dt);
    c.attn_diff = true;
    return c;
}

/* Parameters: lambda_q1, lambda_k1, lambda_q2, lambda_k2 [d_head / 2] drawn N(0, 0.1^2), sub_ln.w [d_head] ones. */
Test(model_diff, the_parameters_have_the_documented_shapes_and_init) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = diff_config(QKV_F64);
    c.d_model = 32, c.n_head = 2; // d_head 16: 8 draws per vector
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    const char *vecs[4] = {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"};
    double ss = 0;
    for (int l = 0; l < 2; l++) {
        char name[64];
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "blocks.%d.attn.%s", l, vecs[i]);
            qkv_tensor *p = qkv_model_param(m, name);
            cr_assert(p && p->ndim == 1 && p->shape[0] == 8, "%s", name);
            for (int64_t j = 0; j < 8; j++) ss += qkv_f64(p)[j] * qkv_f64(p)[j];
        }
        snprintf(name, sizeof name, "blocks.%d.attn.sub_ln.w", l);
        qkv_tensor *w = qkv_model_param(m, name);
        cr_assert(w && w->ndim == 1 && w->shape[0] == 16, "%s", name);
        cr_expect_eq(qkv_get_flat(ctx, w, 5), 1.0);
    }
    double std = sqrt(ss / 64);
    cr_expect(std > 0.07 && std < 0.13, "the lambda vectors' std is %g, drawn with 0.1", std);
    qkv_ctx_free(ctx);
}

/* With lambda's vectors 0 (lambda = lambda_init), the first block's z equals the formula computed here from the
 * cached hook_rot_q/k (rope per half), hook_v: rms_norm((A1 - lambda_init A2) v) (1 - lambda_init), scale
 * 1/sqrt(d_head / 2); hook_pattern is A1 - lambda A2. */
Test(model_diff, the_first_blocks_z_equals_the_formula) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = diff_config(QKV_F64);
    c.positions = QKV_POS_ROPE, c.init_std = 0.5;
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    const char *vecs[4] = {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"};
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof name, "blocks.0.attn.%s", vecs[i]);
        qkv_tensor *p = qkv_model_param(m, name);
        memset(p->data, 0, (size_t)p->numel * sizeof(double));
    }
    qkv_tensor *ids = make_ids(ctx, 1, 6, 11, 2);
    cr_assert_not_null(qkv_model_run_with_cache(ctx, m, ids, QKV_CAUSAL, "blocks.0.attn.*"), "%s", qkv_errmsg(ctx));
    qkv_tensor *q = qkv_model_cached(ctx, m, "blocks.0.attn.hook_rot_q"), *k = qkv_model_cached(ctx, m, "blocks.0.attn.hook_rot_k");
    qkv_tensor *v = qkv_model_cached(ctx, m, "blocks.0.attn.hook_v"), *z = qkv_model_cached(ctx, m, "blocks.0.attn.hook_z");
    qkv_tensor *pat = qkv_model_cached(ctx, m, "blocks.0.attn.hook_pattern");
    cr_assert(q && k && v && z && pat, "%s", qkv_errmsg(ctx));
    const int64_t H = 2, n = 6, dh = 4, half = 2;
    const double lambda_init = 0.2, scale = 1 / sqrt(2.0), eps = 1e-5; // 0.8 - 0.6 exp(0)
    double worst = 0, worst_a = 0;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < n; i++) {
            double a[2][6] = {{0}};
            for (int part = 0; part < 2; part++) { // A_part[i, j] = softmax_j(scale q_part . k_part), j <= i
                double s[6], mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    s[j] = 0;
                    for (int64_t e = 0; e < half; e++)
                        s[j] += qkv_f64(q)[(h * n + i) * dh + part * half + e] * qkv_f64(k)[(h * n + j) * dh + part * half + e];
                    s[j] *= scale, mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j <= i; j++) sum += a[part][j] = exp(s[j] - mx);
                for (int64_t j = 0; j <= i; j++) a[part][j] /= sum;
            }
            double out[4] = {0}, ms = 0;
            for (int64_t j = 0; j < n; j++) {
                double w = a[0][j] - lambda_init * a[1][j];
                worst_a = fmax(worst_a, fabs(w - qkv_f64(pat)[(h * n + i) * n + j]));
                for (int64_t e = 0; e < dh; e++) out[e] += w * qkv_f64(v)[(h * n + j) * dh + e];
            }
            for (int64_t e = 0; e < dh; e++) ms += out[e] * out[e] / (double)dh;
            for (int64_t e = 0; e < dh; e++) {
                double want = out[e] / sqrt(ms + eps) * (1 - lambda_init); // sub_ln.w is 1
                worst = fmax(worst, fabs(want - qkv_f64(z)[(h * n + i) * dh + e]));
            }
        }
    cr_expect_lt(worst, 1e-12, "z differs from the formula by %g", worst);
    cr_expect_lt(worst_a, 1e-12, "hook_pattern differs from A1 - lambda A2 by %g", worst_a);
    qkv_ctx_free(ctx);
}

/* The loss's gradient reaches lambda's vectors and the per-head norm's gain: f64 gradcheck, with rope, grouped-query
 * attention and a head gate. */
Test(model_diff, lambda_and_the_norm_gain_pass_gradcheck) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = diff_config(QKV_F64);
    c.positions = QKV_POS_ROPE, c.n_kv_head = 1, c.attn_gate = QKV_GATE_HEAD, c.init_std = 0.4;
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    qkv_tensor *inputs[4] = {qkv_model_param(m, "blocks.0.attn.lambda_q1"), qkv_model_param(m, "blocks.1.attn.lambda_k2"),
                             qkv_model_param(m, "blocks.0.attn.sub_ln.w"), qkv_model_param(m, "blocks.1.attn.lambda_q2")};
    for (int i = 0; i < 4; i++) cr_assert_not_null(inputs[i]);
    for (int64_t j = 0; j < 4; j++) qkv_set_flat(ctx, inputs[2], j, 1.0 + 0.3 * (double)j - 0.5 * (double)(j == 2));
    loss_case lc = {m, qkv_keep(ctx, make_ids(ctx, 2, 7, 11, 5))};
    qkv_gradcheck_result r;
    qkv_gradcheck_options o = {0};
    o.atol = 1e-8, o.rtol = 1e-5;
    cr_assert_eq(qkv_gradcheck(ctx, model_loss, inputs, 4, &lc, &o, &r), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(r.passed && r.checked == 2 + 2 + 4 + 2, "%lld of %lld outside", (long long)r.failed, (long long)r.checked);
    qkv_ctx_free(ctx);
}

/* It trains (60 AdamW steps on one batch lower the loss by a third, f32), alone and with rope and a gate. */
Test(model_diff, it_trains) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 2; k++) {
        qkv_model_config c = diff_config(QKV_F32);
        if (k) c.positions = QKV_POS_ROPE, c.attn_gate = QKV_GATE_ELEMENT;
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
        oo.lr = 1e-2;
        qkv_optimizer *opt = qkv_optim_new(ctx, &oo, qkv_model_params(m), qkv_model_param_count(m));
        double first = 0, last = 0;
        for (int step = 0; step < 60; step++) {
            qkv_tensor *ids = make_ids(ctx, 4, 8, 11, 0);
            qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), qkv_next_token_targets(ctx, ids));
            cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
            last = qkv_get_flat(ctx, loss, 0);
            if (step == 0) first = last;
            cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
            qkv_optim_step(opt);
            qkv_optim_zero_grad(opt);
            qkv_step_end(ctx);
        }
        cr_expect_lt(last, first * 2 / 3, "case %d: loss %g -> %g", k, first, last);
        qkv_optim_free(opt);
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* Sampling with the key/value cache gives the rerun's tokens (the cache holds k with each half rotated). */
Test(model_diff, the_cache_gives_the_reruns_tokens) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < 2; k++) {
        qkv_model_config c = diff_config(QKV_F64);
        c.n_ctx = 16;
        if (k) c.positions = QKV_POS_ROPE, c.n_kv_head = 1;
        c.init_std = c.init_embed_std = 1.0;
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        const int32_t prompt[3] = {1, 4, 2};
        int32_t out[2][10];
        qkv_sample_options draw = {1.0, 0};
        for (int way = 0; way < 2; way++) {
            qkv_model_set_sample_cache(m, way == 0);
            qkv_seed(ctx, 99);
            cr_assert_eq(qkv_model_sample(ctx, m, prompt, 3, 10, &draw, out[way]), QKV_OK, "%s", qkv_errmsg(ctx));
        }
        cr_expect_eq(memcmp(out[0], out[1], sizeof out[0]), 0, "case %d: cached and rerun samples differ", k);
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* A hook that replaces hook_pattern (by an equal tensor made by an operator) takes the z = A' v path: the same
 * logits to rounding; the model has no hook_attn_scores and refuses to inspect SCORES. */
static qkv_tensor *same_pattern(qkv_ctx *ctx, const char *name, qkv_tensor *value, void *user) {
    (void)name, (void)user;
    return qkv_scale(ctx, value, 1.0);
}

Test(model_diff, hook_pattern_replaces_and_there_are_no_scores) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = diff_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    qkv_tensor *ids = make_ids(ctx, 2, 7, 11, 1);
    qkv_tensor *a = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
    cr_assert_eq(qkv_model_add_hook(ctx, m, "blocks.1.attn.hook_pattern", same_pattern, NULL), QKV_OK, "%s",
                 qkv_errmsg(ctx));
    qkv_tensor *b = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
    cr_assert(a && b, "%s", qkv_errmsg(ctx));
    double worst = 0;
    for (int64_t i = 0; i < a->numel; i++) worst = fmax(worst, fabs(qkv_f64(a)[i] - qkv_f64(b)[i]));
    cr_expect_lt(worst, 1e-12, "the replaced pattern's logits differ by %g", worst);
    qkv_model_clear_hooks(m);
    cr_expect_eq(qkv_model_hook_find(ctx, m, "blocks.0.attn.hook_attn_scores"), -1);
    qkv_clear_error(ctx);
    qkv_model_set_inspect(m, true);
    cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL), "%s", qkv_errmsg(ctx));
    cr_expect_not_null(qkv_model_inspect(ctx, m, QKV_INSPECT_PATTERN, 0), "%s", qkv_errmsg(ctx));
    cr_expect_null(qkv_model_inspect(ctx, m, QKV_INSPECT_SCORES, 0));
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_model_inspect: QKV_INSPECT_SCORES of a model with config.attn_diff"), "%s",
              qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* The checkpoint records qkv.model.attn_diff and holds lambda's vectors; loading gives the same logits; a file
 * without the key (older) is not differential. */
Test(model_diff, checkpoints_record_it) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = diff_config(QKV_F32);
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    char path[256];
    snprintf(path, sizeof path, "/tmp/qkv-test-model-diff-%d.safetensors", (int)getpid());
    cr_assert_eq(qkv_model_save(ctx, m, path, NULL, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.attn_diff"), "true");
    cr_expect_not_null(qkv_safetensors_get(st, "blocks.1.attn.lambda_k2"));
    cr_expect_not_null(qkv_safetensors_get(st, "blocks.0.attn.sub_ln.w"));
    qkv_safetensors_free(ctx, st);
    qkv_model *back = qkv_model_load(ctx, path);
    cr_assert_not_null(back, "%s", qkv_errmsg(ctx));
    cr_expect(qkv_model_get_config(back)->attn_diff);
    qkv_tensor *ids = make_ids(ctx, 1, 6, 11, 2);
    qkv_tensor *a = qkv_model_forward(ctx, m, ids, QKV_CAUSAL), *b = qkv_model_forward(ctx, back, ids, QKV_CAUSAL);
    cr_assert(a && b, "%s", qkv_errmsg(ctx));
    cr_expect_eq(memcmp(a->data, b->data, (size_t)a->numel * sizeof(float)), 0, "the loaded model's logits differ");
    qkv_model_config plain = small_config(QKV_F32);
    qkv_model *soft = qkv_model_new(ctx, &plain);
    cr_assert_eq(qkv_model_save(ctx, soft, path, NULL, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    st = qkv_safetensors_load(ctx, path);
    save_without_keys(ctx, st, path, "qkv.model.attn_diff");
    qkv_safetensors_free(ctx, st);
    qkv_model *old = qkv_model_load(ctx, path);
    cr_assert_not_null(old, "%s", qkv_errmsg(ctx));
    cr_expect(!qkv_model_get_config(old)->attn_diff);
    unlink(path);
    qkv_ctx_free(ctx);
}

/* Refused: with another variant, a soft-cap or a user's weights; an odd d_head; rope with d_head not a multiple of 4. */
static qkv_tensor *any_weights(qkv_ctx *ctx, qkv_tensor *scores, const qkv_tensor *mask, void *user) {
    (void)mask, (void)user;
    return qkv_softmax(ctx, scores, NULL, QKV_CAUSAL);
}

Test(model_diff, refused_settings_name_the_fields) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *const messages[] = {
        "qkv_model_new: config.attn_diff with config.attn_variant other than softmax: differential attention",
        "qkv_model_new: config.attn_diff with config.attn_softcap > 0",
        "qkv_model_new: config.attn_diff with config.attn_weights",
        "qkv_model_new: config.attn_diff with d_head = 9 / 3 = 3: differential attention splits",
        ("qkv_model_new: config.attn_diff with d_head = 12 / 2 = 6: differential attention splits each head's q and k "
         "in two halves, so d_head must be even, and a multiple of 4 with rope"),
    };
    for (int i = 0; i < 5; i++) {
        qkv_model_config c = diff_config(QKV_F32);
        if (i == 0) c.attn_variant = QKV_ATTN_SOFTPICK;
        if (i == 1) c.attn_softcap = 3;
        if (i == 2) c.attn_weights = any_weights, c.attn_weights_name = "mine";
        if (i == 3) c.d_model = 9, c.n_head = 3;
        if (i == 4) c.d_model = 12, c.positions = QKV_POS_ROPE;
        cr_expect_null(qkv_model_new(ctx, &c), "case %d", i);
        cr_expect(strstr(qkv_errmsg(ctx), messages[i]), "case %d: %s", i, qkv_errmsg(ctx));
        qkv_clear_error(ctx);
    }
    qkv_model_config ok = diff_config(QKV_F32); // d_head 6 without rope is allowed
    ok.d_model = 12;
    qkv_model *m = qkv_model_new(ctx, &ok);
    cr_expect_not_null(m, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}
