/*
 * test_model_variants.c — config.attn_variant in the model (qkv/attention.h's variants): each variant's model
 * equals the same model computed with the composed attention of its formula, its per-head parameters get the
 * right gradient (f64 gradcheck), every variant trains, the key/value cache of sampling gives the rerun's
 * tokens, the checkpoint records the variant and its parameters, and the combinations the model refuses are
 * refused naming the fields.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model_cases.h"
#include "qkv.h"

static const qkv_attn_variant VARIANTS[] = {QKV_ATTN_SOFTMAX1, QKV_ATTN_SINK, QKV_ATTN_SIGMOID, QKV_ATTN_SSMAX,
                                            QKV_ATTN_SOFTPICK};
#define N_VARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

static qkv_model_config variant_config(qkv_attn_variant v, qkv_dtype dt) {
    qkv_model_config c = small_config(dt);
    c.attn_variant = v;
    return c;
}

/* A user's attention weights computing the variant's formula from the scores with qkv operators (the model's
 * composed path): the model with it must give the fused variant's logits. The per-head parameter comes from the
 * fused model's tensors (layer by the call count). */
typedef struct oracle {
    qkv_attn_variant variant;
    qkv_model *fused; /* whose parameters the oracle reads */
    int64_t n_head, n_ctx;
    int calls;
    double ssmax_cap; /* SSMax's soft-cap, applied to c_h log(n_i) x here (the model caps x for the others) */
} oracle;

static qkv_tensor *variant_weights(qkv_ctx *ctx, qkv_tensor *scores, const qkv_tensor *mask, void *user) {
    oracle *o = user;
    int64_t BH = scores->shape[0], n = scores->shape[1], H = o->n_head, layer = o->calls++ % 2;
    qkv_dtype dt = scores->dtype;
    qkv_tensor *keep = qkv_empty(ctx, QKV_U8, 3, (int64_t[]){1, n, n}); // causal mask as u8 [1, n, n]
    for (int64_t i = 0; i < n * n; i++) qkv_u8(keep)[i] = mask ? qkv_u8(mask)[i] : 1;
    qkv_tensor *zeros = qkv_zeros(ctx, dt, 3, (int64_t[]){BH, n, n});
    qkv_tensor *ninf = qkv_full(ctx, dt, 3, (int64_t[]){BH, n, n}, -INFINITY);
    const qkv_tensor *keep_b = keep; // broadcast over the batch by qkv_where
    char name[64];
    switch (o->variant) {
    case QKV_ATTN_SOFTMAX1: case QKV_ATTN_SINK: {
        // w = e^x / (e^b + sum e^x): the softmax of [x, b] without its last column
        qkv_tensor *b;
        if (o->variant == QKV_ATTN_SINK) {
            snprintf(name, sizeof name, "blocks.%lld.attn.sink", (long long)layer);
            qkv_tensor *sink = qkv_model_param(o->fused, name); // [H] -> [BH, n, 1]
            qkv_tensor *rep = qkv_reshape(ctx, qkv_expand(ctx, qkv_reshape(ctx, sink, 2, (int64_t[]){1, H}), 2,
                                                          (int64_t[]){BH / H, H}), 3, (int64_t[]){BH, 1, 1});
            b = qkv_expand(ctx, rep, 3, (int64_t[]){BH, n, 1});
        } else b = qkv_zeros(ctx, dt, 3, (int64_t[]){BH, n, 1});
        qkv_tensor *x = qkv_where(ctx, keep_b, scores, ninf);
        qkv_tensor *both = qkv_concat(ctx, (qkv_tensor *[]){x, b}, 2, 2);
        return qkv_narrow(ctx, qkv_softmax_dim(ctx, both, -1), 2, 0, n);
    }
    case QKV_ATTN_SIGMOID: // sigma(x - log n_ctx) where kept
        return qkv_where(ctx, keep_b, qkv_sigmoid(ctx, qkv_add_scalar(ctx, scores, -log((double)o->n_ctx))), zeros);
    case QKV_ATTN_SSMAX: { // softmax(c_h log(n_i) x), n_i = i + 1 keys kept by causal row i
        snprintf(name, sizeof name, "blocks.%lld.attn.ssmax_c", (long long)layer);
        qkv_tensor *c = qkv_model_param(o->fused, name);
        qkv_tensor *logn = qkv_empty(ctx, dt, 3, (int64_t[]){1, n, 1});
        for (int64_t i = 0; i < n; i++) qkv_set_flat(ctx, logn, i, log((double)(i + 1)));
        qkv_tensor *ch = qkv_reshape(ctx, qkv_expand(ctx, qkv_reshape(ctx, c, 2, (int64_t[]){1, H}), 2,
                                                     (int64_t[]){BH / H, H}), 3, (int64_t[]){BH, 1, 1});
        qkv_tensor *x = qkv_mul(ctx, qkv_mul(ctx, scores, qkv_expand(ctx, ch, 3, (int64_t[]){BH, n, n})),
                                qkv_expand(ctx, logn, 3, (int64_t[]){BH, n, n}));
        if (o->ssmax_cap > 0) x = qkv_softcap(ctx, x, o->ssmax_cap); // the logits the softmax sees, capped
        return qkv_where(ctx, keep_b, qkv_softmax_dim(ctx, qkv_where(ctx, keep_b, x, ninf), -1), zeros);
    }
    case QKV_ATTN_SOFTPICK: { // relu(e^x - 1) / (sum |e^x - 1| + 1e-6) over kept keys
        qkv_tensor *e1 = qkv_where(ctx, keep_b, qkv_add_scalar(ctx, qkv_exp(ctx, scores), -1.0), zeros);
        qkv_tensor *den = qkv_add_scalar(ctx, qkv_sum_dim(ctx, qkv_abs(ctx, e1), -1, true), 1e-6);
        return qkv_div(ctx, qkv_relu(ctx, e1), qkv_expand(ctx, den, 3, (int64_t[]){BH, n, n}));
    }
    default: return qkv_set_error(ctx, QKV_ERR_ARG, "variant_weights: not a variant"), NULL;
    }
}

