/*
 * test_model_init.c — the model's initialisation by parameter group (config.init_std, init_embed_std,
 * init_resid_std): each group drawn at its own std, the groups independent of each other, GPT-2's scheme as
 * the default, the fields checked, and their round trip through a checkpoint (older files without them load
 * with GPT-2's values).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model_cases.h"
#include "qkv.h"

/* The sample standard deviation (about 0) of a parameter's values. */
static double sample_std(const qkv_tensor *t) {
    const float *x = qkv_f32(t);
    double s = 0, ss = 0;
    for (int64_t i = 0; i < t->numel; i++) s += x[i], ss += (double)x[i] * x[i];
    double mean = s / (double)t->numel;
    return sqrt(ss / (double)t->numel - mean * mean);
}

/* A model wide enough that each matrix holds thousands of draws (a sample std within 5% of the true one). */
static qkv_model_config wide_config(void) {
    qkv_model_config c = qkv_model_default_config();
    c.vocab = 64, c.n_ctx = 32, c.d_model = 64, c.n_layer = 2, c.n_head = 4, c.d_mlp = 128, c.seed = 3;
    return c;
}

static void expect_std(const qkv_model *m, const char *name, double want) {
    qkv_tensor *p = qkv_model_param(m, name);
    cr_assert_not_null(p, "%s", name);
    double got = sample_std(p);
    cr_expect(fabs(got - want) <= 0.05 * want, "%s: sample std %.5f, want %.5f", name, got, want);
}

/* The default is GPT-2's: 0.02 everywhere but W_O and W_out at 0.02 / sqrt(2 n_layer). */
Test(model_init, the_default_is_gpt2s_scheme) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = wide_config();
    cr_expect_eq(c.init_std, 0.02);
    cr_expect_eq(c.init_embed_std, 0.02);
    cr_expect(c.init_resid_std < 0);
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    expect_std(m, "embed.W_E", 0.02);
    expect_std(m, "pos_embed.W_pos", 0.02);
    expect_std(m, "blocks.0.attn.W_Q", 0.02);
    expect_std(m, "blocks.1.mlp.W_in", 0.02);
    expect_std(m, "unembed.W_U", 0.02);
    expect_std(m, "blocks.0.attn.W_O", 0.02 / 2.0);
    expect_std(m, "blocks.1.mlp.W_out", 0.02 / 2.0);
    qkv_ctx_free(ctx);
}

/* Each group at its own std; changing one group's std scales that group's draws and leaves every other
 * parameter the same bit for bit (the draws are the same standard normals, in the same order). */
Test(model_init, each_group_has_its_own_std_and_the_others_are_unchanged) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config base = wide_config(), c = base;
    c.init_embed_std = 1.0;
    c.init_resid_std = 0.5;
    qkv_model *m0 = qkv_model_new(ctx, &base), *m1 = qkv_model_new(ctx, &c);
    cr_assert(m0 && m1, "%s", qkv_errmsg(ctx));
    expect_std(m1, "embed.W_E", 1.0);
    expect_std(m1, "pos_embed.W_pos", 1.0);
    expect_std(m1, "blocks.0.attn.W_O", 0.5);
    expect_std(m1, "blocks.1.mlp.W_out", 0.5);
    const char *const *names = qkv_model_param_names(m0);
    for (int i = 0; i < qkv_model_param_count(m0); i++) {
        const qkv_tensor *a = qkv_model_params(m0)[i], *b = qkv_model_params(m1)[i];
        const float *x = qkv_f32(a), *y = qkv_f32(b);
        double factor = 1.0;
        if (strstr(names[i], "W_E") || strstr(names[i], "W_pos")) factor = 1.0 / 0.02;
        else if (strstr(names[i], "W_O") || strstr(names[i], "W_out")) factor = 0.5 / (0.02 / 2.0);
        for (int64_t k = 0; k < a->numel; k++) {
            if (factor == 1.0) cr_assert_eq(x[k], y[k], "%s[%lld] changed", names[i], (long long)k);
            else cr_assert_float_eq((double)y[k], (double)x[k] * factor, 1e-6 * fabs((double)y[k]) + 1e-30, "%s[%lld]",
                                    names[i], (long long)k);
        }
    }
    // std 0 gives zeros (a model whose attention starts uniform)
    c = base;
    c.init_std = 0.0;
    qkv_model *z = qkv_model_new(ctx, &c);
    cr_assert_not_null(z, "%s", qkv_errmsg(ctx));
    const qkv_tensor *wq = qkv_model_param(z, "blocks.0.attn.W_Q");
    for (int64_t k = 0; k < wq->numel; k++) cr_assert_eq(qkv_f32(wq)[k], 0.0f);
    expect_std(z, "embed.W_E", 0.02);
    qkv_ctx_free(ctx);
}

