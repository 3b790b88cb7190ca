/*
 * fuzz_npy.c — libFuzzer target for qkv_npy_load_mem: the input is the bytes of a would-be .npy file.
 *
 * For every input: the loader never crashes, and either returns a well-formed tensor whose bytes are the
 * input's last numel * itemsize bytes, or stores an error code and a message; it never allocates much
 * more than the input (a header cannot make it reserve memory the data does not back); it leaves nothing
 * allocated once the context is freed; two runs whose allocator fills fresh memory with different bytes
 * see the same result (no read of uninitialised memory); failing each of its allocations in turn gives
 * QKV_ERR_NOMEM (or the clean run's own error), and the context works again after qkv_clear_error.
 */
#include "fuzz_common.h"

static fuzz_run load_once(const uint8_t *data, size_t size, long fail_at, unsigned char fill) {
    fuzz_run r = {0xcbf29ce484222325ull, QKV_OK, 0};
    fuzz_alloc a = {0};
    a.fail_at = fail_at;
    a.limit = (size_t)1 << 30;
    a.fill = fill;
    qkv_ctx *ctx = fuzz_ctx(&a, 1, 4096);
    if (!ctx) {
        FUZZ_CHECK(fail_at == 1, "qkv_ctx_new failed without an injected failure");
        r.status = QKV_ERR_NOMEM;
        r.calls = a.calls;
        return r;
    }
    qkv_tensor *t = qkv_npy_load_mem(ctx, data, size);
    r.calls = a.calls;
    fuzz_check_outcome(ctx, t != NULL, "qkv_npy_load_mem");
    r.status = qkv_error(ctx);
    r.hash = fuzz_hash_u64(r.hash, (uint64_t)r.status);
    if (t) {
        r.hash = fuzz_check_tensor(t, r.hash, "qkv_npy_load_mem");
        FUZZ_CHECK(t->epoch_ != 0, "a loaded tensor is a step tensor");
        FUZZ_CHECK(!t->requires_grad && !t->grad, "a loaded tensor is a plain leaf");
        size_t nb = (size_t)t->numel * qkv_dtype_size(t->dtype);
        FUZZ_CHECK(nb <= size && memcmp(t->data, data + size - nb, nb) == 0,
                   "the tensor's %zu bytes are not the input's last bytes", nb);
    }
    /* the arena grows by at most what the data needs (plus a header and a chunk) */
    FUZZ_CHECK(a.largest <= size + 8192, "a %zu-byte input made a %zu-byte allocation", size, a.largest);
    if (!t) {
        fuzz_check_usable_after_clear(ctx);
    }
    qkv_ctx_free(ctx);
    FUZZ_CHECK(a.live == 0, "%ld allocations leaked", a.live);
    return r;
}

int qkv_fuzz_npy(const uint8_t *data, size_t size);
int qkv_fuzz_npy(const uint8_t *data, size_t size) { return fuzz_loader_target(load_once, data, size); }

#ifndef QKV_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return qkv_fuzz_npy(data, size); }
#endif
