/*
 * ctx.c — contexts, the sticky error, the allocator hooks, the step arena and persistent blocks.
 *
 * Memory model: a step arena (a chain of chunks with a bump pointer) holds every tensor, tape node and
 * scratch buffer a step makes; qkv_step_end rewinds it. When a step needed more than one chunk, the
 * rewind replaces the chain by one chunk of the high-water size, so a later step of the same shape runs
 * in one chunk with no heap allocation. Persistent memory (parameters, their gradients, optimizer state)
 * is one block per allocation through the hooks, on a list the context frees at the end.
 */
#include "qkv_internal.h"

#include <stdlib.h>

/* ---- errors -------------------------------------------------------------------------------------- */

static const char *const status_names[QKV_STATUS_COUNT] = {
    "QKV_OK",         "QKV_ERR_NULL",  "QKV_ERR_ARG",    "QKV_ERR_DTYPE",    "QKV_ERR_SHAPE",
    "QKV_ERR_RANK",   "QKV_ERR_OVERFLOW", "QKV_ERR_NOMEM", "QKV_ERR_STALE",  "QKV_ERR_STATE",
    "QKV_ERR_IO",     "QKV_ERR_FORMAT", "QKV_ERR_NUMERIC",
};

const char *qkv_status_name(qkv_status status) {
    if ((int)status < 0 || status >= QKV_STATUS_COUNT) return "QKV_ERR_UNKNOWN";
    return status_names[status];
}

qkv_status qkv_error(const qkv_ctx *ctx) { return ctx ? ctx->status : QKV_ERR_NULL; }

const char *qkv_errmsg(const qkv_ctx *ctx) { return ctx ? ctx->errmsg : "no context"; }

void qkv_clear_error(qkv_ctx *ctx) {
    if (!ctx) return;
    ctx->status = QKV_OK;
    ctx->errmsg[0] = '\0';
}

static void store_error(qkv_ctx *ctx, qkv_status status, const char *fmt, va_list ap) {
    if (!ctx || ctx->status != QKV_OK) return; /* the first error is the one that explains the rest */
    ctx->status = status;
    vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
}

void *qkv_fail_(qkv_ctx *ctx, qkv_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    store_error(ctx, status, fmt, ap);
    va_end(ap);
    return NULL;
}

qkv_status qkv_failc_(qkv_ctx *ctx, qkv_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    store_error(ctx, status, fmt, ap);
    va_end(ap);
    return ctx ? ctx->status : status;
}

/* ---- allocator hooks ----------------------------------------------------------------------------- */

static void *default_malloc(size_t size, void *user) {
    (void)user;
    return malloc(size);
}

static void default_free(void *ptr, void *user) {
    (void)user;
    free(ptr);
}

void *qkv_raw_malloc_(qkv_ctx *ctx, size_t size) {
    return ctx->alloc.malloc_fn(size ? size : 1, ctx->alloc.user);
}

void qkv_raw_free_(qkv_ctx *ctx, void *ptr) {
    if (ptr) ctx->alloc.free_fn(ptr, ctx->alloc.user);
}

bool qkv_mul_size_(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
bool qkv_add_size_(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

static uintptr_t align_up(uintptr_t p) { return (p + (QKV_ALIGN - 1)) & ~(uintptr_t)(QKV_ALIGN - 1); }

/* ---- contexts ------------------------------------------------------------------------------------ */

qkv_options qkv_default_options(void) {
    qkv_options o;
    memset(&o, 0, sizeof o);
    o.threads = 1;
    return o;
}

qkv_ctx *qkv_ctx_new(const qkv_options *options) {
    qkv_options o = options ? *options : qkv_default_options();
    if (!o.allocator.malloc_fn || !o.allocator.free_fn) {
        o.allocator.malloc_fn = default_malloc;
        o.allocator.free_fn = default_free;
        o.allocator.user = NULL;
    }
    qkv_ctx *ctx = o.allocator.malloc_fn(sizeof *ctx, o.allocator.user);
    if (!ctx) return NULL;
    memset(ctx, 0, sizeof *ctx);
    ctx->alloc = o.allocator;
    ctx->threads = o.threads < 1 ? 1 : o.threads > QKV_MAX_THREADS ? QKV_MAX_THREADS : o.threads;
    ctx->arena_chunk = o.arena_chunk ? o.arena_chunk : (size_t)1 << 20;
    ctx->epoch = 1;
    ctx->grad_enabled = true;
    qkv_rng_seed_(ctx->rng, o.seed);
    return ctx;
}

static void free_chunks(qkv_ctx *ctx, qkv_chunk_ *c) {
    while (c) {
        qkv_chunk_ *next = c->next;
        qkv_raw_free_(ctx, c);
        c = next;
    }
}

void qkv_ctx_free(qkv_ctx *ctx) {
    if (!ctx) return;
    free_chunks(ctx, ctx->arena.head);
    qkv_block_ *b = ctx->blocks;
    while (b) {
        qkv_block_ *next = b->next;
        qkv_raw_free_(ctx, b->raw);
        b = next;
    }
    qkv_raw_free_(ctx, ctx->params);
    ctx->alloc.free_fn(ctx, ctx->alloc.user);
}

int qkv_threads(const qkv_ctx *ctx) { return ctx ? ctx->threads : 1; }

void qkv_seed(qkv_ctx *ctx, uint64_t seed) {
    if (ctx) qkv_rng_seed_(ctx->rng, seed);
}

/* ---- step arena ---------------------------------------------------------------------------------- */

static qkv_chunk_ *new_chunk(qkv_ctx *ctx, size_t capacity) {
    size_t bytes;
    if (!qkv_add_size_(sizeof(qkv_chunk_) + 2 * QKV_ALIGN, capacity, &bytes)) return NULL;
    qkv_chunk_ *c = qkv_raw_malloc_(ctx, bytes);
    if (!c) return NULL;
    c->next = NULL;
    c->capacity = capacity;
    c->data = (unsigned char *)align_up((uintptr_t)(c + 1));
    return c;
}

void *qkv_arena_alloc_(qkv_ctx *ctx, const char *fn, size_t size) {
    qkv_arena_ *a = &ctx->arena;
    size_t need;
    if (!qkv_add_size_(size, QKV_ALIGN - 1, &need))
        return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: %zu bytes overflow the arena", fn, size);
    need &= ~(size_t)(QKV_ALIGN - 1); /* keep every block a multiple of the alignment */
    if (need == 0) need = QKV_ALIGN;
    for (;;) {
        if (a->current && a->current->capacity - a->offset >= need) {
            void *p = a->current->data + a->offset;
            a->offset += need;
            size_t used = a->used_before + a->offset;
            if (used > a->high_water) a->high_water = used;
            return p;
        }
        /* move to the next chunk, reusing one kept from an earlier step when it is large enough */
        qkv_chunk_ *next = a->current ? a->current->next : a->head;
        if (next && next->capacity >= need) {
            if (a->current) a->used_before += a->offset;
            a->current = next;
            a->offset = 0;
            continue;
        }
        size_t cap = ctx->arena_chunk;
        if (a->current && a->current->capacity > cap) cap = a->current->capacity;
        if (cap < need) cap = need;
        qkv_chunk_ *c = new_chunk(ctx, cap);
        if (!c)
            return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: out of memory growing the step arena by %zu bytes",
                             fn, cap);
        /* insert after current; chunks after it that were too small stay behind it for later steps */
        if (a->current) {
            c->next = a->current->next;
            a->current->next = c;
            a->used_before += a->offset;
        } else {
            c->next = a->head;
            a->head = c;
        }
        a->current = c;
        a->offset = 0;
    }
}

void *qkv_arena_array_(qkv_ctx *ctx, const char *fn, size_t count, size_t elem_size) {
    size_t bytes;
    if (!qkv_mul_size_(count, elem_size, &bytes))
        return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: %zu elements of %zu bytes overflow size_t", fn,
                         count, elem_size);
    return qkv_arena_alloc_(ctx, fn, bytes);
}

