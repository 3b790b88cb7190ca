/*
 * fuzz_common.h — what the fuzz targets share: an allocator that counts calls and live blocks, fills
 * fresh memory with a pattern (so reads of uninitialised memory change results between two runs), can
 * fail its k-th call, and refuses absurd sizes (as an embedding program's allocator would); a byte
 * reader; a 64-bit hash of everything a run observes; and FUZZ_CHECK, which stops the fuzzer on a
 * broken invariant.
 *
 * Each target defines its non-static entry qkv_fuzz_<name>(data, size) with FUZZ_TARGET(<name>). Built with
 * libFuzzer (fuzz/meson.build) LLVMFuzzerTestOneInput calls it; built with -DQKV_FUZZ_REPLAY (tests/meson.build, gcc or clang, with or
 * without sanitizers) tests/../fuzz/replay.c runs the committed corpus and every regression input through
 * it, and FUZZ_CHECK counts failures instead of aborting.
 */
#ifndef QKV_FUZZ_COMMON_H
#define QKV_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"

/* ---- invariant checks ---------------------------------------------------------------------------- */

/* A broken invariant: counted (replay) or fatal (libFuzzer, which then saves the input). */
#ifdef QKV_FUZZ_REPLAY
extern long qkv_fuzz_failures; /* defined in fuzz/replay.c */
#define FUZZ_FAILED_() (qkv_fuzz_failures++)
#else
#define FUZZ_FAILED_() abort()
#endif

#define FUZZ_CHECK(cond, ...)                                                                          \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz invariant failed at %s:%d: ", __FILE__, __LINE__);                   \
            fprintf(stderr, __VA_ARGS__);                                                              \
            fputc('\n', stderr);                                                                       \
            FUZZ_FAILED_();                                                                            \
        }                                                                                              \
    } while (0)

/* ---- entry points -------------------------------------------------------------------------------- */

/* FUZZ_TARGET(npy) { body } defines the target's entry qkv_fuzz_npy(data, size) as body and, in a
 * libFuzzer build, LLVMFuzzerTestOneInput calling it (the replay test calls qkv_fuzz_npy itself). */
#ifdef QKV_FUZZ_REPLAY
#define FUZZ_LIBFUZZER_ENTRY_(name)
#else
#define FUZZ_LIBFUZZER_ENTRY_(name)                                                                    \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);                                      \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return qkv_fuzz_##name(data, size); }
#endif

#define FUZZ_TARGET(name)                                                                              \
    int qkv_fuzz_##name(const uint8_t *data, size_t size);                                             \
    FUZZ_LIBFUZZER_ENTRY_(name)                                                                        \
    int qkv_fuzz_##name(const uint8_t *data, size_t size)

/* ---- allocator ----------------------------------------------------------------------------------- */

typedef struct fuzz_alloc {
    long calls;          /* malloc_fn calls so far                                     */
    long live;           /* blocks allocated and not yet freed                         */
    long fail_at;        /* 1-based call to fail, 0 for none                           */
    size_t limit;        /* larger requests fail (an allocator with a budget)          */
    size_t largest;      /* the largest request granted                                */
    size_t total;        /* bytes granted in all                                       */
    long refused;        /* requests over the limit                                    */
    unsigned char fill;  /* every fresh block is filled with this byte                 */
} fuzz_alloc;

static inline void *fuzz_malloc(size_t size, void *user) {
    fuzz_alloc *a = user;
    a->calls++;
    if (a->fail_at && a->calls == a->fail_at) return NULL;
    if (size > a->limit) {
        a->refused++;
        return NULL;
    }
    void *p = malloc(size);
    if (!p) return NULL;
    memset(p, a->fill, size);
    if (size > a->largest) a->largest = size;
    a->total += size;
    a->live++;
    return p;
}

static inline void fuzz_free(void *p, void *user) {
    fuzz_alloc *a = user;
    if (!p) return;
    a->live--;
    free(p);
}

/* A context on a fuzz_alloc with small arena chunks (many chunk boundaries). NULL when the context
 * allocation itself was the one made to fail. */
static inline qkv_ctx *fuzz_ctx(fuzz_alloc *a, int threads, size_t chunk) {
    qkv_options o = qkv_default_options();
    o.allocator.malloc_fn = fuzz_malloc;
    o.allocator.free_fn = fuzz_free;
    o.allocator.user = a;
    o.arena_chunk = chunk;
    o.threads = threads;
    o.seed = 12345;
    return qkv_ctx_new(&o);
}

/* ---- hashing ------------------------------------------------------------------------------------- */

static inline uint64_t fuzz_hash(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull; /* FNV-1a */
    return h;
}

static inline uint64_t fuzz_hash_u64(uint64_t h, uint64_t v) { return fuzz_hash(h, &v, sizeof v); }

/* ---- checks every target makes on a context after a call ----------------------------------------- */

/* A call returned ok (a result, or QKV_OK): the context must hold no error. It failed: the context must
 * hold a valid error code and a message. */
static inline void fuzz_check_outcome(const qkv_ctx *ctx, int ok, const char *what) {
    qkv_status s = qkv_error(ctx);
    if (ok) {
        FUZZ_CHECK(s == QKV_OK, "%s succeeded but the context holds %s: %s", what, qkv_status_name(s),
                   qkv_errmsg(ctx));
    } else {
        FUZZ_CHECK(s > QKV_OK && s < QKV_STATUS_COUNT, "%s failed with no error stored (status %d)", what,
                   (int)s);
        FUZZ_CHECK(qkv_errmsg(ctx)[0] != '\0', "%s failed with %s and an empty message", what,
                   qkv_status_name(s));
        FUZZ_CHECK(strlen(qkv_errmsg(ctx)) < 512, "%s: message not terminated", what);
    }
}

