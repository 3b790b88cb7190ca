/*
 * test_hooks.c — the hook points of qkv/hooks.h: every point's value against the PyTorch twin
 * (tests/tools/make_model_twin.py, the *_hooks.safetensors files), the cache (globs, predicates, errors, .npy
 * export), hooks that read and replace (the gradient through a replacement, wrong shapes refused), patching
 * (a run patched with its own values changes nothing, bit for bit; a whole residual stream patched gives the
 * clean run), ablation at any point, and qkv_model_inspect as a reader of the same slots.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_cases.h"
#include "qkv.h"
#include "test_deadline.h"
#include "test_ops.h"

static const char *const twin_cases[] = {"mlp_layer_learned", "gqa_swiglu_rms_rope_bias",
                                         "three_layers_softcap_sinusoidal", "sink_layer_learned_bias",
                                         "ssmax_rope_qk_rms_gqa", "gate_head_gqa_rope_bias",
                                         "gate_element_sink_rms", "diff_rope_gqa_rms_bias"};

/* The largest error over the finite entries of got against want (norm-wise relative), and whether both have
 * -inf at exactly the same entries (hook_attn_scores's masked ones). */
static double hook_error(const qkv_tensor *got, const qkv_tensor *want, bool *same_infs) {
    double num = 0, den = 0;
    *same_infs = true;
    for (int64_t i = 0; i < want->numel; i++) {
        double g = at(got, i), w = at(want, i);
        if (isinf(w) || isinf(g)) {
            *same_infs &= g == w;
            continue;
        }
        num += (g - w) * (g - w), den += w * w;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

Test(hooks, every_hook_point_equals_the_pytorch_twin_within_1e_10_in_f64) {
    QKV_TEST_DEADLINE(120);
    for (size_t c = 0; c < sizeof twin_cases / sizeof twin_cases[0]; c++) {
        char path[512], golden_path[512], hooks_path[512];
        snprintf(path, sizeof path, "%s/model_twin/%s.safetensors", QKV_TEST_DATA, twin_cases[c]);
        snprintf(golden_path, sizeof golden_path, "%s/model_twin/%s_golden.safetensors", QKV_TEST_DATA, twin_cases[c]);
        snprintf(hooks_path, sizeof hooks_path, "%s/model_twin/%s_hooks.safetensors", QKV_TEST_DATA, twin_cases[c]);
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_model *m = qkv_model_load(ctx, path);
        qkv_safetensors *g = qkv_safetensors_load(ctx, golden_path), *h = qkv_safetensors_load(ctx, hooks_path);
        cr_assert(m && g && h, "%s: %s", twin_cases[c], qkv_errmsg(ctx));
        qkv_tensor *ids = qkv_keep(ctx, qkv_safetensors_get(g, "ids"));
        qkv_tensor *plain = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
        qkv_tensor *logits = qkv_model_run_with_cache(ctx, m, ids, QKV_CAUSAL, "*");
        cr_assert(plain && logits, "%s", qkv_errmsg(ctx));
        // reading every point changes nothing: the logits are those of the forward with nothing set, bit for bit
        cr_expect_eq(memcmp(plain->data, logits->data, (size_t)logits->numel * 8), 0, "%s: caching moved the logits",
                     twin_cases[c]);
        cr_expect_eq(qkv_model_hook_count(m), qkv_safetensors_count(h), "%s: qkv has %d points, the twin %d",
                     twin_cases[c], qkv_model_hook_count(m), qkv_safetensors_count(h));
        double worst = 0;
        const char *worst_name = "";
        for (int i = 0; i < qkv_model_hook_count(m); i++) {
            const char *name = qkv_model_hook_name(m, i);
            const qkv_tensor *want = qkv_safetensors_get(h, name);
            qkv_tensor *got = qkv_model_cached(ctx, m, name);
            cr_assert(got, "%s: %s: %s", twin_cases[c], name, qkv_errmsg(ctx));
            cr_assert(want, "%s: the twin has no %s", twin_cases[c], name);
            char gs[64], ws[64];
            cr_assert_str_eq(qkv_shape_str(got, gs, sizeof gs), qkv_shape_str(want, ws, sizeof ws), "%s: %s",
                             twin_cases[c], name);
            bool same_infs;
            double e = hook_error(got, want, &same_infs);
            cr_expect(same_infs, "%s: %s: the -inf entries differ", twin_cases[c], name);
            if (e > worst) worst = e, worst_name = name;
        }
        // measured: 6.1e-16 to 9.4e-16 (the worst point of each case)
        cr_expect(worst < 1e-10, "%s: %s differs from PyTorch by %.3g", twin_cases[c], worst_name, worst);
        qkv_safetensors_free(ctx, g);
        qkv_safetensors_free(ctx, h);
        qkv_ctx_free(ctx);
    }
}

/* The same weights rounded to f32: every point within f32's precision of the twin's f64 values. */
Test(hooks, every_hook_point_in_f32_is_within_single_precision_of_the_twin) {
    QKV_TEST_DEADLINE(120);
    for (size_t c = 0; c < sizeof twin_cases / sizeof twin_cases[0]; c++) {
        char path[512], golden_path[512], hooks_path[512];
        snprintf(path, sizeof path, "%s/model_twin/%s.safetensors", QKV_TEST_DATA, twin_cases[c]);
        snprintf(golden_path, sizeof golden_path, "%s/model_twin/%s_golden.safetensors", QKV_TEST_DATA, twin_cases[c]);
        snprintf(hooks_path, sizeof hooks_path, "%s/model_twin/%s_hooks.safetensors", QKV_TEST_DATA, twin_cases[c]);
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_model *m64 = qkv_model_load(ctx, path);
        cr_assert_not_null(m64, "%s", qkv_errmsg(ctx));
        qkv_model_config cfg = *qkv_model_get_config(m64);
        cfg.dtype = QKV_F32;
        qkv_model *m = qkv_model_new(ctx, &cfg);
        for (int i = 0; m && i < qkv_model_param_count(m); i++)
            cr_assert_eq(qkv_copy_into(ctx, qkv_model_params(m)[i], qkv_model_params(m64)[i]), QKV_OK);
        qkv_safetensors *g = qkv_safetensors_load(ctx, golden_path), *h = qkv_safetensors_load(ctx, hooks_path);
        cr_assert(m && g && h, "%s", qkv_errmsg(ctx));
        qkv_tensor *ids = qkv_keep(ctx, qkv_safetensors_get(g, "ids"));
        cr_assert_not_null(qkv_model_run_with_cache(ctx, m, ids, QKV_CAUSAL, "*"), "%s", qkv_errmsg(ctx));
        double worst = 0;
        const char *worst_name = "";
        for (int i = 0; i < qkv_model_hook_count(m); i++) {
            const char *name = qkv_model_hook_name(m, i);
            qkv_tensor *got = qkv_model_cached(ctx, m, name);
            cr_assert(got && qkv_safetensors_get(h, name), "%s: %s", twin_cases[c], name);
            bool same_infs;
            double e = hook_error(got, qkv_safetensors_get(h, name), &same_infs);
            cr_expect(same_infs, "%s: %s: the -inf entries differ", twin_cases[c], name);
            if (e > worst) worst = e, worst_name = name;
        }
        // measured: 3.0e-7 to 5.4e-7 (the worst point of each case); 1e-5 is 2^-24 grown through ~30 operators
        cr_expect(worst < 1e-5, "%s: %s differs from PyTorch by %.3g in f32", twin_cases[c], worst_name, worst);
        qkv_safetensors_free(ctx, g);
        qkv_safetensors_free(ctx, h);
        qkv_ctx_free(ctx);
    }
}

/* ---- names ---------------------------------------------------------------------------------------------- */

Test(hooks, points_are_listed_in_forward_order_and_exist_only_for_the_parts_a_model_has) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m);
    // 2 embeddings, 17 per layer (layer norm, plain MLP, learned positions), 2 of ln_final
    cr_expect_eq(qkv_model_hook_count(m), 2 + 2 * 17 + 2);
    const char *want[] = {"hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.ln1.hook_scale",
                          "blocks.0.ln1.hook_normalized", "blocks.0.attn.hook_q", "blocks.0.attn.hook_k",
                          "blocks.0.attn.hook_v", "blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern",
                          "blocks.0.attn.hook_z", "blocks.0.hook_attn_out", "blocks.0.hook_resid_mid",
                          "blocks.0.ln2.hook_scale", "blocks.0.ln2.hook_normalized", "blocks.0.mlp.hook_pre",
                          "blocks.0.mlp.hook_post", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post",
                          "blocks.1.hook_resid_pre"};
    for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++)
        cr_expect_str_eq(qkv_model_hook_name(m, i), want[i], "point %d", i);
    cr_expect_str_eq(qkv_model_hook_name(m, qkv_model_hook_count(m) - 1), "ln_final.hook_normalized");
    cr_expect_null(qkv_model_hook_name(m, qkv_model_hook_count(m)));
    cr_expect_eq(qkv_model_hook_find(ctx, m, "blocks.1.attn.hook_z"), 2 + 17 + 8);
    // attention-only, no norm, rope: no ln, mlp or pos_embed points; rot_q and rot_k appear
    c.d_mlp = 0, c.norm = QKV_NORM_NONE, c.positions = QKV_POS_ROPE;
    qkv_model *a = qkv_model_new(ctx, &c);
    cr_assert_not_null(a);
    cr_expect_eq(qkv_model_hook_count(a), 1 + 2 * 12);
    for (int i = 0; i < qkv_model_hook_count(a); i++) {
        const char *name = qkv_model_hook_name(a, i);
        cr_expect(!strstr(name, "ln") && !strstr(name, "mlp") && !strstr(name, "pos_embed"), "%s", name);
    }
    cr_expect_eq(qkv_model_hook_find(ctx, a, "blocks.0.attn.hook_rot_k"), 1 + 5);
    qkv_ctx_free(ctx);
}

