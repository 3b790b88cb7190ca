/*
 * fuzz_safetensors.c — libFuzzer target for qkv_safetensors_load_mem: the input is the bytes of a would-be
 * safetensors checkpoint.
 *
 * For every input: no crash; either a handle whose names are distinct, sorted and found again by
 * qkv_safetensors_get, whose tensors are well formed and copy into a tensor of their shape, and whose
 * metadata keys are sorted and found again, or an error code with a message; allocation stays within a
 * small multiple of the input; nothing is left allocated; fresh memory's contents do not change the result;
 * failing each allocation in turn gives QKV_ERR_NOMEM (or the clean run's own error) and leaks nothing.
 */
#include "fuzz_common.h"

/* Entry s, i of the n of a list that must be sorted and free of repeats (names, metadata keys): not NULL,
 * and after *prev, which becomes s. Returns whether s is there to read. */
static bool sorted_entry(const char **prev, const char *s, int i, int n, const char *what) {
    FUZZ_CHECK(s != NULL, "%s %d of %d is NULL", what, i, n);
    if (!s) return false;
    FUZZ_CHECK(!*prev || strcmp(*prev, s) < 0, "%ss out of order or repeated at %d", what, i);
    *prev = s;
    return true;
}

static uint64_t check_handle(qkv_ctx *ctx, const qkv_safetensors *st, uint64_t h) {
    int n = qkv_safetensors_count(st);
    FUZZ_CHECK(n >= 0, "count %d", n);
    h = fuzz_hash_u64(h, (uint64_t)n);
    const char *prev = NULL;
    for (int i = 0; i < n; i++) {
        const char *name = qkv_safetensors_name(st, i);
        if (!sorted_entry(&prev, name, i, n, "name")) continue;
        h = fuzz_hash(h, name, strlen(name) + 1);
        const qkv_tensor *t = qkv_safetensors_get(st, name);
        FUZZ_CHECK(t != NULL, "tensor '%s' not found by name", name);
        if (!t) continue;
        h = fuzz_check_tensor(t, h, "a loaded checkpoint tensor");
        FUZZ_CHECK(t->epoch_ == 0, "checkpoint tensors are persistent");
        qkv_tensor *dst = qkv_zeros(ctx, t->dtype, t->ndim, t->shape);
        if (dst) {
            qkv_status s = qkv_safetensors_copy_into(ctx, st, name, dst);
            fuzz_check_outcome(ctx, s == QKV_OK, "qkv_safetensors_copy_into");
            FUZZ_CHECK(s != QKV_OK ||
                           memcmp(dst->data, t->data, (size_t)t->numel * qkv_dtype_size(t->dtype)) == 0,
                       "copy_into changed the bytes of '%s'", name);
        }
        qkv_clear_error(ctx); /* a copy may fail for want of memory: not what this checks */
    }
    FUZZ_CHECK(qkv_safetensors_name(st, n) == NULL && qkv_safetensors_name(st, -1) == NULL,
               "out-of-range names are NULL");
    int m = qkv_safetensors_metadata_count(st);
    FUZZ_CHECK(m >= 0, "metadata count %d", m);
    prev = NULL;
    for (int i = 0; i < m; i++) {
        const char *key = qkv_safetensors_metadata_key(st, i);
        if (!sorted_entry(&prev, key, i, m, "key")) continue;
        const char *value = qkv_safetensors_metadata(st, key);
        FUZZ_CHECK(value != NULL, "key '%s' not found again", key);
        h = fuzz_hash(h, key, strlen(key) + 1);
        if (value) h = fuzz_hash(h, value, strlen(value) + 1);
    }
    return h;
}

static void *load(qkv_ctx *ctx, const uint8_t *data, size_t size) {
    return qkv_safetensors_load_mem(ctx, data, size);
}

static uint64_t check(qkv_ctx *ctx, const fuzz_alloc *a, void *handle, const uint8_t *data, size_t size,
                      uint64_t h) {
    (void)data;
    FUZZ_CHECK(a->total <= 8 * size + 65536, "a %zu-byte input made %zu bytes of allocations", size, a->total);
    if (handle) {
        h = check_handle(ctx, handle, h);
        qkv_safetensors_free(ctx, handle);
    }
    return h;
}

static const fuzz_loader safetensors_loader = {"qkv_safetensors_load_mem", load, check};

FUZZ_TARGET(safetensors) { return fuzz_loader_target(&safetensors_loader, data, size); }