Test(model_init, bad_stds_are_refused_naming_the_field) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    struct {
        const char *field;
        double init_std, embed, resid;
    } cases[] = {
        {"config.init_std is -0.1", -0.1, 0.02, -1},
        {"config.init_std is nan", NAN, 0.02, -1},
        {"config.init_embed_std is inf", 0.02, INFINITY, -1},
        {"config.init_embed_std is -1", 0.02, -1, -1},
        {"config.init_resid_std is -inf", 0.02, 0.02, -INFINITY},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qkv_model_config c = wide_config();
        c.init_std = cases[i].init_std, c.init_embed_std = cases[i].embed, c.init_resid_std = cases[i].resid;
        cr_expect_null(qkv_model_new(ctx, &c));
        cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG);
        cr_expect(strstr(qkv_errmsg(ctx), "qkv_model_new") && strstr(qkv_errmsg(ctx), cases[i].field), "case %zu: %s", i,
                  qkv_errmsg(ctx));
        qkv_clear_error(ctx);
    }
    qkv_ctx_free(ctx);
}

static const char *temp_path(const char *tag) {
    static char buf[2][256];
    static int k;
    char *p = buf[k++ % 2];
    snprintf(p, 256, "/tmp/qkv-test-model-init-%d-%s.safetensors", (int)getpid(), tag);
    return p;
}

/* The three fields are written exactly, read back, and compared by qkv_model_restore; a file without them
 * (written before they existed) reads as GPT-2's scheme. */
Test(model_init, checkpoints_keep_the_stds_and_older_files_read_as_gpt2) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model_config c = small_config(QKV_F32);
    c.init_embed_std = 1.0, c.init_std = 0.03125, c.init_resid_std = 0.1;
    qkv_model *m = qkv_model_new(ctx, &c);
    cr_assert_not_null(m, "%s", qkv_errmsg(ctx));
    const char *path = temp_path("stds");
    cr_assert_eq(qkv_model_save(ctx, m, path, NULL, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.init_embed_std"), "1");
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.init_std"), "0.03125");
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.init_resid_std"), "0.10000000000000001");
    qkv_model_config back;
    cr_assert_eq(qkv_model_config_from_checkpoint(ctx, st, &back), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(back.init_embed_std == 1.0 && back.init_std == 0.03125 && back.init_resid_std == 0.1);
    qkv_model_config plain = small_config(QKV_F32);
    qkv_model *gpt2 = qkv_model_new(ctx, &plain);
    cr_assert_not_null(gpt2, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_model_restore(ctx, gpt2, st, NULL), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "config.init_std"), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);

    // the same file without the three keys, as qkv wrote it before they existed
    const char *old = temp_path("older");
    save_without_keys(ctx, st, old, "qkv.model.init_");
    qkv_safetensors *st_old = qkv_safetensors_load(ctx, old);
    cr_assert_not_null(st_old, "%s", qkv_errmsg(ctx));
    cr_assert_null(qkv_safetensors_metadata(st_old, "qkv.model.init_std"));
    cr_assert_eq(qkv_model_config_from_checkpoint(ctx, st_old, &back), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect(back.init_std == 0.02 && back.init_embed_std == 0.02 && back.init_resid_std < 0);
    cr_expect_eq(qkv_model_restore(ctx, gpt2, st_old, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_safetensors_free(ctx, st_old);
    qkv_safetensors_free(ctx, st);
    unlink(path), unlink(old);
    qkv_ctx_free(ctx);
}