Test(hooks, an_unknown_name_or_layer_is_refused_with_the_name_and_a_hint) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_expect_eq(qkv_model_hook_find(ctx, m, "blocks.0.attn.hook_qq"), -1);
    cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_model_hook_find: no hook point \"blocks.0.attn.hook_qq\"") &&
                  strstr(qkv_errmsg(ctx), "did you mean \"blocks.0.attn.hook_q\""),
              "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_model_cache_select(ctx, m, "blocks.2.hook_resid_pre"), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "layer 2 is outside [0, n_layer = 2)"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_model_cache_select(ctx, m, "blocks.*.hook_resid_pree"), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "\"blocks.*.hook_resid_pree\" matches none of the model's 38 hook points"), "%s",
              qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_model_add_hook(ctx, m, "hook_embedd", NULL, NULL), QKV_ERR_NULL);
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_model_ablate(ctx, m, "blocks.0.hook_resid_pre", 0, 1, QKV_ABLATE_ZERO, NULL), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "head 1: the point has no heads"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_model_ablate(ctx, m, "blocks.0.attn.hook_z", 0, 2, QKV_ABLATE_ZERO, NULL), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "head 2 is outside [0, 2)"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_model_ablate(ctx, m, "blocks.0.attn.hook_z", 8, -1, QKV_ABLATE_ZERO, NULL), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "position 8 is outside [0, n_ctx = 8)"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_model_ablate(ctx, m, "blocks.0.attn.hook_z", 0, -1, QKV_ABLATE_RESAMPLE, NULL), QKV_ERR_ARG);
    qkv_clear_error(ctx);
    qkv_ctx_free(ctx);
}