/* After a failed call and qkv_clear_error, the context works again. */
static inline void fuzz_check_usable_after_clear(qkv_ctx *ctx) {
    qkv_clear_error(ctx);
    qkv_tensor *z = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){3});
    FUZZ_CHECK(z && qkv_error(ctx) == QKV_OK && ((double *)z->data)[2] == 1.0,
               "the context does not work after qkv_clear_error: %s", qkv_errmsg(ctx));
}

/* ---- the loader targets' driver ------------------------------------------------------------------ */

/* One load of an input: a hash of what came back, the status, and the allocator calls it made. */
typedef struct fuzz_run {
    uint64_t hash;
    qkv_status status;
    long calls; /* allocator calls made by the load (the context's own included) */
} fuzz_run;

/* A loader: load(ctx, data, size) calls the library and returns what it handed back (NULL on failure);
 * check(ctx, a, handle, data, size, hash) checks the handle (NULL after a failure) and the allocations the
 * load made, folds what it read into hash, frees the handle, and returns the hash. */
typedef struct fuzz_loader {
    const char *what;
    void *(*load)(qkv_ctx *ctx, const uint8_t *data, size_t size);
    uint64_t (*check)(qkv_ctx *ctx, const fuzz_alloc *a, void *handle, const uint8_t *data, size_t size,
                      uint64_t hash);
} fuzz_loader;

/* One load in a fresh context whose allocator fails call fail_at (0: none) and fills fresh memory with the
 * byte fill: the outcome is well reported, a failed load leaves a context that works after
 * qkv_clear_error, and nothing leaks. */
static inline fuzz_run fuzz_load_once(const fuzz_loader *l, const uint8_t *data, size_t size, long fail_at,
                                      unsigned char fill) {
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
    void *handle = l->load(ctx, data, size);
    r.calls = a.calls;
    fuzz_check_outcome(ctx, handle != NULL, l->what);
    r.status = qkv_error(ctx);
    r.hash = l->check(ctx, &a, handle, data, size, fuzz_hash_u64(r.hash, (uint64_t)r.status));
    if (!handle) fuzz_check_usable_after_clear(ctx);
    qkv_ctx_free(ctx);
    FUZZ_CHECK(a.live == 0, "%ld allocations leaked", a.live);
    return r;
}

/* A loader target: the same result whatever fresh memory holds, and every allocation of a small load
 * (about 16 spread over a large one) failed in turn reports QKV_ERR_NOMEM or the clean run's own error. */
static inline int fuzz_loader_target(const fuzz_loader *l, const uint8_t *data, size_t size) {
    fuzz_run clean = fuzz_load_once(l, data, size, 0, 0x00);
    fuzz_run other = fuzz_load_once(l, data, size, 0, 0xA5);
    FUZZ_CHECK(clean.hash == other.hash && clean.status == other.status,
               "results depend on the contents of fresh memory (%s vs %s)", qkv_status_name(clean.status),
               qkv_status_name(other.status));
    for (long k = 2; k <= clean.calls; k += 1 + clean.calls / 16) {
        fuzz_run f = fuzz_load_once(l, data, size, k, 0x00);
        FUZZ_CHECK(f.status == QKV_ERR_NOMEM || (clean.status != QKV_OK && f.status == clean.status),
                   "allocation %ld of %ld failed: %s (clean run: %s)", k, clean.calls,
                   qkv_status_name(f.status), qkv_status_name(clean.status));
    }
    return 0;
}

/* A tensor handed back by the library is well formed. Returns a hash of its bytes. */
static inline uint64_t fuzz_check_tensor(const qkv_tensor *t, uint64_t h, const char *what) {
    FUZZ_CHECK(t->dtype >= QKV_F32 && t->dtype < QKV_DTYPE_COUNT, "%s: dtype %d", what, (int)t->dtype);
    FUZZ_CHECK(t->ndim >= 0 && t->ndim <= QKV_MAX_DIMS, "%s: ndim %d", what, t->ndim);
    int64_t numel = 1;
    for (int i = 0; i < QKV_MAX_DIMS; i++) {
        FUZZ_CHECK(t->shape[i] >= 0, "%s: dimension %d is %lld", what, i, (long long)t->shape[i]);
        FUZZ_CHECK(i < t->ndim || t->shape[i] == 1, "%s: unused dimension %d is %lld", what, i,
                   (long long)t->shape[i]);
        if (i < t->ndim) numel *= t->shape[i];
    }
    FUZZ_CHECK(numel == t->numel, "%s: numel %lld, shape product %lld", what, (long long)t->numel,
               (long long)numel);
    FUZZ_CHECK(((uintptr_t)t->data & 63) == 0, "%s: data not 64-byte aligned", what);
    h = fuzz_hash(h, t->shape, sizeof t->shape);
    h = fuzz_hash_u64(h, (uint64_t)t->dtype);
    return fuzz_hash(h, t->data, (size_t)t->numel * qkv_dtype_size(t->dtype)); /* reads every byte */
}

#endif
