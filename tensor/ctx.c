/*
 * ctx.c — contexts, the sticky error, the allocator hooks, the step arena and persistent blocks.
 *
 * Memory model: a step arena (a chain of chunks with a bump pointer) holds every tensor, tape node and
 * scratch buffer a step makes; qkv_step_end rewinds it. When a step needed more than one chunk, the
 * rewind replaces the chain by one chunk of the high-water size, so a later step of the same shape runs
 * in one chunk with no heap allocation. Persistent memory (parameters, their gradients, optimizer state)
 * is one block per allocation through the hooks, on a list the context frees at the end.
 *
 * With qkv_options.release_grads, inside one qkv_backward, blocks can also be given back (the gradient of
 * a node's output once the node has run, the scratch of its backward) and an allocation takes a given-back
 * block of its exact size before it bumps. Every such block was allocated in that backward, so it lies
 * after any mark taken before the backward: a rewind to such a mark releases it with the rest, and every
 * header made after the mark still has its data after it, as rewinding needs. The list is dropped when the backward returns (and
 * by every rewind and qkv_step_end), so no mark taken later can see a block it did not allocate.
 *
 * Step-tensor headers are not in the arena but in a ring of slots (qkv_ring_), reused only
 * QKV_STALE_STEPS steps later, and live persistent tensors are in a hash set of addresses: a tensor
 * pointer is recognised by its address before anything at it is read (qkv_classify_). Every block from the
 * hooks is aligned here (aligned_malloc), whatever alignment the hooks give.
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

bool qkv_mul_size_(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
bool qkv_add_size_(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

static uintptr_t align_up(uintptr_t p) { return (p + (QKV_ALIGN - 1)) & ~(uintptr_t)(QKV_ALIGN - 1); }

/* The hooks may return memory of any alignment (1, 2, 4, ...): every block qkv uses starts at the first
 * QKV_ALIGN boundary after room for the hook's pointer, which is stored just before it (memcpy, since the
 * pointer's own slot is only as aligned as the block). */
static void *aligned_malloc(const qkv_allocator *a, size_t size) {
    size_t bytes;
    if (!qkv_add_size_(size ? size : 1, QKV_ALIGN + sizeof(void *), &bytes)) return NULL;
    void *raw = a->malloc_fn(bytes, a->user);
    if (!raw) return NULL;
    unsigned char *p = (unsigned char *)align_up((uintptr_t)raw + sizeof(void *));
    memcpy(p - sizeof(void *), &raw, sizeof raw);
    return p;
}

static void aligned_free(const qkv_allocator *a, void *ptr) {
    if (!ptr) return;
    void *raw;
    memcpy(&raw, (unsigned char *)ptr - sizeof(void *), sizeof raw);
    a->free_fn(raw, a->user);
}

void *qkv_raw_malloc_(qkv_ctx *ctx, size_t size) { return aligned_malloc(&ctx->alloc, size); }

void qkv_raw_free_(qkv_ctx *ctx, void *ptr) { aligned_free(&ctx->alloc, ptr); }

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
    qkv_ctx *ctx = aligned_malloc(&o.allocator, sizeof *ctx);
    if (!ctx) return NULL;
    memset(ctx, 0, sizeof *ctx);
    ctx->alloc = o.allocator;
    ctx->threads = o.threads < 1 ? 1 : o.threads > QKV_MAX_THREADS ? QKV_MAX_THREADS : o.threads;
    ctx->arena_chunk = o.arena_chunk ? o.arena_chunk : (size_t)1 << 20;
    ctx->epoch = 1;
    ctx->grad_enabled = true;
    ctx->release_grads = o.release_grads;
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

static void free_rings(qkv_ctx *ctx, qkv_ring_ *r) {
    while (r) {
        qkv_ring_ *next = r->next;
        qkv_raw_free_(ctx, r);
        r = next;
    }
}