/* ---- the cache -------------------------------------------------------------------------------------------- */

static bool only_layer_one(const char *name, void *user) {
    (*(int *)user)++;
    return !strncmp(name, "blocks.1.", 9);
}

Test(hooks, the_cache_keeps_what_its_filter_selects_and_nothing_else) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *ids = make_ids(ctx, 2, 6, c.vocab, 1);
    cr_assert_eq(qkv_model_cache_select(ctx, m, "blocks.*.hook_resid_post"), QKV_OK);
    cr_assert_eq(qkv_model_cache_select(ctx, m, "hook_embed"), QKV_OK); // selections add up
    cr_expect_null(qkv_model_cached(ctx, m, "hook_embed"));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_STATE, "nothing ran yet");
    qkv_clear_error(ctx);
    qkv_tensor *logits = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
    cr_assert_not_null(logits);
    qkv_tensor *post1 = qkv_model_cached(ctx, m, "blocks.1.hook_resid_post");
    qkv_tensor *embed = qkv_model_cached(ctx, m, "hook_embed");
    cr_assert(post1 && embed, "%s", qkv_errmsg(ctx));
    cr_expect_eq(post1->ndim, 3);
    cr_expect_eq(post1->shape[0], 2);
    cr_expect_eq(post1->shape[1], 6);
    cr_expect_eq(post1->shape[2], 8);
    // hook_embed is W_E[ids]
    const qkv_tensor *W_E = qkv_model_param(m, "embed.W_E");
    for (int64_t r = 0; r < 12; r++)
        for (int64_t j = 0; j < 8; j++)
            cr_expect_eq(qkv_f64(embed)[r * 8 + j], qkv_f64(W_E)[qkv_i32(ids)[r] * 8 + j]);
    cr_expect_null(qkv_model_cached(ctx, m, "blocks.0.hook_resid_mid"));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_STATE);
    cr_expect(strstr(qkv_errmsg(ctx), "\"blocks.0.hook_resid_mid\" is not selected"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    // a predicate, asked once per point
    qkv_model_cache_clear(m);
    int asked = 0;
    cr_assert_eq(qkv_model_cache_select_fn(ctx, m, only_layer_one, &asked), QKV_OK);
    cr_expect_eq(asked, qkv_model_hook_count(m));
    cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    cr_expect_not_null(qkv_model_cached(ctx, m, "blocks.1.mlp.hook_post"));
    cr_expect_null(qkv_model_cached(ctx, m, "blocks.0.mlp.hook_post"));
    qkv_clear_error(ctx);
    // .npy export: one file per cached point, reading back the same values
    char dir[] = "/tmp/qkv_hooks_npy_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    int written = 0;
    cr_assert_eq(qkv_model_cache_save_npy(ctx, m, dir, &written), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_eq(written, 17);
    char path[256];
    snprintf(path, sizeof path, "%s/blocks.1.attn.hook_pattern.npy", dir);
    qkv_tensor *back = qkv_npy_load(ctx, path);
    qkv_tensor *pattern = qkv_model_cached(ctx, m, "blocks.1.attn.hook_pattern");
    cr_assert(back && pattern, "%s", qkv_errmsg(ctx));
    cr_expect_eq(back->numel, 2 * 2 * 6 * 6);
    cr_expect_eq(memcmp(back->data, pattern->data, (size_t)back->numel * 8), 0);
    for (int i = 0; i < qkv_model_hook_count(m); i++) {
        const char *name = qkv_model_hook_name(m, i);
        snprintf(path, sizeof path, "%s/%s.npy", dir, name);
        if (!strncmp(name, "blocks.1.", 9)) cr_expect_eq(unlink(path), 0, "%s missing", path);
        else cr_expect_neq(access(path, F_OK), 0, "%s written", path);
    }
    rmdir(dir);
    // a folder that is not there: the file's error, named
    cr_expect_eq(qkv_model_cache_save_npy(ctx, m, "/nonexistent_qkv_dir", &written), QKV_ERR_IO);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_model_cache_save_npy: qkv_npy_save") &&
                  strstr(qkv_errmsg(ctx), "/nonexistent_qkv_dir/blocks.1."), "%s", qkv_errmsg(ctx));
    cr_expect_eq(written, 0);
    qkv_clear_error(ctx);
    // '?' is one character: blocks.?.attn.hook_q is one point per layer, and nothing else
    qkv_model_cache_clear(m);
    cr_assert_eq(qkv_model_cache_select(ctx, m, "blocks.?.attn.hook_?"), QKV_OK);
    cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    cr_assert_eq(qkv_model_cache_save_npy(ctx, m, "/nonexistent_qkv_dir", &written), QKV_ERR_IO); // counts nothing
    qkv_clear_error(ctx);
    int kept = 0;
    for (int i = 0; i < qkv_model_hook_count(m); i++) {
        qkv_tensor *t = qkv_model_cached(ctx, m, qkv_model_hook_name(m, i));
        qkv_clear_error(ctx);
        kept += t != NULL;
    }
    cr_expect_eq(kept, 2 * 4, "hook_q, hook_k, hook_v, hook_z of each layer: %d kept", kept);
    // the values live for the step only
    qkv_step_end(ctx);
    cr_expect_null(qkv_model_cached(ctx, m, "blocks.1.attn.hook_q"));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_STATE);
    cr_expect(strstr(qkv_errmsg(ctx), "no forward that keeps \"blocks.1.attn.hook_q\" has run in this step"), "%s",
              qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* ---- hooks that read and replace ----------------------------------------------------------------------------- */

/* Zero head 1 of z [B*H, n, d_head] by multiplying with a 0/1 mask (a replacement built from qkv operators). */
static qkv_tensor *zero_head_one(qkv_ctx *ctx, const char *name, qkv_tensor *z, void *user) {
    (void)name;
    (*(int *)user)++;
    qkv_tensor *keep = qkv_ones(ctx, z->dtype, z->ndim, z->shape);
    int64_t heads = 2, per = z->shape[1] * z->shape[2];
    for (int64_t r = 0; keep && r < z->shape[0]; r++)
        if (r % heads == 1) memset(qkv_f64(keep) + r * per, 0, (size_t)per * 8);
    return qkv_mul(ctx, z, keep);
}

Test(hooks, a_replacement_acts_and_its_gradient_flows_as_head_ablation_does) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *ids = qkv_keep(ctx, make_ids(ctx, 2, 6, c.vocab, 3));
    qkv_tensor *targets = qkv_keep(ctx, qkv_next_token_targets(ctx, ids));
    int64_t n_logits = 0;
    const qkv_tensor *W_Q = qkv_model_param(m, "blocks.0.attn.W_Q");
    double *grad[2], *logits[2];
    for (int way = 0; way < 2; way++) {
        int calls = 0;
        if (way == 0) cr_assert_eq(qkv_model_ablate_head(ctx, m, 0, 1, QKV_ABLATE_ZERO), QKV_OK);
        else cr_assert_eq(qkv_model_add_hook(ctx, m, "blocks.0.attn.hook_z", zero_head_one, &calls), QKV_OK);
        qkv_zero_grads(ctx);
        qkv_tensor *out = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
        cr_assert_eq(qkv_backward(ctx, qkv_model_loss(ctx, out, targets), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        grad[way] = malloc((size_t)W_Q->numel * 8);
        logits[way] = malloc((size_t)out->numel * 8);
        memcpy(grad[way], qkv_f64(W_Q->grad), (size_t)W_Q->numel * 8);
        memcpy(logits[way], out->data, (size_t)out->numel * 8);
        n_logits = out->numel;
        qkv_step_end(ctx);
        cr_expect_eq(calls, way, "the hook ran %d times", calls);
        qkv_model_clear_ablations(m);
        qkv_model_clear_hooks(m);
    }
    // the same products (z * 0 or z * 1) in another layout: the same bits, forward and backward
    cr_expect_eq(memcmp(logits[0], logits[1], (size_t)n_logits * 8), 0);
    cr_expect_eq(memcmp(grad[0], grad[1], (size_t)W_Q->numel * 8), 0, "the gradient did not flow the same way");
    double norm = 0;
    for (int64_t i = 0; i < W_Q->numel; i++) norm += grad[1][i] * grad[1][i];
    cr_expect_gt(norm, 0);
    for (int way = 0; way < 2; way++) free(grad[way]), free(logits[way]);
    qkv_ctx_free(ctx);
}

static qkv_tensor *wrong_shape(qkv_ctx *ctx, const char *name, qkv_tensor *value, void *user) {
    (void)name, (void)user;
    return qkv_zeros(ctx, value->dtype, 2, (int64_t[]){3, 4});
}
static qkv_tensor *failing(qkv_ctx *ctx, const char *name, qkv_tensor *value, void *user) {
    (void)name, (void)value, (void)user;
    qkv_set_error(ctx, QKV_ERR_NUMERIC, "my_probe: found a NaN");
    return NULL;
}

Test(hooks, a_replacement_of_the_wrong_shape_or_a_failing_hook_is_reported_with_the_point) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *ids = make_ids(ctx, 2, 5, c.vocab, 0);
    cr_assert_eq(qkv_model_add_hook(ctx, m, "blocks.1.mlp.hook_pre", wrong_shape, NULL), QKV_OK);
    cr_expect_eq(qkv_model_add_hook(ctx, m, "blocks.1.mlp.hook_pre", wrong_shape, NULL), QKV_ERR_STATE);
    qkv_clear_error(ctx);
    cr_expect_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_SHAPE);
    cr_expect_str_eq(qkv_errmsg(ctx), "qkv_model_forward: the hook at \"blocks.1.mlp.hook_pre\" returned f64 [3,4] for "
                                      "the activation f64 [2,5,12]: a replacement must have the activation's shape and "
                                      "dtype");
    qkv_clear_error(ctx);
    qkv_model_clear_hooks(m);
    cr_assert_eq(qkv_model_add_hook(ctx, m, "ln_final.hook_scale", failing, NULL), QKV_OK);
    cr_expect_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_NUMERIC);
    cr_expect_str_eq(qkv_errmsg(ctx), "qkv_model_forward: hook \"ln_final.hook_scale\": my_probe: found a NaN");
    qkv_ctx_free(ctx);
}

