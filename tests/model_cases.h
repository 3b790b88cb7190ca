/*
 * model_cases.h — what the model tests share: a small configuration and ids of a fixed pattern.
 */
#ifndef QKV_TEST_MODEL_CASES_H
#define QKV_TEST_MODEL_CASES_H

#include <criterion/criterion.h>
#include <string.h>

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

#endif