void qkv_ctx_free(qkv_ctx *ctx) {
    if (!ctx) return;
    if (ctx->in_custom) { /* the callback's caller still uses the context: it is freed by a later call */
        qkv_failc_(ctx, QKV_ERR_STATE, "qkv_ctx_free: called from a callback of a user-defined operator; refused");
        return;
    }
    free_chunks(ctx, ctx->arena.head);
    free_rings(ctx, ctx->ring);
    free_rings(ctx, ctx->retired);
    qkv_block_ *b = ctx->blocks;
    while (b) {
        qkv_block_ *next = b->next;
        qkv_raw_free_(ctx, b->raw);
        b = next;
    }
    qkv_raw_free_(ctx, ctx->params);
    qkv_raw_free_(ctx, ctx->live.keys);
    qkv_allocator a = ctx->alloc;
    aligned_free(&a, ctx);
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

/* The bytes an allocation of size takes: a multiple of the alignment, at least one. */
static size_t block_bytes(size_t size) {
    size_t need = (size + (QKV_ALIGN - 1)) & ~(size_t)(QKV_ALIGN - 1);
    return need ? need : QKV_ALIGN;
}

/* The newest released block of exactly need bytes, off the list; NULL when there is none. Exact sizes keep
 * this simple and lose nothing in a training step, whose gradients come in a few sizes that repeat. */
static void *take_released(qkv_arena_ *a, size_t need) {
    for (qkv_free_block_ **p = &a->free; *p; p = &(*p)->next) {
        qkv_free_block_ *b = *p;
        if (b->size != need) continue;
        *p = b->next;
        a->free_bytes -= need;
        return b;
    }
    return NULL;
}

static void *log_alloc(qkv_arena_ *a, void *p, size_t need) {
    if (a->n_log < QKV_ARENA_LOG) {
        a->log[a->n_log] = p;
        a->log_size[a->n_log] = need;
        a->n_log++;
    }
    return p;
}

void qkv_arena_reuse_(qkv_ctx *ctx, bool on) {
    qkv_arena_ *a = &ctx->arena;
    a->reuse = on;
    a->n_log = 0;
    if (!on) {
        a->free = NULL;
        a->free_bytes = 0;
    }
}

void qkv_arena_release_(qkv_ctx *ctx, void *p, size_t size) {
    qkv_arena_ *a = &ctx->arena;
    if (!a->reuse || !p) return;
    qkv_free_block_ *b = p;
    b->size = block_bytes(size);
    b->next = a->free;
    a->free = b;
    a->free_bytes += b->size;
}

void *qkv_arena_alloc_(qkv_ctx *ctx, const char *fn, size_t size) {
    qkv_arena_ *a = &ctx->arena;
    size_t need;
    if (!qkv_add_size_(size, QKV_ALIGN - 1, &need))
        return qkv_fail_(ctx, QKV_ERR_OVERFLOW, "%s: %zu bytes overflow the arena", fn, size);
    need = block_bytes(size); /* keep every block a multiple of the alignment */
    if (a->reuse) {
        void *p = take_released(a, need);
        if (p) return log_alloc(a, p, need);
    }
    for (;;) {
        if (a->current && a->current->capacity - a->offset >= need) {
            void *p = a->current->data + a->offset;
            a->offset += need;
            size_t used = a->used_before + a->offset;
            if (used > a->high_water) a->high_water = used;
            return a->reuse ? log_alloc(a, p, need) : p;
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

/* ---- step-tensor header rings (see qkv_ring_ in qkv_internal.h) ------------------------------------ */

static qkv_ring_ *new_ring(qkv_ctx *ctx, size_t capacity) {
    size_t bytes;
    if (!qkv_mul_size_(capacity, sizeof(qkv_tensor), &bytes) || !qkv_add_size_(bytes, sizeof(qkv_ring_), &bytes))
        return NULL;
    qkv_ring_ *r = qkv_raw_malloc_(ctx, bytes);
    if (!r) return NULL;
    memset(r, 0, bytes); /* every slot's magic_ is 0: free */
    r->slots = (qkv_tensor *)(r + 1);
    r->capacity = capacity;
    return r;
}

static bool ring_full_size(const qkv_ring_ *r) {
    return r->capacity >= QKV_STALE_RING_BYTES / sizeof(qkv_tensor);
}

/* A slot can be given again when its tensor was released within its step (magic_ cleared), or was made
 * more than QKV_STALE_STEPS steps ago, or, once the ring is full-sized, before the previous step (so the
 * step right after a tensor's always catches it). */
static bool slot_is_free(const qkv_ctx *ctx, const qkv_ring_ *r, const qkv_tensor *t) {
    if (t->magic_ != QKV_TENSOR_MAGIC) return true;
    uint32_t age = ctx->epoch - t->epoch_;
    return age > QKV_STALE_STEPS || (age > 1 && ring_full_size(r));
}

static void retire_ring(qkv_ctx *ctx) {
    qkv_ring_ *r = ctx->ring;
    if (!r) return;
    r->end_pos = ctx->ring_pos;
    r->next = ctx->retired;
    ctx->retired = r;
    ctx->ring = NULL;
    ctx->ring_pos = 0;
}

qkv_tensor *qkv_step_header_(qkv_ctx *ctx, const char *fn) {
    qkv_ring_ *r = ctx->ring;
    const size_t keep = QKV_STALE_STEPS + 1; /* this step and the QKV_STALE_STEPS before it */
    if (!r || !slot_is_free(ctx, r, &r->slots[ctx->ring_pos]) ||
        (!ring_full_size(r) && (ctx->step_slots + 1) > r->capacity / keep)) {
        /* The ring must hold QKV_STALE_STEPS + 1 steps like this one (up to its full size), and it grows
         * here, in the step, so a failure is reported and qkv_step_end never allocates: twice what this
         * step has taken so far, times the steps kept; when full-sized, only if this step filled it. The
         * old ring is kept, retired, until its tensors are QKV_STALE_STEPS steps old. */
        size_t cap = SIZE_MAX, full = QKV_STALE_RING_BYTES / sizeof(qkv_tensor);
        if (ctx->step_slots + 1 <= SIZE_MAX / (2 * keep)) cap = 2 * keep * (ctx->step_slots + 1);
        if (cap > full) cap = full;
        if (cap < QKV_RING_MIN_SLOTS) cap = QKV_RING_MIN_SLOTS;
        if (r && cap <= r->capacity) cap = r->capacity <= SIZE_MAX / 2 ? 2 * r->capacity : 0;
        qkv_ring_ *grown = cap ? new_ring(ctx, cap) : NULL;
        if (!grown)
            return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: out of memory for %zu tensor headers", fn, cap);
        retire_ring(ctx);
        ctx->ring = r = grown;
    }
    qkv_tensor *t = &r->slots[ctx->ring_pos];
    ctx->ring_pos = ctx->ring_pos + 1 == r->capacity ? 0 : ctx->ring_pos + 1;
    if (r->last_epoch != ctx->epoch) {
        r->last_epoch = ctx->epoch;
        r->taken = 0;
    }
    r->taken++;
    ctx->step_slots++;
    t->magic_ = 0;
    return t;
}

/* ---- live persistent tensors --------------------------------------------------------------------- */

static size_t live_home(uintptr_t key, size_t capacity) {
    uint64_t h = (uint64_t)(key >> 6) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 29) & (capacity - 1);
}

static size_t live_find(const qkv_live_set_ *s, const void *t) {
    if (!s->capacity) return SIZE_MAX;
    uintptr_t key = (uintptr_t)t;
    for (size_t i = live_home(key, s->capacity);; i = (i + 1) & (s->capacity - 1)) {
        if (!s->keys[i]) return SIZE_MAX;
        if ((s->keys[i] & ~QKV_LIVE_GRAD) == key) return i;
    }
}

static void live_insert(qkv_live_set_ *s, uintptr_t key) {
    size_t i = live_home(key & ~QKV_LIVE_GRAD, s->capacity);
    while (s->keys[i]) i = (i + 1) & (s->capacity - 1);
    s->keys[i] = key;
    s->count++;
}

bool qkv_live_reserve_(qkv_ctx *ctx, const char *fn) {
    qkv_live_set_ *s = &ctx->live;
    if (2 * (s->count + 1) <= s->capacity) return true; /* at most half full */
    size_t cap = s->capacity ? 2 * s->capacity : 64;
    uintptr_t *keys = qkv_raw_malloc_(ctx, cap * sizeof *keys);
    if (!keys) return qkv_fail_(ctx, QKV_ERR_NOMEM, "%s: out of memory for the set of live tensors", fn), false;
    memset(keys, 0, cap * sizeof *keys);
    qkv_live_set_ grown = {keys, cap, 0};
    for (size_t i = 0; i < s->capacity; i++)
        if (s->keys[i]) live_insert(&grown, s->keys[i]);
    qkv_raw_free_(ctx, s->keys);
    *s = grown;
    return true;
}

void qkv_live_trim_(qkv_ctx *ctx) {
    qkv_live_set_ *s = &ctx->live;
    if (s->count) return;
    qkv_raw_free_(ctx, s->keys);
    s->keys = NULL;
    s->capacity = 0;
}

void qkv_live_add_(qkv_ctx *ctx, const qkv_tensor *t, uintptr_t flags) {
    live_insert(&ctx->live, (uintptr_t)t | flags);
}

void qkv_live_remove_(qkv_ctx *ctx, const void *t) {
    qkv_live_set_ *s = &ctx->live;
    size_t i = live_find(s, t);
    if (i == SIZE_MAX) return;
    size_t mask = s->capacity - 1;
    s->keys[i] = 0;
    if (--s->count == 0) {
        qkv_live_trim_(ctx);
        return;
    }
    /* backward shift: move up each later entry of the run that may sit in the hole */
    for (size_t j = (i + 1) & mask; s->keys[j]; j = (j + 1) & mask) {
        size_t home = live_home(s->keys[j] & ~QKV_LIVE_GRAD, s->capacity);
        if (((j - i) & mask) <= ((j - home) & mask)) {
            s->keys[i] = s->keys[j];
            s->keys[j] = 0;
            i = j;
        }
    }
}

/* ---- freed persistent tensors (see qkv_freed_ in qkv_internal.h) --------------------------------- */

void qkv_free_persistent_tensor_(qkv_ctx *ctx, qkv_tensor *t, bool hold) {
    qkv_freed_ *f = &ctx->freed;
    qkv_tensor *grad = t->grad;
    if (!hold) { /* both leave the set of live tensors */
        if (grad) qkv_persistent_free_(ctx, grad);
        qkv_persistent_free_(ctx, t);
        return;
    }
    qkv_live_remove_(ctx, t);
    if (grad) qkv_live_remove_(ctx, grad);
    unsigned i = f->next;
    if (f->count == QKV_FREED_KEPT) { /* the oldest leaves: its memory goes back to the allocator now */
        qkv_persistent_free_(ctx, (void *)f->grad[i]);
        qkv_persistent_free_(ctx, (void *)f->tensor[i]);
    } else {
        f->count++;
    }
    f->tensor[i] = t;
    f->grad[i] = grad;
    f->next = (i + 1) % QKV_FREED_KEPT;
}

/* t is, by its address, one of the freed tensors still held (or the gradient of one). */
static bool is_freed(const qkv_ctx *ctx, const qkv_tensor *t) {
    const qkv_freed_ *f = &ctx->freed;
    for (unsigned i = 0; i < f->count; i++)
        if (f->tensor[i] == t || (f->grad[i] && f->grad[i] == t)) return true;
    return false;
}

/* ---- what a pointer is, from its address ------------------------------------------------------- */

/* t inside r: at a slot boundary, then (the slot is ours and allocated) its header says what it is. */
static bool ring_kind(const qkv_ctx *ctx, const qkv_ring_ *r, const qkv_tensor *t, qkv_handle_kind_ *kind,
                      uint32_t *made_in) {
    uintptr_t off = (uintptr_t)t - (uintptr_t)r->slots;
    if (off >= r->capacity * sizeof(qkv_tensor)) return false;
    if (off % sizeof(qkv_tensor) != 0 || t->magic_ != QKV_TENSOR_MAGIC) *kind = QKV_HANDLE_UNKNOWN_;
    else if (t->epoch_ == ctx->epoch) *kind = QKV_HANDLE_STEP_;
    else *kind = QKV_HANDLE_STALE_, *made_in = t->epoch_;
    return true;
}

qkv_handle_kind_ qkv_classify_(const qkv_ctx *ctx, const qkv_tensor *t, uint32_t *made_in) {
    qkv_handle_kind_ kind;
    if (ctx->ring && ring_kind(ctx, ctx->ring, t, &kind, made_in)) return kind;
    size_t i = live_find(&ctx->live, t);
    if (i != SIZE_MAX) return ctx->live.keys[i] & QKV_LIVE_GRAD ? QKV_HANDLE_GRAD_ : QKV_HANDLE_PERSISTENT_;
    for (const qkv_ring_ *r = ctx->retired; r; r = r->next)
        if (ring_kind(ctx, r, t, &kind, made_in)) return kind;
    if (is_freed(ctx, t)) return QKV_HANDLE_FREED_;
    return QKV_HANDLE_UNKNOWN_;
}

bool qkv_handle_fail_(qkv_ctx *ctx, const char *fn, const char *name, qkv_handle_kind_ kind, uint32_t made_in) {
    if (kind == QKV_HANDLE_STALE_)
        return qkv_fail_(ctx, QKV_ERR_STALE,
                         "%s: %s was made in step %u and used in step %u, after qkv_step_end released it (keep "
                         "it with qkv_keep or qkv_param)",
                         fn, name, (unsigned)made_in, (unsigned)ctx->epoch),
               false;
    if (kind == QKV_HANDLE_FREED_)
        return qkv_fail_(ctx, QKV_ERR_ARG,
                         "%s: %s is not a live tensor of this context: it was freed with qkv_free (or is the "
                         "gradient of a tensor freed with qkv_free)",
                         fn, name),
               false;
    return qkv_fail_(ctx, QKV_ERR_ARG,
                     "%s: %s is not a live tensor of this context (made by another context, freed with "
                     "qkv_free, or a step tensor from more than %u steps ago)",
                     fn, name, QKV_STALE_STEPS),
           false;
}

/* ---- marks --------------------------------------------------------------------------------------- */

qkv_mark_ qkv_mark_now_(const qkv_ctx *ctx) {
    qkv_mark_ m;
    m.chunk = ctx->arena.current;
    m.offset = ctx->arena.offset;
    m.used_before = ctx->arena.used_before;
    m.tape = ctx->tape;
    m.tape_consumed = ctx->tape_consumed;
    return m;
}

/* True when p lies in the arena space that rewinding to m releases: the rest of m's chunk and the chunks
 * after it up to the current one. */
static bool released_by(const qkv_ctx *ctx, qkv_mark_ m, const void *p) {
    const unsigned char *q = p;
    if (!m.chunk) return true;
    if (q >= m.chunk->data + m.offset && q < m.chunk->data + m.chunk->capacity) return true;
    const qkv_chunk_ *stop = ctx->arena.current ? ctx->arena.current->next : NULL;
    for (const qkv_chunk_ *c = m.chunk->next; c && c != stop; c = c->next)
        if (q >= c->data && q < c->data + c->capacity) return true;
    return false;
}

/* Headers are taken in the order their data is allocated, so the step tensors made after a mark are the
 * newest slots of this step: walk back over them (current ring, then rings retired in this step) while
 * their data lies in the released space, clearing each, so its slot is given again and a pointer to it
 * reads as no tensor. */
static void release_headers(qkv_ctx *ctx, qkv_mark_ m) {
    for (qkv_ring_ *r = ctx->ring, *next; r && ctx->step_slots; r = next) {
        bool current = r == ctx->ring;
        next = current ? ctx->retired : r->next;
        if (r->last_epoch != ctx->epoch) return;
        size_t *end = current ? &ctx->ring_pos : &r->end_pos;
        while (r->taken) {
            size_t i = (*end ? *end : r->capacity) - 1;
            qkv_tensor *t = &r->slots[i];
            if (!released_by(ctx, m, t->data)) return;
            t->magic_ = 0;
            *end = i;
            r->taken--;
            ctx->step_slots--;
        }
    }
}

void qkv_rewind_to_(qkv_ctx *ctx, qkv_mark_ m) {
    release_headers(ctx, m);
    qkv_arena_reuse_(ctx, false); /* released blocks may lie in the rewound space */
    ctx->arena.current = m.chunk;
    ctx->arena.offset = m.offset;
    ctx->arena.used_before = m.used_before;
    ctx->tape = m.tape;
    ctx->tape_consumed = m.tape_consumed;
}

void qkv_step_end(qkv_ctx *ctx) {
    if (!ctx) return;
    if (ctx->in_custom) { /* the callback's caller stands on this step's arena and tape */
        qkv_failc_(ctx, QKV_ERR_STATE, "qkv_step_end: called from a callback of a user-defined operator; refused");
        return;
    }
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
    qkv_arena_reuse_(ctx, false);
    ctx->tape = NULL;
    ctx->tape_consumed = false;
    ctx->lent_dloss = NULL;
    ctx->lent_to = NULL;
    ctx->step_slots = 0;
    ctx->epoch++;
    if (ctx->epoch == 0) ctx->epoch = 1; /* 0 marks persistent tensors */
    /* a retired ring goes once its newest tensor is more than QKV_STALE_STEPS steps old */
    for (qkv_ring_ **p = &ctx->retired; *p;) {
        qkv_ring_ *r = *p;
        if ((uint32_t)(ctx->epoch - r->last_epoch) > QKV_STALE_STEPS) {
            *p = r->next;
            qkv_raw_free_(ctx, r);
        } else {
            p = &r->next;
        }
    }
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
    qkv_live_remove_(ctx, ptr); /* a tensor freed by any path is no longer live */
    qkv_block_ *b = (qkv_block_ *)((uintptr_t)ptr - sizeof(qkv_block_));
    if (b->prev) b->prev->next = b->next;
    else ctx->blocks = b->next;
    if (b->next) b->next->prev = b->prev;
    qkv_raw_free_(ctx, b->raw);
}