/* ---- patching ------------------------------------------------------------------------------------------------ */

/* logit[b, n-1, a] - logit[b, n-1, b'] summed over the batch, a = 3, b' = 5. */
static double logit_diff(qkv_ctx *ctx, const qkv_tensor *logits, void *user) {
    (void)ctx, (void)user;
    int64_t B = logits->shape[0], n = logits->shape[1], V = logits->shape[2];
    double sum = 0;
    for (int64_t b = 0; b < B; b++) sum += at(logits, (b * n + n - 1) * V + 3) - at(logits, (b * n + n - 1) * V + 5);
    return sum;
}

static const struct {
    const char *hook;
    int by;
} self_patches[] = {
    {"hook_resid_pre", QKV_PATCH_BY_POS},      {"ln1.hook_normalized", QKV_PATCH_BY_POS},
    {"attn.hook_q", QKV_PATCH_BY_HEAD},        {"attn.hook_k", QKV_PATCH_BY_POS | QKV_PATCH_BY_HEAD},
    {"attn.hook_v", QKV_PATCH_BY_HEAD},        {"attn.hook_z", QKV_PATCH_BY_POS | QKV_PATCH_BY_HEAD},
    {"hook_attn_out", QKV_PATCH_BY_POS},       {"hook_resid_mid", 0},
    {"mlp.hook_pre", QKV_PATCH_BY_POS},        {"mlp.hook_post", 0},
    {"hook_mlp_out", QKV_PATCH_BY_POS},        {"hook_resid_post", QKV_PATCH_BY_POS},
};

