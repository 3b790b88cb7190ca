/*
 * fuzz_npy.c — libFuzzer target for qkv_npy_load_mem: the input is the bytes of a would-be .npy file.
 *
 * For every input: the loader never crashes, and either returns a well-formed tensor whose bytes are the
 * input's last numel * itemsize bytes (or, for '<i8' loaded as i32, whose values are the input's last
 * numel int64 values), or stores an error code and a message; it never allocates much
 * more than the input (a header cannot make it reserve memory the data does not back); it leaves nothing
 * allocated once the context is freed; two runs whose allocator fills fresh memory with different bytes
 * see the same result (no read of uninitialised memory); failing each of its allocations in turn gives
 * QKV_ERR_NOMEM (or the clean run's own error), and the context works again after qkv_clear_error.
 */
#include "fuzz_common.h"

static void *load(qkv_ctx *ctx, const uint8_t *data, size_t size) { return qkv_npy_load_mem(ctx, data, size); }

static uint64_t check(qkv_ctx *ctx, const fuzz_alloc *a, void *handle, const uint8_t *data, size_t size,
                      uint64_t h) {
    (void)ctx;
    const qkv_tensor *t = handle;
    if (t) {
        h = fuzz_check_tensor(t, h, "qkv_npy_load_mem");
        FUZZ_CHECK(t->epoch_ != 0, "a loaded tensor is a step tensor");
        FUZZ_CHECK(!t->requires_grad && !t->grad, "a loaded tensor is a plain leaf");
        size_t nb = (size_t)t->numel * qkv_dtype_size(t->dtype), n8 = (size_t)t->numel * 8;
        bool same = nb <= size && memcmp(t->data, data + size - nb, nb) == 0;
        /* or '<i8' loaded as i32: the input's last numel int64 values, each equal to its i32 */
        bool narrowed = !same && t->dtype == QKV_I32 && n8 <= size;
        for (size_t i = 0; narrowed && i < (size_t)t->numel; i++) {
            uint64_t u = 0;
            for (int k = 7; k >= 0; k--) u = u << 8 | data[size - n8 + 8 * i + (size_t)k];
            narrowed = (int64_t)u == (int64_t)qkv_i32(t)[i];
        }
        FUZZ_CHECK(same || narrowed, "the tensor's %zu bytes are not the input's last bytes (nor its last "
                                     "int64 values narrowed)", nb);
    }
    /* the arena grows by at most what the data needs (plus a header and a chunk) */
    FUZZ_CHECK(a->largest <= size + 8192, "a %zu-byte input made a %zu-byte allocation", size, a->largest);
    return h; /* a step tensor: the context's end frees it */
}

static const fuzz_loader npy_loader = {"qkv_npy_load_mem", load, check};

FUZZ_TARGET(npy) { return fuzz_loader_target(&npy_loader, data, size); }
