/*
 * model_cases.h — what the model tests share: a small configuration, ids of a fixed pattern, and a configuration
 * field's checkpoint round trip.
 */
#ifndef QKV_TEST_MODEL_CASES_H
#define QKV_TEST_MODEL_CASES_H

#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "qkv.h"

/* vocab 11, n_ctx 8, d_model 8, 2 layers of 2 heads, d_mlp 12, seed 7; the rest the defaults. */
static inline qkv_model_config small_config(qkv_dtype dt) {
    qkv_model_config c = qkv_model_default_config();
    c.vocab = 11;
    c.n_ctx = 8;
    c.d_model = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.d_mlp = 12;
    c.dtype = dt;
    c.seed = 7;
    return c;
}

/* ids [B, n] with id (b * 5 + i * 3 + salt) % V. */
static inline qkv_tensor *make_ids(qkv_ctx *ctx, int64_t B, int64_t n, int64_t V, int salt) {
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){B, n});
    cr_assert_not_null(ids);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) qkv_i32(ids)[b * n + i] = (int32_t)((b * 5 + i * 3 + salt) % V);
    return ids;
}

/* Write st's tensors and metadata to path without the metadata keys that start with prefix: a checkpoint as
 * qkv wrote it before those configuration fields existed. */
static inline void save_without_keys(qkv_ctx *ctx, const qkv_safetensors *st, const char *path, const char *prefix) {
    const char *meta[128];
    int n_meta = 0;
    for (int i = 0; i < qkv_safetensors_metadata_count(st); i++) {
        const char *key = qkv_safetensors_metadata_key(st, i);
        if (strncmp(key, prefix, strlen(prefix)) == 0) continue;
        cr_assert_lt(n_meta, 64);
        meta[2 * n_meta] = key, meta[2 * n_meta + 1] = qkv_safetensors_metadata(st, key), n_meta++;
    }
    qkv_named_tensor tensors[64];
    int n = qkv_safetensors_count(st);
    cr_assert_leq(n, 64);
    for (int i = 0; i < n; i++)
        tensors[i].name = qkv_safetensors_name(st, i), tensors[i].tensor = qkv_safetensors_get(st, tensors[i].name);
    cr_assert_eq(qkv_safetensors_save(ctx, path, tensors, n, meta, n_meta), QKV_OK, "%s", qkv_errmsg(ctx));
}

/* A configuration field's round trip through a checkpoint: m (whose config sets the field) saved to path records
 * metadata key = value and holds the tensor param; the loaded model gives m's logits; a model made from wrong
 * (the field set otherwise) refuses to restore the file with a message naming field and value; and the file of a
 * model made from plain, with key removed (a checkpoint written before the field existed), loads. Returns that
 * model, whose field the caller checks for the default; the file is removed. */
static inline qkv_model *checkpoint_round_trip(qkv_ctx *ctx, qkv_model *m, const char *path, const char *key,
                                               const char *value, const char *param, const qkv_model_config *wrong,
                                               const char *field, const qkv_model_config *plain) {
    cr_assert_eq(qkv_model_save(ctx, m, path, NULL, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_str_eq(qkv_safetensors_metadata(st, key), value);
    cr_expect_not_null(qkv_safetensors_get(st, param), "the file has no %s", param);
    qkv_model *back = qkv_model_load(ctx, path);
    cr_assert_not_null(back, "%s", qkv_errmsg(ctx));
    qkv_tensor *ids = make_ids(ctx, 1, 6, qkv_model_get_config(m)->vocab, 2);
    qkv_tensor *a = qkv_model_forward(ctx, m, ids, QKV_CAUSAL), *b = qkv_model_forward(ctx, back, ids, QKV_CAUSAL);
    cr_assert(a && b, "%s", qkv_errmsg(ctx));
    cr_expect_eq(memcmp(a->data, b->data, (size_t)a->numel * qkv_dtype_size(a->dtype)), 0, "the loaded model's logits differ");
    qkv_model *other = qkv_model_new(ctx, wrong);
    cr_assert_not_null(other, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_model_restore(ctx, other, st, NULL), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), field) && strstr(qkv_errmsg(ctx), value), "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    qkv_safetensors_free(ctx, st);
    qkv_model *older = qkv_model_new(ctx, plain);
    cr_assert_eq(qkv_model_save(ctx, older, path, NULL, NULL, 0), QKV_OK, "%s", qkv_errmsg(ctx));
    st = qkv_safetensors_load(ctx, path);
    save_without_keys(ctx, st, path, key);
    qkv_safetensors_free(ctx, st);
    st = qkv_safetensors_load(ctx, path);
    cr_assert_null(qkv_safetensors_metadata(st, key));
    qkv_safetensors_free(ctx, st);
    qkv_model *old = qkv_model_load(ctx, path);
    cr_assert_not_null(old, "%s", qkv_errmsg(ctx));
    unlink(path);
    return old;
}

#endif