Test(hooks, patching_a_run_with_its_own_values_changes_nothing_bit_for_bit) {
    QKV_TEST_DEADLINE(120);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    for (int variant = 0; variant < 2; variant++) {
        qkv_model_config c = small_config(QKV_F64);
        if (variant == 1) c.attn_softcap = 2.0, c.n_kv_head = 1; // soft-capped attention; grouped heads
        qkv_model *m = qkv_model_new(ctx, &c);
        qkv_tensor *ids = make_ids(ctx, 2, 6, c.vocab, 2);
        double clean = logit_diff(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), NULL);
        int n_cases = (int)(sizeof self_patches / sizeof self_patches[0]) + (variant == 1 ? 2 : 0);
        for (int k = 0; k < n_cases; k++) {
            const char *hook = k < 12 ? self_patches[k].hook : k == 12 ? "attn.hook_pattern" : "attn.hook_attn_scores";
            int by = k < 12 ? self_patches[k].by : QKV_PATCH_BY_POS | QKV_PATCH_BY_HEAD;
            qkv_tensor *table = qkv_model_patch_sweep(ctx, m, hook, ids, ids, QKV_CAUSAL, by, logit_diff, NULL);
            cr_assert_not_null(table, "%s: %s", hook, qkv_errmsg(ctx));
            int64_t want = 2 * (by & QKV_PATCH_BY_POS ? 6 : 1) *
                           (by & QKV_PATCH_BY_HEAD ? (variant && (!strcmp(hook, "attn.hook_k") || !strcmp(hook, "attn.hook_v")) ? 1 : 2) : 1);
            cr_expect_eq(table->numel, want, "%s: %lld entries", hook, (long long)table->numel);
            /* a patched pattern or score takes the composed attention (z = A v) where the clean run's soft-capped
             * attention is fused: the same to rounding, not bit for bit */
            double tol = k >= 12 ? 1e-13 * fabs(clean) : 0.0;
            for (int64_t i = 0; i < table->numel; i++)
                cr_expect_leq(fabs(qkv_f64(table)[i] - clean), tol, "variant %d %s entry %lld: %.17g, clean %.17g",
                              variant, hook, (long long)i, qkv_f64(table)[i], clean);
        }
    }
    qkv_ctx_free(ctx);
}