/* In f64 the fused variant's logits equal those of its formula built from operators (the model's composed path
 * through config.attn_weights) to 1e-12; the variant's parameters, moved off their initial values first. With
 * cap > 0 the fused model soft-caps inside the kernel; the composed one caps the scores before the oracle
 * (config.attn_softcap with attn_weights), or for SSMax the oracle caps c_h log(n_i) x itself. */
static void each_variant_equals_its_formula_at(double cap) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < N_VARIANTS; k++) {
        qkv_model_config c = variant_config(VARIANTS[k], QKV_F64);
        c.attn_softcap = cap;
        if (cap > 0) c.init_std = 0.5; // scores of order 1, which a cap of 0.5 bends
        qkv_model *fused = qkv_model_new(ctx, &c);
        cr_assert_not_null(fused, "%s: %s", qkv_attn_variant_name(VARIANTS[k]), qkv_errmsg(ctx));
        for (int l = 0; l < 2; l++) { // per-head parameters away from 0 and 1, different per head and layer
            char name[64];
            snprintf(name, sizeof name, "blocks.%d.attn.%s", l, VARIANTS[k] == QKV_ATTN_SINK ? "sink" : "ssmax_c");
            qkv_tensor *p = qkv_model_param(fused, name);
            if (VARIANTS[k] == QKV_ATTN_SINK || VARIANTS[k] == QKV_ATTN_SSMAX) {
                cr_assert_not_null(p, "%s", name);
                for (int h = 0; h < 2; h++) qkv_set_flat(ctx, p, h, 0.3 + 0.4 * h - 0.7 * l);
            } else cr_expect_null(p, "%s has no %s", qkv_attn_variant_name(VARIANTS[k]), name);
        }
        bool ssmax = VARIANTS[k] == QKV_ATTN_SSMAX;
        oracle o = {VARIANTS[k], fused, c.n_head, c.n_ctx, 0, ssmax ? cap : 0.0};
        qkv_model_config cc = small_config(QKV_F64);
        cc.attn_weights = variant_weights, cc.attn_weights_user = &o, cc.attn_weights_name = "oracle";
        cc.attn_softcap = ssmax ? 0.0 : cap;
        qkv_model *composed = qkv_model_new(ctx, &cc);
        cr_assert_not_null(composed, "%s", qkv_errmsg(ctx));
        // the same weights everywhere else
        for (int i = 0; i < qkv_model_param_count(composed); i++) {
            const char *name = qkv_model_param_names(composed)[i];
            qkv_tensor *dst = qkv_model_params(composed)[i], *src = qkv_model_param(fused, name);
            cr_assert(src && src->numel == dst->numel, "%s", name);
            memcpy(dst->data, src->data, (size_t)dst->numel * sizeof(double));
        }
        qkv_tensor *ids = make_ids(ctx, 2, 8, 11, 1);
        qkv_tensor *a = qkv_model_forward(ctx, fused, ids, QKV_CAUSAL), *b = qkv_model_forward(ctx, composed, ids, QKV_CAUSAL);
        cr_assert(a && b, "%s: %s", qkv_attn_variant_name(VARIANTS[k]), qkv_errmsg(ctx));
        double worst = 0;
        for (int64_t i = 0; i < a->numel; i++) worst = fmax(worst, fabs(qkv_f64(a)[i] - qkv_f64(b)[i]));
        if (cap > 0) { // and the cap matters: the same model uncapped gives other logits
            qkv_model_config u = *qkv_model_get_config(fused);
            u.attn_softcap = 0;
            qkv_model *uncapped = qkv_model_new(ctx, &u);
            cr_assert_not_null(uncapped, "%s", qkv_errmsg(ctx));
            for (int i = 0; i < qkv_model_param_count(uncapped); i++)
                memcpy(qkv_model_params(uncapped)[i]->data, qkv_model_param(fused, qkv_model_param_names(uncapped)[i])->data,
                       (size_t)qkv_model_params(uncapped)[i]->numel * sizeof(double));
            qkv_tensor *un = qkv_model_forward(ctx, uncapped, ids, QKV_CAUSAL);
            cr_assert_not_null(un, "%s", qkv_errmsg(ctx));
            double moved = 0;
            for (int64_t i = 0; i < a->numel; i++) moved = fmax(moved, fabs(qkv_f64(a)[i] - qkv_f64(un)[i]));
            cr_expect_gt(moved, 1e-2, "%s: the soft-cap moved the logits by only %g", qkv_attn_variant_name(VARIANTS[k]),
                         moved);
            qkv_model_free(uncapped);
        }
        cr_expect_lt(worst, 1e-12, "%s (softcap %g): fused and composed logits differ by %g",
                     qkv_attn_variant_name(VARIANTS[k]), cap, worst);
        qkv_step_end(ctx);
        qkv_model_free(composed);
        qkv_model_free(fused);
    }
    qkv_ctx_free(ctx);
}