qkv_mark_ qkv_mark_now_(const qkv_ctx *ctx) {
    qkv_mark_ m;
    m.chunk = ctx->arena.current;
    m.offset = ctx->arena.offset;
    m.used_before = ctx->arena.used_before;
    m.tape = ctx->tape;
    m.tape_consumed = ctx->tape_consumed;
    return m;
}

void qkv_rewind_to_(qkv_ctx *ctx, qkv_mark_ m) {
    ctx->arena.current = m.chunk;
    ctx->arena.offset = m.offset;
    ctx->arena.used_before = m.used_before;
    ctx->tape = m.tape;
    ctx->tape_consumed = m.tape_consumed;
}

void qkv_step_end(qkv_ctx *ctx) {
    if (!ctx) return;
    qkv_arena_ *a = &ctx->arena;
    /* More than one chunk: replace them by one of the high-water size, so the next step fits. */
    if (a->head && a->head->next) {
        size_t cap = a->high_water;
        qkv_chunk_ *one = new_chunk(ctx, cap);
        if (one) { /* if this allocation fails the old chain is kept, which is just as correct */
            free_chunks(ctx, a->head);
            a->head = one;
        }
    }
    a->current = a->head;
    a->offset = 0;
    a->used_before = 0;
    a->high_water = 0;
    ctx->tape = NULL;
    ctx->tape_consumed = false;
    ctx->epoch++;
    if (ctx->epoch == 0) ctx->epoch = 1; /* 0 marks persistent tensors */
}

size_t qkv_arena_used(const qkv_ctx *ctx) {
    return ctx ? ctx->arena.used_before + ctx->arena.offset : 0;
}

size_t qkv_arena_capacity(const qkv_ctx *ctx) {
    size_t total = 0;
    if (!ctx) return 0;
    for (const qkv_chunk_ *c = ctx->arena.head; c; c = c->next) total += c->capacity;
    return total;
}

/* ---- persistent blocks --------------------------------------------------------------------------- */

void *qkv_persistent_alloc_(qkv_ctx *ctx, const char *fn, size_t size) {
    size_t bytes;
    if (!qkv_add_size_(size, sizeof(qkv_block_) + 2 * QKV_ALIGN, &bytes))
        return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: %zu bytes overflow size_t", fn, size);
    void *raw = qkv_raw_malloc_(ctx, bytes);
    if (!raw) return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: out of memory allocating %zu bytes", fn, size);
    /* layout: raw ... [qkv_block_][pad to 64][user data]; the block header sits just before the data */
    uintptr_t data = align_up((uintptr_t)raw + sizeof(qkv_block_));
    qkv_block_ *b = (qkv_block_ *)(data - sizeof(qkv_block_));
    b->raw = raw;
    b->prev = NULL;
    b->next = ctx->blocks;
    if (ctx->blocks) ctx->blocks->prev = b;
    ctx->blocks = b;
    return (void *)data;
}

void qkv_persistent_free_(qkv_ctx *ctx, void *ptr) {
    if (!ptr) return;
    qkv_block_ *b = (qkv_block_ *)((uintptr_t)ptr - sizeof(qkv_block_));
    if (b->prev) b->prev->next = b->next;
    else ctx->blocks = b->next;
    if (b->next) b->next->prev = b->prev;
    qkv_raw_free_(ctx, b->raw);
}