Test(hooks, patching_the_whole_residual_stream_gives_the_clean_run_and_a_sweep_finds_where_it_matters) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *clean_ids = make_ids(ctx, 2, 6, c.vocab, 2);
    qkv_tensor *corrupt_ids = qkv_copy(ctx, clean_ids);
    qkv_i32(corrupt_ids)[2] = (qkv_i32(corrupt_ids)[2] + 1) % (int32_t)c.vocab; // position 2 of batch 0
    qkv_i32(corrupt_ids)[6 + 2] = (qkv_i32(corrupt_ids)[6 + 2] + 4) % (int32_t)c.vocab;
    double clean = logit_diff(ctx, qkv_model_forward(ctx, m, clean_ids, QKV_CAUSAL), NULL);
    double corrupt = logit_diff(ctx, qkv_model_forward(ctx, m, corrupt_ids, QKV_CAUSAL), NULL);
    cr_assert_neq(clean, corrupt);
    qkv_tensor *whole = qkv_model_patch_sweep(ctx, m, "hook_resid_pre", clean_ids, corrupt_ids, QKV_CAUSAL, 0,
                                              logit_diff, NULL);
    cr_assert_not_null(whole, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_f64(whole)[0], clean, "layer 0's whole resid_pre patched: %.17g, clean %.17g", qkv_f64(whole)[0],
                 clean);
    qkv_tensor *by_pos = qkv_model_patch_sweep(ctx, m, "hook_resid_pre", clean_ids, corrupt_ids, QKV_CAUSAL,
                                               QKV_PATCH_BY_POS, logit_diff, NULL);
    cr_assert_not_null(by_pos);
    // at layer 0 only position 2 differs between the runs: patching it restores the clean run exactly; patching
    // any other position patches equal values and leaves the corrupted run as it is
    for (int64_t i = 0; i < 6; i++)
        cr_expect_eq(qkv_f64(by_pos)[i], i == 2 ? clean : corrupt, "layer 0 position %lld", (long long)i);
    // the user's settings survive a sweep
    cr_assert_eq(qkv_model_cache_select(ctx, m, "hook_embed"), QKV_OK);
    cr_assert_not_null(qkv_model_patch_sweep(ctx, m, "attn.hook_z", clean_ids, corrupt_ids, QKV_CAUSAL,
                                             QKV_PATCH_BY_HEAD, logit_diff, NULL));
    cr_assert_not_null(qkv_model_forward(ctx, m, clean_ids, QKV_CAUSAL));
    cr_expect_not_null(qkv_model_cached(ctx, m, "hook_embed"), "%s", qkv_errmsg(ctx));
    // misuse
    cr_expect_null(qkv_model_patch_sweep(ctx, m, "hook_resid_pre", clean_ids, corrupt_ids, QKV_CAUSAL,
                                         QKV_PATCH_BY_HEAD, logit_diff, NULL));
    cr_expect(strstr(qkv_errmsg(ctx), "\"hook_resid_pre\" has no heads"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    cr_expect_null(qkv_model_patch_sweep(ctx, m, "hook_embed", clean_ids, corrupt_ids, QKV_CAUSAL, 0, logit_diff, NULL));
    cr_expect(strstr(qkv_errmsg(ctx), "no hook point \"blocks.0.hook_embed\""), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* ---- ablation at any point ------------------------------------------------------------------------------------- */

Test(hooks, zero_mean_and_resample_ablation_replace_exactly_the_chosen_entries) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *ids = make_ids(ctx, 3, 6, c.vocab, 2), *other = make_ids(ctx, 3, 6, c.vocab, 5);
    cr_assert_eq(qkv_model_cache_select(ctx, m, "blocks.0.attn.hook_z"), QKV_OK);
    cr_assert_eq(qkv_model_cache_select(ctx, m, "blocks.1.hook_resid_pre"), QKV_OK);
    cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    qkv_tensor *z0 = qkv_model_cached(ctx, m, "blocks.0.attn.hook_z");
    qkv_tensor *r0 = qkv_model_cached(ctx, m, "blocks.1.hook_resid_pre");
    cr_assert_not_null(qkv_model_forward(ctx, m, other, QKV_CAUSAL));
    qkv_tensor *z_other = qkv_model_cached(ctx, m, "blocks.0.attn.hook_z");
    for (int kind = QKV_ABLATE_ZERO; kind <= QKV_ABLATE_RESAMPLE; kind++) {
        qkv_model_clear_hooks(m);
        cr_assert_eq(qkv_model_ablate(ctx, m, "blocks.0.attn.hook_z", 4, 1, (qkv_ablation_kind)kind,
                                      kind == QKV_ABLATE_RESAMPLE ? z_other : NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_assert_eq(qkv_model_ablate(ctx, m, "blocks.1.hook_resid_pre", -1, -1, QKV_ABLATE_ZERO, NULL), QKV_OK);
        cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL), "%s", qkv_errmsg(ctx));
        qkv_tensor *z = qkv_model_cached(ctx, m, "blocks.0.attn.hook_z"); // the value carried on
        qkv_tensor *r = qkv_model_cached(ctx, m, "blocks.1.hook_resid_pre");
        for (int64_t i = 0; i < r->numel; i++) cr_expect_eq(qkv_f64(r)[i], 0.0);
        cr_expect_neq(qkv_f64(r0)[0], 0.0);
        int64_t n = 6, dh = 4;
        for (int64_t row = 0; row < 6; row++) // [B*H = 6, n, dh]; head 1 is rows 1, 3, 5
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < dh; j++) {
                    int64_t e = (row * n + i) * dh + j;
                    double want = qkv_f64(z0)[e];
                    if (row % 2 == 1 && i == 4) {
                        if (kind == QKV_ABLATE_ZERO) want = 0;
                        if (kind == QKV_ABLATE_RESAMPLE) want = qkv_f64(z_other)[e];
                        if (kind == QKV_ABLATE_MEAN)
                            want = (qkv_f64(z0)[(1 * n + i) * dh + j] + qkv_f64(z0)[(3 * n + i) * dh + j] +
                                    qkv_f64(z0)[(5 * n + i) * dh + j]) / 3;
                    }
                    cr_expect_eq(qkv_f64(z)[e], want, "kind %d row %lld pos %lld", kind, (long long)row, (long long)i);
                }
    }
    // a source of the wrong shape is refused when the forward meets it, naming the point and both shapes
    qkv_model_clear_hooks(m);
    cr_assert_eq(qkv_model_patch(ctx, m, "blocks.0.attn.hook_z", 1, -1, r0), QKV_OK);
    cr_expect_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    cr_expect(strstr(qkv_errmsg(ctx), "the source patched in at \"blocks.0.attn.hook_z\" is f64 [3,6,8], the activation "
                                      "is f64 [6,6,4]"), "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* The old inspection reads the same slots: its values are the cache's. */
Test(hooks, inspection_and_the_cache_read_the_same_values) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *ids = make_ids(ctx, 2, 6, c.vocab, 4);
    qkv_model_set_inspect(m, true);
    cr_assert_eq(qkv_model_cache_select(ctx, m, "*"), QKV_OK);
    cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    cr_expect_eq(qkv_model_inspect(ctx, m, QKV_INSPECT_PATTERN, 1), qkv_model_cached(ctx, m, "blocks.1.attn.hook_pattern"));
    cr_expect_eq(qkv_model_inspect(ctx, m, QKV_INSPECT_HEAD_OUT, 0), qkv_model_cached(ctx, m, "blocks.0.attn.hook_z"));
    cr_expect_eq(qkv_model_inspect(ctx, m, QKV_INSPECT_RESID_MID, 1), qkv_model_cached(ctx, m, "blocks.1.hook_resid_mid"));
    // without a soft-cap the inspected scores are the hook's, except where the causal mask puts -inf
    qkv_tensor *S = qkv_model_inspect(ctx, m, QKV_INSPECT_SCORES, 0);
    qkv_tensor *T = qkv_model_cached(ctx, m, "blocks.0.attn.hook_attn_scores");
    cr_assert(S && T);
    for (int64_t r = 0; r < 4; r++)
        for (int64_t i = 0; i < 6; i++)
            for (int64_t j = 0; j < 6; j++) {
                int64_t e = (r * 6 + i) * 6 + j;
                if (j <= i) cr_expect_eq(qkv_f64(S)[e], qkv_f64(T)[e]);
                else cr_expect(isinf(qkv_f64(T)[e]) && qkv_f64(T)[e] < 0 && isfinite(qkv_f64(S)[e]));
            }
    qkv_model_cache_clear(m);
    qkv_model_set_inspect(m, false);
    cr_expect_not(m == NULL);
    qkv_ctx_free(ctx);
}

/* ---- the logit lens and attribution ------------------------------------------------------------------------------ */

Test(hooks, the_logit_lens_ends_in_the_models_logits_and_starts_at_the_embedding) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *ids = make_ids(ctx, 2, 5, c.vocab, 6);
    qkv_tensor *logits = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
    qkv_tensor *lens = qkv_model_logit_lens(ctx, m, ids, QKV_CAUSAL);
    cr_assert(logits && lens, "%s", qkv_errmsg(ctx));
    cr_assert_eq(lens->ndim, 4);
    cr_expect(lens->shape[0] == 3 && lens->shape[1] == 2 && lens->shape[2] == 5 && lens->shape[3] == c.vocab);
    int64_t per = logits->numel;
    cr_expect_eq(memcmp((double *)lens->data + 2 * per, logits->data, (size_t)per * 8), 0, "the last row differs");
    // row 0: the embedding through the head, by hand
    qkv_model_cache_select(ctx, m, "hook_embed");
    qkv_model_cache_select(ctx, m, "hook_pos_embed");
    cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    qkv_tensor *x0 = qkv_add(ctx, qkv_model_cached(ctx, m, "hook_embed"), qkv_model_cached(ctx, m, "hook_pos_embed"));
    qkv_tensor *row0 = qkv_model_unembed(ctx, m, x0);
    cr_assert_not_null(row0, "%s", qkv_errmsg(ctx));
    cr_expect_eq(memcmp(lens->data, row0->data, (size_t)per * 8), 0, "row 0 differs");
    cr_expect_null(qkv_model_unembed(ctx, m, qkv_zeros(ctx, QKV_F64, 2, (int64_t[]){3, 7})));
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_model_unembed: resid is f64 [3,7]: it must be f64 [.., d_model = 8]"), "%s",
              qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* The parts add up to the logit difference, in models with every kind of part and norm. */
Test(hooks, attribution_parts_sum_to_the_logit_difference_within_1e_10) {
    QKV_TEST_DEADLINE(60);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const char *files[] = {"mlp_layer_learned", "gqa_swiglu_rms_rope_bias", "three_layers_softcap_sinusoidal",
                           "tied_nopos_scale1", "attn_only_nonorm_learned", "geglu_layer_learned_bias",
                           "gate_element_sink_rms", "diff_gate_head_scale_swiglu"};
    for (int f = 0; f < (int)(sizeof files / sizeof files[0]); f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/model_twin/%s.safetensors", QKV_TEST_DATA, files[f]);
        qkv_model *m = qkv_model_load(ctx, path);
        cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
        const qkv_model_config *c = qkv_model_get_config(m);
        qkv_tensor *ids = make_ids(ctx, 3, 7, c->vocab, f);
        for (int64_t pos = 0; pos < 7; pos += 3) {
            qkv_tensor *parts = qkv_model_logit_attribution(ctx, m, ids, QKV_CAUSAL, pos, 2, 7);
            cr_assert_not_null(parts, "%s: %s", files[f], qkv_errmsg(ctx));
            int n_parts = qkv_model_attribution_count(m);
            cr_assert_eq(parts->shape[1], n_parts + 1);
            for (int64_t b = 0; b < 3; b++) {
                const double *row = qkv_f64(parts) + b * (n_parts + 1);
                double sum = 0, size = 0;
                for (int i = 0; i < n_parts; i++) sum += row[i], size += fabs(row[i]);
                // measured: at most 4.1e-16 relative to the sum of |parts| (72 rows)
                cr_expect(fabs(sum - row[n_parts]) <= 1e-10 * size, "%s pos %lld batch %lld: parts sum to %.17g, the "
                          "logit difference is %.17g", files[f], (long long)pos, (long long)b, sum, row[n_parts]);
            }
        }
        qkv_model_free(m);
        qkv_step_end(ctx);
    }
    qkv_ctx_free(ctx);
}

/* A head's part is what removing it changes when the final norm's scale is held: in an attention-only model, the
 * last block's head h zeroed at position pos (nothing after it sees the change), with ln_final.hook_scale patched
 * to the clean run's. */
Test(hooks, a_heads_part_is_the_change_from_zeroing_it_with_the_scale_frozen) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    c.attn_bias = true, c.d_mlp = 0;
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *ids = make_ids(ctx, 2, 6, c.vocab, 1);
    int64_t pos = 4;
    qkv_tensor *parts = qkv_model_logit_attribution(ctx, m, ids, QKV_CAUSAL, pos, 1, 9);
    cr_assert_not_null(parts, "%s", qkv_errmsg(ctx));
    int n_parts = qkv_model_attribution_count(m);
    cr_expect_eq(n_parts, 2 + 2 * (2 + 1) + 1);
    char label[64];
    cr_assert(qkv_model_attribution_label(m, 2 + 3 + 1, label, sizeof label));
    cr_expect_str_eq(label, "L1H1");
    cr_assert(qkv_model_attribution_label(m, n_parts - 1, label, sizeof label));
    cr_expect_str_eq(label, "ln_final.b");
    cr_expect_not(qkv_model_attribution_label(m, n_parts, label, sizeof label));
    cr_assert_eq(qkv_model_cache_select(ctx, m, "ln_final.hook_scale"), QKV_OK);
    cr_assert_not_null(qkv_model_forward(ctx, m, ids, QKV_CAUSAL));
    qkv_tensor *scale = qkv_model_cached(ctx, m, "ln_final.hook_scale");
    for (int64_t h = 0; h < 2; h++) {
        qkv_model_clear_hooks(m);
        cr_assert_eq(qkv_model_patch(ctx, m, "ln_final.hook_scale", -1, -1, scale), QKV_OK);
        cr_assert_eq(qkv_model_ablate(ctx, m, "blocks.1.attn.hook_z", pos, h, QKV_ABLATE_ZERO, NULL), QKV_OK);
        qkv_tensor *logits = qkv_model_forward(ctx, m, ids, QKV_CAUSAL);
        cr_assert_not_null(logits, "%s", qkv_errmsg(ctx));
        for (int64_t b = 0; b < 2; b++) {
            int64_t r = (b * 6 + pos) * c.vocab;
            double ablated = qkv_f64(logits)[r + 1] - qkv_f64(logits)[r + 9];
            const double *row = qkv_f64(parts) + b * (n_parts + 1);
            double part = row[2 + 3 + h], whole = row[n_parts];
            cr_expect(fabs((whole - ablated) - part) < 1e-12 * (1 + fabs(whole)), "head %lld batch %lld: zeroing moved "
                      "the difference by %.17g, its part is %.17g", (long long)h, (long long)b, whole - ablated, part);
            cr_expect_gt(fabs(part), 1e-6);
        }
    }
    qkv_ctx_free(ctx);
}

/* A copy returned at hook_pattern or hook_attn_scores takes the composed attention (z = A v, A = softmax(S)): the
 * logits and the gradient of W_Q (which reaches q only through the replacement) match the fused forward's. */
static qkv_tensor *copy_of(qkv_ctx *ctx, const char *name, qkv_tensor *value, void *user) {
    (void)name, (void)user;
    return qkv_scale(ctx, value, 1.0);
}

Test(hooks, the_gradient_flows_through_a_replaced_pattern_or_scores) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F64);
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_tensor *ids = qkv_keep(ctx, make_ids(ctx, 2, 6, c.vocab, 3));
    qkv_tensor *targets = qkv_keep(ctx, qkv_next_token_targets(ctx, ids));
    const qkv_tensor *W_Q = qkv_model_param(m, "blocks.1.attn.W_Q");
    double loss[3], *grad[3];
    const char *where[3] = {NULL, "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_attn_scores"};
    for (int way = 0; way < 3; way++) {
        qkv_model_clear_hooks(m);
        if (where[way]) cr_assert_eq(qkv_model_add_hook(ctx, m, where[way], copy_of, NULL), QKV_OK);
        qkv_zero_grads(ctx);
        qkv_tensor *l = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), targets);
        cr_assert_eq(qkv_backward(ctx, l, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        loss[way] = qkv_f64(l)[0];
        grad[way] = malloc((size_t)W_Q->numel * 8);
        memcpy(grad[way], qkv_f64(W_Q->grad), (size_t)W_Q->numel * 8);
        qkv_step_end(ctx);
    }
    for (int way = 1; way < 3; way++) {
        cr_expect(fabs(loss[way] - loss[0]) < 1e-14, "%s: loss %.17g, fused %.17g", where[way], loss[way], loss[0]);
        double num = 0, den = 0;
        for (int64_t i = 0; i < W_Q->numel; i++)
            num += (grad[way][i] - grad[0][i]) * (grad[way][i] - grad[0][i]), den += grad[0][i] * grad[0][i];
        cr_expect(den > 0 && sqrt(num / den) < 1e-12, "%s: dW_Q differs by %.3g", where[way], sqrt(num / den));
    }
    for (int way = 0; way < 3; way++) free(grad[way]);
    qkv_ctx_free(ctx);
}