Test(model_variants, each_variant_equals_its_formula) { each_variant_equals_its_formula_at(0.0); }

/* Soft-capping combines with every variant (inside the fused kernel); 0.5 bends most of these scores. */
Test(model_variants, each_softcapped_variant_equals_its_formula) { each_variant_equals_its_formula_at(0.5); }

/* The gradient of the model's loss reaches the variant's per-head parameters correctly: f64 gradcheck of the
 * loss against blocks.0.attn.sink, and against blocks.1.attn.ssmax_c. */
typedef struct loss_case {
    qkv_model *m;
    qkv_tensor *ids;
} loss_case;

static qkv_tensor *model_loss(qkv_ctx *ctx, qkv_tensor *const *inputs, int n_inputs, void *user) {
    (void)inputs, (void)n_inputs; // the inputs are the model's own parameter tensors
    loss_case *lc = user;
    return qkv_model_loss(ctx, qkv_model_forward(ctx, lc->m, lc->ids, QKV_CAUSAL), qkv_next_token_targets(ctx, lc->ids));
}

Test(model_variants, the_per_head_parameters_pass_gradcheck) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *names[2] = {"blocks.0.attn.sink", "blocks.1.attn.ssmax_c"};
    qkv_attn_variant kinds[2] = {QKV_ATTN_SINK, QKV_ATTN_SSMAX};
    for (int k = 0; k < 2; k++) {
        qkv_model_config c = variant_config(kinds[k], QKV_F64);
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        qkv_tensor *p = qkv_model_param(m, names[k]);
        cr_assert_not_null(p);
        for (int h = 0; h < 2; h++) qkv_set_flat(ctx, p, h, 0.5 - 0.8 * h);
        loss_case lc = {m, qkv_keep(ctx, make_ids(ctx, 2, 7, 11, 3))};
        qkv_gradcheck_result r;
        qkv_gradcheck_options o = {0};
        o.atol = 1e-8, o.rtol = 1e-5;
        cr_assert_eq(qkv_gradcheck(ctx, model_loss, (qkv_tensor *[]){p}, 1, &lc, &o, &r), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect(r.passed && r.checked == 2, "%s: %lld of %lld outside", names[k], (long long)r.failed, (long long)r.checked);
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* Every variant trains: 60 AdamW steps on one repeated batch lower the loss by a third (f32). */
Test(model_variants, every_variant_trains) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < N_VARIANTS; k++) {
        qkv_model_config c = variant_config(VARIANTS[k], QKV_F32);
        qkv_model *m = qkv_model_new(ctx, &c);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
        oo.lr = 1e-2;
        qkv_optimizer *opt = qkv_optim_new(ctx, &oo, qkv_model_params(m), qkv_model_param_count(m));
        cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
        double first = 0, last = 0;
        for (int step = 0; step < 60; step++) {
            qkv_tensor *ids = make_ids(ctx, 4, 8, 11, 0);
            qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), qkv_next_token_targets(ctx, ids));
            cr_assert_not_null(loss, "%s: %s", qkv_attn_variant_name(VARIANTS[k]), qkv_errmsg(ctx));
            last = qkv_get_flat(ctx, loss, 0);
            if (step == 0) first = last;
            cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
            qkv_optim_step(opt);
            qkv_optim_zero_grad(opt);
            qkv_step_end(ctx);
        }
        cr_expect_lt(last, first * 2 / 3, "%s: loss %g -> %g", qkv_attn_variant_name(VARIANTS[k]), first, last);
        qkv_optim_free(opt);
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* Sampling with the key/value cache gives the tokens of rerunning the window, for every variant (the sigmoid's
 * bias is fixed per model, SSMax counts the cached keys as the rerun counts its causal ones). */
Test(model_variants, the_cache_gives_the_reruns_tokens) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int k = 0; k < N_VARIANTS; k++) {
        qkv_model_config c = variant_config(VARIANTS[k], QKV_F64);
        c.n_ctx = 16;
        c.init_std = c.init_embed_std = 1.0; // sharp attention and logits: a wrong key or bias changes the draws
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
                     qkv_attn_variant_name(VARIANTS[k]));
        qkv_model_free(m);
    }
    qkv_ctx_free(ctx);
}

/* The checkpoint records the variant (qkv.model.attn_variant) and holds its parameters; loading gives the same
 * logits; a model of another variant refuses to restore it naming config.attn_variant; a file without the key
 * (older) is the softmax. */
Test(model_variants, checkpoints_record_the_variant) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = variant_config(QKV_ATTN_SINK, QKV_F32), other = variant_config(QKV_ATTN_SOFTMAX1, QKV_F32),
                     plain = small_config(QKV_F32);
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    qkv_set_flat(ctx, qkv_model_param(m, "blocks.1.attn.sink"), 1, 2.5);
    char path[256];
    snprintf(path, sizeof path, "/tmp/qkv-test-model-variants-%d.safetensors", (int)getpid());
    qkv_model *old = checkpoint_round_trip(ctx, m, path, "qkv.model.attn_variant", "sink", "blocks.1.attn.sink", &other,
                                           "config.attn_variant", &plain);
    cr_expect_eq(qkv_model_get_config(old)->attn_variant, QKV_ATTN_SOFTMAX);
    qkv_ctx_free(ctx);
}

static qkv_tensor *softmax_weights(qkv_ctx *ctx, qkv_tensor *scores, const qkv_tensor *mask, void *user) {
    (void)user;
    return qkv_softmax(ctx, scores, mask, 0);
}

/* What the model refuses: a variant with a user's weights, a value outside the enum. */
Test(model_variants, refused_combinations_name_the_fields) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = variant_config(QKV_ATTN_SIGMOID, QKV_F32);
    c.attn_weights = softmax_weights, c.attn_weights_name = "mine";
    cr_expect_null(qkv_model_new(ctx, &c));
    cr_expect(strstr(qkv_errmsg(ctx), "config.attn_variant sigmoid with config.attn_weights"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    c = variant_config((qkv_attn_variant)99, QKV_F32);
    cr_expect_null(qkv_model_new(ctx, &c));
    cr_expect(strstr(qkv_errmsg(ctx), "config.attn_variant is 99"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    qkv_ctx_free(ctx);
}
