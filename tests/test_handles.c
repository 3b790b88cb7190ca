/*
 * test_handles.c — what a tensor pointer is to a context, and that finding out never reads memory that
 * may have been released: stale step tensors (QKV_ERR_STALE for QKV_STALE_STEPS steps, whatever sits at
 * their old arena address), freed persistent tensors, tensors of another context, gradients owned by
 * their tensor, and allocator hooks that return misaligned memory.
 *
 * The guard allocator below never gives memory back while the test runs: free_fn makes the block's pages
 * inaccessible (PROT_NONE), so any read of released memory is a crash, in a plain build as under ASan.
 */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qkv_internal.h"
#include "test_alloc.h"

/* ---- the guard allocator: every block on its own pages, made unreadable when freed ---------------- */

typedef struct guard {
    long live;   /* blocks not yet freed                                  */
    size_t skew; /* bytes added to each returned pointer (1, 2, 4: misaligned hooks) */
    void *maps[1 << 14];
    size_t sizes[1 << 14];
    int n_maps;
} guard;

#define GUARD_PREFIX 64 /* bytes before the returned pointer: the mapping's size */

static void *guard_malloc(size_t size, void *user) {
    guard *g = user;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = (size + GUARD_PREFIX + g->skew + page - 1) / page * page;
    if (g->n_maps == (int)(sizeof g->maps / sizeof g->maps[0])) return NULL;
    unsigned char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    g->maps[g->n_maps] = p;
    g->sizes[g->n_maps++] = bytes;
    memcpy(p, &bytes, sizeof bytes);
    g->live++;
    return p + GUARD_PREFIX + g->skew;
}

static void guard_free(void *ptr, void *user) {
    guard *g = user;
    if (!ptr) return;
    unsigned char *p = (unsigned char *)ptr - GUARD_PREFIX - g->skew;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    mprotect(p, bytes, PROT_NONE); /* released: reading it now is a crash */
    g->live--;
}

static void guard_release(guard *g) {
    for (int i = 0; i < g->n_maps; i++) munmap(g->maps[i], g->sizes[i]);
    g->n_maps = 0;
}

static guard *new_guard(size_t skew) {
    guard *g = calloc(1, sizeof *g);
    g->skew = skew;
    return g;
}

static qkv_ctx *guard_ctx(guard *g, size_t chunk) {
    qkv_options o = qkv_default_options();
    o.allocator = (qkv_allocator){guard_malloc, guard_free, g};
    o.arena_chunk = chunk;
    return qkv_ctx_new(&o);
}

/* The stored error is code and contains every fragment; then cleared. */
static void expect_error(qkv_ctx *ctx, qkv_status code, const char *const *fragments, int n) {
    cr_expect_eq(qkv_error(ctx), code, "%s, want %s: %s", qkv_status_name(qkv_error(ctx)), qkv_status_name(code),
                 qkv_errmsg(ctx));
    for (int i = 0; i < n; i++)
        cr_expect(strstr(qkv_errmsg(ctx), fragments[i]) != NULL, "'%s' not in: %s", fragments[i], qkv_errmsg(ctx));
    qkv_clear_error(ctx);
}
#define EXPECT_ERROR(ctx, code, ...)                                                                    \
    expect_error(ctx, code, (const char *const[]){__VA_ARGS__},                                         \
                 (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)))

static const char *const not_live = "is not a live tensor of this context";

/* ---- released memory is never read --------------------------------------------------------------- */

Test(handles, a_stale_tensor_of_a_step_that_spilled_past_the_first_chunk_is_stale_without_a_read) {
    guard *g = new_guard(0);
    qkv_ctx *ctx = guard_ctx(g, 4096); /* a small first chunk: the step below needs several */
    qkv_tensor *kept = NULL;
    for (int i = 0; i < 8; i++) {
        qkv_tensor *t = qkv_ones(ctx, QKV_F64, 1, (int64_t[]){1000});
        if (i == 6) kept = t; /* made in a later chunk, which qkv_step_end frees */
    }
    cr_assert_not_null(kept, "%s", qkv_errmsg(ctx));
    qkv_step_end(ctx); /* the chain is replaced by one chunk: kept's chunk is unreadable now */
    cr_expect_null(qkv_sum(ctx, kept));
    EXPECT_ERROR(ctx, QKV_ERR_STALE, "qkv_sum", "made in step 1", "used in step 2");
    qkv_ctx_free(ctx);
    cr_expect_eq(g->live, 0);
    guard_release(g);
    free(g);
}

Test(handles, freed_mask_targets_and_parameter_are_refused_without_a_read) {
    guard *g = new_guard(0);
    qkv_ctx *ctx = guard_ctx(g, 0);
    qkv_tensor *mask = qkv_keep(ctx, qkv_ones(ctx, QKV_U8, 2, (int64_t[]){3, 3}));
    qkv_tensor *targets = qkv_keep(ctx, qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){3}));
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F64, 2, (int64_t[]){3, 3}));
    cr_assert(mask && targets && w, "%s", qkv_errmsg(ctx));
    qkv_step_end(ctx);
    /* w has a gradient (freed with it) */
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){3, 3});
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, x, w)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_tensor *grad = w->grad;
    cr_assert_not_null(grad);
    qkv_step_end(ctx);
    qkv_free(ctx, mask);
    qkv_free(ctx, targets);
    qkv_free(ctx, w);
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    int n;
    qkv_params(ctx, &n);
    cr_expect_eq(n, 0);

    qkv_tensor *scores = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){3, 3});
    cr_expect_null(qkv_softmax(ctx, scores, mask, 0));
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_softmax", "mask", not_live, "freed with qkv_free");
    cr_expect_null(qkv_cross_entropy(ctx, scores, targets));
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_cross_entropy", "targets", not_live);
    cr_expect_null(qkv_mul(ctx, scores, w));
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_mul", not_live);
    cr_expect_null(qkv_copy(ctx, grad), "the gradient went with its tensor");
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_copy", not_live);
    qkv_free(ctx, w); /* a second qkv_free */
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_free", not_live);
    cr_expect(isnan(qkv_get_flat(ctx, mask, 0)));
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_get_flat", not_live);
    qkv_ctx_free(ctx);
    cr_expect_eq(g->live, 0);
    guard_release(g);
    free(g);
}

Test(handles, a_parameter_freed_between_forward_and_backward_stops_the_backward_without_a_read) {
    guard *g = new_guard(0);
    qkv_ctx *ctx = guard_ctx(g, 0);
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F64, 2, (int64_t[]){3, 3}));
    qkv_tensor *mask = qkv_keep(ctx, qkv_ones(ctx, QKV_U8, 2, (int64_t[]){3, 3}));
    cr_assert(w && mask);
    qkv_step_end(ctx);
    qkv_tensor *x = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){3, 3});
    qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, x, w));
    qkv_free(ctx, w); /* the tape still names w */
    cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_ERR_ARG);
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_backward", "input 1 of qkv_mul", not_live);
    qkv_step_end(ctx);
    x = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){3, 3});
    cr_assert_eq(qkv_set_requires_grad(ctx, x, true), QKV_OK);
    loss = qkv_sum(ctx, qkv_softmax(ctx, x, mask, 0));
    cr_assert_not_null(loss, "%s", qkv_errmsg(ctx));
    qkv_free(ctx, mask); /* the softmax node keeps its own copy of the mask: the backward never reads it */
    cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    cr_expect_eq(g->live, 0);
    guard_release(g);
    free(g);
}

/* ---- use after step: reliably stale -------------------------------------------------------------- */

/* The same graph each step, as a training loop makes: before, each step's tensors sat at the previous
 * step's addresses, so a kept one read as a live tensor of the new step. */
static qkv_tensor *layout_step(qkv_ctx *ctx, qkv_tensor *w) {
    qkv_tensor *x = qkv_full(ctx, QKV_F32, 2, (int64_t[]){4, 3}, 0.5);
    qkv_tensor *y = qkv_projection(ctx, x, w, NULL);
    qkv_tensor *loss = qkv_mean(ctx, qkv_mul(ctx, y, y));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    return y;
}

Test(handles, a_tensor_kept_across_step_end_is_stale_in_every_step_of_a_repeating_loop) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 2, (int64_t[]){3, 5}));
    qkv_step_end(ctx);
    int caught = 0;
    qkv_tensor *previous = NULL;
    for (int s = 0; s < 3; s++) {
        qkv_tensor *y = layout_step(ctx, w);
        if (previous) {
            char made[32], used[32];
            snprintf(made, sizeof made, "made in step %u", ctx->epoch - 1);
            snprintf(used, sizeof used, "used in step %u", ctx->epoch);
            cr_expect_null(qkv_scale(ctx, previous, 2.0));
            caught += qkv_error(ctx) == QKV_ERR_STALE;
            EXPECT_ERROR(ctx, QKV_ERR_STALE, "qkv_scale", made, used, "qkv_step_end");
        }
        previous = y;
        qkv_step_end(ctx);
    }
    cr_expect_eq(caught, 2, "2 of 2 uses after qkv_step_end caught");
    qkv_ctx_free(ctx);
}

Test(handles, a_step_tensor_is_stale_for_qkv_stale_steps_steps_even_where_new_data_overwrote_its_address) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 2, (int64_t[]){3, 5}));
    qkv_step_end(ctx);
    uint32_t first = ctx->epoch;
    qkv_tensor *old = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){3});
    qkv_step_end(ctx);
    int caught = 0;
    for (unsigned s = 1; s <= QKV_STALE_STEPS; s++) {
        /* a zero-filled block first: it covers the address where old's header used to be in the arena */
        cr_assert_not_null(qkv_zeros(ctx, QKV_F64, 1, (int64_t[]){64}));
        layout_step(ctx, w);
        qkv_tensor *r = qkv_add(ctx, old, old);
        if (!r && qkv_error(ctx) == QKV_ERR_STALE) caught++;
        char made[32];
        snprintf(made, sizeof made, "made in step %u", first);
        EXPECT_ERROR(ctx, QKV_ERR_STALE, "qkv_add", made);
        qkv_step_end(ctx);
    }
    cr_expect_eq(caught, (int)QKV_STALE_STEPS, "%d of %u later steps caught the stale tensor", caught,
                 QKV_STALE_STEPS);
    qkv_ctx_free(ctx);
}

Test(handles, a_stale_tensor_is_caught_after_a_step_that_grew_the_header_ring_and_the_arena) {
    guard *g = new_guard(0);
    qkv_ctx *ctx = guard_ctx(g, 4096);
    qkv_tensor *first = qkv_scalar(ctx, QKV_F64, 1.0);
    for (int i = 0; i < 5000; i++) cr_assert_not_null(qkv_scalar(ctx, QKV_F64, i), "%s", qkv_errmsg(ctx));
    qkv_tensor *last = qkv_scalar(ctx, QKV_F64, 2.0);
    cr_expect_not_null(ctx->retired, "the ring grew in the step: the old one is retired, kept");
    qkv_step_end(ctx);
    cr_expect_null(qkv_copy(ctx, first));
    EXPECT_ERROR(ctx, QKV_ERR_STALE, "qkv_copy", "made in step 1");
    cr_expect_null(qkv_copy(ctx, last));
    EXPECT_ERROR(ctx, QKV_ERR_STALE, "qkv_copy", "made in step 1");
    /* after QKV_STALE_STEPS more steps the retired rings are freed: first is no longer ours, and is
     * refused by its address alone (its ring's pages are unreadable now) */
    for (unsigned s = 0; s <= QKV_STALE_STEPS; s++) qkv_step_end(ctx);
    cr_expect_null(ctx->retired);
    cr_expect_null(qkv_copy(ctx, first));
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_copy", not_live, "more than 16 steps ago");
    qkv_ctx_free(ctx);
    cr_expect_eq(g->live, 0);
    guard_release(g);
    free(g);
}

Test(handles, the_steps_after_the_first_reuse_the_header_ring_with_no_allocation_and_rewinds_release_headers) {
    counting c = {0};
    qkv_options o = qkv_default_options();
    o.allocator = counting_allocator(&c);
    qkv_ctx *ctx = qkv_ctx_new(&o);
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 2, (int64_t[]){3, 5}));
    qkv_step_end(ctx);
    layout_step(ctx, w);
    qkv_step_end(ctx);
    long calls = c.calls;
    const qkv_ring_ *ring = ctx->ring;
    for (int s = 0; s < 100; s++) { /* six times around the ring */
        layout_step(ctx, w);
        qkv_step_end(ctx);
    }
    cr_expect_eq(c.calls, calls, "%ld allocations in 100 steps", c.calls - calls);
    cr_expect_eq(ctx->ring, ring);
    /* a mark and a rewind (what qkv_gradcheck does for each element) release the headers made after it */
    qkv_tensor *before = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){2});
    qkv_mark_ mark = qkv_mark_now_(ctx);
    size_t pos = ctx->ring_pos;
    qkv_tensor *after = NULL;
    for (int i = 0; i < 1000; i++) {
        qkv_rewind_to_(ctx, mark);
        after = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){2});
        qkv_ones(ctx, QKV_F32, 1, (int64_t[]){2});
    }
    cr_expect_eq(ctx->ring, ring, "1000 rewound evaluations fit where one does");
    qkv_rewind_to_(ctx, mark);
    cr_expect_eq(ctx->ring_pos, pos);
    cr_expect_eq(c.calls, calls);
    cr_expect(isnan(qkv_get_flat(ctx, after, 0)), "made after the mark: released");
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_get_flat", not_live);
    cr_expect_eq(qkv_get_flat(ctx, before, 0), 1.0, "made before the mark: still live");
    qkv_ctx_free(ctx);
    cr_expect_eq(c.live, 0);
}

/* ---- tensors of another context, and owned gradients --------------------------------------------- */

Test(handles, tensors_of_another_context_are_refused_and_both_contexts_stay_intact) {
    counting ca = {0}, cb = {0};
    qkv_options oa = qkv_default_options(), ob = qkv_default_options();
    oa.allocator = counting_allocator(&ca);
    ob.allocator = counting_allocator(&cb);
    qkv_ctx *a = qkv_ctx_new(&oa), *b = qkv_ctx_new(&ob);
    qkv_tensor *wa = qkv_param(a, qkv_ones(a, QKV_F64, 2, (int64_t[]){2, 2}));
    qkv_tensor *wb = qkv_param(b, qkv_full(b, QKV_F64, 2, (int64_t[]){2, 2}, 3.0));
    qkv_tensor *kb = qkv_keep(b, qkv_ones(b, QKV_F64, 1, (int64_t[]){2}));
    qkv_tensor *sb = qkv_ones(b, QKV_F64, 2, (int64_t[]){2, 2}); /* a step tensor of b */
    cr_assert(wa && wb && kb && sb);

    qkv_free(a, wb);
    EXPECT_ERROR(a, QKV_ERR_ARG, "qkv_free", "tensor", not_live, "made by another context");
    qkv_free(a, kb);
    EXPECT_ERROR(a, QKV_ERR_ARG, "qkv_free", not_live);
    /* a graph in a through b's parameter, or b's step tensor: refused at the operator, so no backward
     * of a can reach (and give a gradient to) a tensor of b */
    qkv_tensor *x = qkv_ones(a, QKV_F64, 2, (int64_t[]){2, 2});
    cr_expect_null(qkv_matmul(a, x, wb, 0));
    EXPECT_ERROR(a, QKV_ERR_ARG, "qkv_matmul", not_live);
    cr_expect_null(qkv_add(a, sb, x));
    EXPECT_ERROR(a, QKV_ERR_ARG, "qkv_add", not_live);
    qkv_tensor *loss_b = qkv_sum(b, qkv_mul(b, sb, wb));
    cr_assert_not_null(loss_b);
    cr_expect_eq(qkv_backward(a, loss_b, NULL), QKV_ERR_ARG);
    EXPECT_ERROR(a, QKV_ERR_ARG, "qkv_backward", "loss", not_live);
    cr_expect_null(wb->grad, "a made no gradient for b's parameter");
    cr_expect_eq(qkv_zero_grad(a, wb), QKV_ERR_ARG);
    qkv_clear_error(a);
    int n;
    qkv_params(a, &n);
    cr_expect_eq(n, 1);

    /* b is untouched: its parameter, kept tensor and backward work */
    cr_expect_eq(qkv_backward(b, loss_b, NULL), QKV_OK, "%s", qkv_errmsg(b));
    cr_expect_eq(qkv_get_flat(b, wb->grad, 0), 1.0);
    cr_expect_eq(qkv_get_flat(b, wb, 3), 3.0);
    qkv_params(b, &n);
    cr_expect_eq(n, 1);
    qkv_free(b, wb);
    qkv_free(b, kb);
    cr_expect_eq(qkv_error(b), QKV_OK, "%s", qkv_errmsg(b));
    qkv_free(a, wa);
    qkv_ctx_free(a);
    qkv_ctx_free(b);
    cr_expect_eq(ca.live, 0, "a: %ld blocks live", ca.live);
    cr_expect_eq(cb.live, 0, "b: %ld blocks live", cb.live);
}

Test(handles, qkv_free_of_a_gradient_is_refused_and_the_gradient_stays_with_its_tensor) {
    counting c = {0};
    qkv_options o = qkv_default_options();
    o.allocator = counting_allocator(&c);
    qkv_ctx *ctx = qkv_ctx_new(&o);
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 1, (int64_t[]){3}));
    qkv_tensor *x = qkv_full(ctx, QKV_F32, 1, (int64_t[]){3}, 2.0);
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, x, w)), NULL), QKV_OK);
    qkv_step_end(ctx);
    qkv_tensor *g = w->grad;
    cr_assert_not_null(g);
    qkv_free(ctx, g);
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_free", "[3]", "gradient of a persistent tensor");
    cr_expect_eq(w->grad, g);
    cr_expect_eq(qkv_get_flat(ctx, w->grad, 2), 2.0, "%s", qkv_errmsg(ctx));
    /* a live step tensor: qkv_free is a no-op; a stale one is reported */
    qkv_tensor *s = qkv_ones(ctx, QKV_F32, 1, (int64_t[]){3});
    qkv_free(ctx, s);
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_expect_eq(qkv_get_flat(ctx, s, 0), 1.0);
    qkv_step_end(ctx);
    qkv_free(ctx, s);
    EXPECT_ERROR(ctx, QKV_ERR_STALE, "qkv_free", "made in step 2");
    qkv_free(ctx, w); /* frees w and its gradient */
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    cr_expect_eq(c.live, 0);
}

/* ---- allocator hooks with any alignment ---------------------------------------------------------- */

static void misaligned_training(size_t skew) {
    guard *g = new_guard(skew);
    qkv_ctx *ctx = guard_ctx(g, 2048);
    cr_assert_not_null(ctx);
    cr_expect_eq((uintptr_t)ctx % QKV_ALIGN, 0, "skew %zu: the context is aligned", skew);
    qkv_tensor *wq = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, (int64_t[]){8, 4}, 0, 0.5));
    qkv_tensor *wo = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, (int64_t[]){4, 5}, 0, 0.5));
    qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    qkv_optimizer *opt = qkv_optim_new(ctx, &oo, (qkv_tensor *[]){wq, wo}, 2);
    cr_assert(wq && wo && opt, "%s", qkv_errmsg(ctx));
    cr_expect_eq((uintptr_t)ctx->params % QKV_ALIGN, 0);
    qkv_step_end(ctx);
    double loss0 = 0, loss = 0;
    for (int s = 0; s < 4; s++) {
        qkv_tensor *x = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){2, 6, 8}, 0, 1);
        qkv_tensor *q = qkv_projection(ctx, x, wq, NULL);
        qkv_tensor *att = qkv_attention(ctx, q, q, q, NULL, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL);
        qkv_tensor *targets = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){2, 6});
        qkv_tensor *l = qkv_cross_entropy(ctx, qkv_projection(ctx, att, wo, NULL), targets);
        cr_assert_eq(qkv_backward(ctx, l, NULL), QKV_OK, "skew %zu: %s", skew, qkv_errmsg(ctx));
        cr_expect_eq((uintptr_t)x->data % QKV_ALIGN, 0);
        cr_expect_eq((uintptr_t)wq->grad->data % QKV_ALIGN, 0);
        cr_expect_eq((uintptr_t)ctx->ring->slots % 8, 0);
        loss = qkv_get_flat(ctx, l, 0);
        if (s == 0) loss0 = loss;
        cr_assert_eq(qkv_optim_step(opt), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_optim_zero_grad(opt);
        qkv_step_end(ctx);
    }
    cr_expect(isfinite(loss) && loss < loss0, "skew %zu: loss %g -> %g", skew, loss0, loss);
    qkv_optim_free(opt);
    qkv_ctx_free(ctx);
    cr_expect_eq(g->live, 0);
    guard_release(g);
    free(g);
}

Test(handles, allocator_hooks_returning_1_2_or_4_aligned_memory_are_aligned_inside_qkv) {
    misaligned_training(1);
    misaligned_training(2);
    misaligned_training(4);
}

/* An optimizer keeps its parameters' pointers: one freed under it is refused by address, before a read. */
Test(handles, an_optimizer_step_after_its_parameter_was_freed_is_refused_without_a_read) {
    guard *g = new_guard(0);
    qkv_ctx *ctx = guard_ctx(g, 0);
    qkv_tensor *w[2] = {qkv_param(ctx, qkv_ones(ctx, QKV_F32, 1, (int64_t[]){4})),
                        qkv_param(ctx, qkv_ones(ctx, QKV_F32, 1, (int64_t[]){4}))};
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    qkv_optimizer *opt = qkv_optim_new(ctx, &o, w, 2);
    cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
    qkv_free(ctx, w[1]);
    cr_expect_eq(qkv_optim_step(opt), QKV_ERR_ARG);
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_optim_step", "params[1]", not_live);
    qkv_clear_error(ctx);
    cr_expect_eq(qkv_optim_zero_grad(opt), QKV_ERR_ARG);
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_optim_zero_grad", "params[1]", not_live);
    qkv_optim_free(opt);
    qkv_ctx_free(ctx);
    cr_expect_eq(g->live, 0);
    guard_release(g);
    free(g);
}

/* ---- freed persistent tensors: held for QKV_FREED_KEPT frees ---------------------------------------- */

/* An allocator that recycles, as malloc's per-size caches do: a block freed is the next block of the same
 * size handed out (last in, first out). Blocks are released only by recycler_release. */
typedef struct recycler {
    void *blocks[4096];
    size_t sizes[4096];
    bool free_[4096];
    int n;
    long frees; /* free_fn calls */
} recycler;

static void *recycler_malloc(size_t size, void *user) {
    recycler *r = user;
    for (int i = r->n - 1; i >= 0; i--)
        if (r->free_[i] && r->sizes[i] == size) { /* the newest free block of this size */
            r->free_[i] = false;
            return r->blocks[i];
        }
    if (r->n == (int)(sizeof r->blocks / sizeof r->blocks[0])) return NULL;
    void *p = malloc(size);
    if (!p) return NULL;
    r->blocks[r->n] = p;
    r->sizes[r->n] = size;
    r->free_[r->n++] = false;
    return p;
}

static void recycler_free(void *ptr, void *user) {
    recycler *r = user;
    if (!ptr) return;
    r->frees++;
    for (int i = r->n - 1; i >= 0; i--)
        if (r->blocks[i] == ptr) {
            /* move it to the end: the most recently freed is found first */
            void *p = r->blocks[i];
            size_t s = r->sizes[i];
            memmove(r->blocks + i, r->blocks + i + 1, (size_t)(r->n - i - 1) * sizeof r->blocks[0]);
            memmove(r->sizes + i, r->sizes + i + 1, (size_t)(r->n - i - 1) * sizeof r->sizes[0]);
            memmove(r->free_ + i, r->free_ + i + 1, (size_t)(r->n - i - 1) * sizeof r->free_[0]);
            r->blocks[r->n - 1] = p;
            r->sizes[r->n - 1] = s;
            r->free_[r->n - 1] = true;
            return;
        }
}

static long recycler_live(const recycler *r) {
    long live = 0;
    for (int i = 0; i < r->n; i++) live += !r->free_[i];
    return live;
}

static void recycler_release(recycler *r) {
    for (int i = 0; i < r->n; i++) free(r->blocks[i]);
    r->n = 0;
}

static const char *const freed_msg = "it was freed with qkv_free";

/* The loop a program has: free a parameter, make a new one of the same shape, and by mistake keep using the
 * old pointer. The allocator hands the freed block straight back, so before the freed tensors were held,
 * the new parameter sat at the old address and the old pointer read as it. Every pointer freed fewer than
 * QKV_FREED_KEPT frees ago (the gradient of one included) must be refused, as freed. */
Test(handles, a_tensor_freed_fewer_than_qkv_freed_kept_frees_ago_is_freed_though_the_allocator_recycles) {
    recycler *rc = calloc(1, sizeof *rc);
    qkv_options o = qkv_default_options();
    o.allocator = (qkv_allocator){recycler_malloc, recycler_free, rc};
    qkv_ctx *ctx = qkv_ctx_new(&o);
    cr_assert_not_null(ctx);
    const int64_t shape[2] = {3, 4};
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F64, 2, shape));
    qkv_tensor *x = qkv_full(ctx, QKV_F64, 2, shape, 2.0);
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, x, w)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_step_end(ctx);
    qkv_tensor *first_grad = w->grad;
    cr_assert_not_null(first_grad);

    enum { ROUNDS = 3 * QKV_FREED_KEPT };
    qkv_tensor *freed[ROUNDS];
    int reused = 0, wrong = 0;
    for (int round = 0; round < ROUNDS; round++) {
        freed[round] = w;
        qkv_free(ctx, w);
        cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
        w = qkv_param(ctx, qkv_full(ctx, QKV_F64, 2, shape, (double)round));
        cr_assert_not_null(w, "%s", qkv_errmsg(ctx));
        for (int j = round; j >= 0 && j > round - (int)QKV_FREED_KEPT; j--) reused += w == freed[j];
        /* every pointer of the last QKV_FREED_KEPT frees (this one included) is refused, as freed */
        for (int j = round; j >= 0 && j > round - (int)QKV_FREED_KEPT; j--) {
            qkv_tensor *s = qkv_sum(ctx, freed[j]);
            if (s || qkv_error(ctx) != QKV_ERR_ARG || !strstr(qkv_errmsg(ctx), freed_msg)) {
                if (wrong++ < 5)
                    cr_log_error("round %d: the tensor freed in round %d: %s (%s)", round, j,
                                 s ? "accepted" : qkv_status_name(qkv_error(ctx)), qkv_errmsg(ctx));
            }
            qkv_clear_error(ctx);
        }
        if (round < (int)QKV_FREED_KEPT) { /* the first parameter's gradient went with it */
            cr_expect_null(qkv_copy(ctx, first_grad), "round %d", round);
            EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_copy", "tensor", freed_msg);
        }
        /* the new parameter holds its own values */
        cr_expect_eq(qkv_get_flat(ctx, w, 11), (double)round, "%s", qkv_errmsg(ctx));
        qkv_free(ctx, freed[round]); /* a second qkv_free: refused, as freed */
        EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_free", freed_msg);
        qkv_step_end(ctx);
    }
    cr_expect_eq(wrong, 0, "%d uses of a recently freed tensor were not refused as freed", wrong);
    cr_expect_eq(reused, 0, "a new parameter took the address of one freed fewer than %u frees ago", QKV_FREED_KEPT);
    qkv_ctx_free(ctx);
    cr_expect_eq(recycler_live(rc), 0, "%ld blocks not returned", recycler_live(rc));
    recycler_release(rc);
    free(rc);
}

/* The freed parameters' memory goes back to the allocator exactly when they leave the FIFO: the first at the
 * (QKV_FREED_KEPT + 1)-th free, one per free after that; and qkv_ctx_free returns the rest. A kept tensor
 * (qkv_keep) is not held: its memory goes back at once. */
Test(handles, a_freed_tensor_holds_its_memory_for_qkv_freed_kept_frees_then_returns_it) {
    recycler *rc = calloc(1, sizeof *rc);
    qkv_options o = qkv_default_options();
    o.allocator = (qkv_allocator){recycler_malloc, recycler_free, rc};
    qkv_ctx *ctx = qkv_ctx_new(&o);
    cr_expect_eq(QKV_FREED_KEPT, 64u, "qkv.h and docs/reliability.md say 64");
    enum { N = QKV_FREED_KEPT + 8 };
    qkv_tensor *kept[N];
    /* one kept throughout, so the set of live tensors never empties (it would give its table back) */
    cr_assert_not_null(qkv_keep(ctx, qkv_ones(ctx, QKV_F32, 1, (int64_t[]){5})));
    for (int i = 0; i < N; i++) kept[i] = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 1, (int64_t[]){5}));
    qkv_tensor *plain = qkv_keep(ctx, qkv_ones(ctx, QKV_F32, 1, (int64_t[]){5}));
    qkv_step_end(ctx);
    cr_assert_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    long live = recycler_live(rc), frees = rc->frees;
    for (int i = 0; i < N; i++) {
        qkv_free(ctx, kept[i]);
        long returned = rc->frees - frees;
        long want = i < (int)QKV_FREED_KEPT ? 0 : i - (int)QKV_FREED_KEPT + 1;
        cr_expect_eq(returned, want, "after %d frees, %ld blocks returned, want %ld", i + 1, returned, want);
    }
    cr_expect_eq(recycler_live(rc), live - (N - (long)QKV_FREED_KEPT));
    frees = rc->frees;
    qkv_free(ctx, plain);
    cr_expect_eq(rc->frees - frees, 1, "a kept tensor's block goes back at once");
    cr_expect_null(qkv_sum(ctx, plain));
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_sum", not_live);
    /* the ones that left: as any unknown pointer (their memory may be anything's now); the rest: freed */
    cr_expect_null(qkv_sum(ctx, kept[N - 1]));
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_sum", freed_msg);
    cr_expect_null(qkv_sum(ctx, kept[N - (int)QKV_FREED_KEPT]));
    EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_sum", freed_msg);
    qkv_ctx_free(ctx);
    cr_expect_eq(recycler_live(rc), 0);
    recycler_release(rc);
    free(rc);
}

/* The same loop with the guard allocator, for longer than the FIFO: a pointer that left it is refused from
 * its address alone (never read: its pages are unreadable now), and the one it held are never read either. */
Test(handles, freeing_and_reallocating_in_a_loop_never_reads_a_freed_tensor) {
    guard *g = new_guard(0);
    qkv_ctx *ctx = guard_ctx(g, 0);
    enum { ROUNDS = 2 * QKV_FREED_KEPT + 5 };
    qkv_tensor *freed[ROUNDS];
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 2, (int64_t[]){2, 3}));
    for (int round = 0; round < ROUNDS; round++) {
        qkv_tensor *x = qkv_ones(ctx, QKV_F32, 2, (int64_t[]){2, 3});
        cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, x, w)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        qkv_step_end(ctx);
        freed[round] = w;
        qkv_free(ctx, w);
        w = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 2, (int64_t[]){2, 3}));
        cr_assert_not_null(w, "%s", qkv_errmsg(ctx));
        for (int j = 0; j <= round; j++) {
            cr_expect_null(qkv_mul(ctx, w, freed[j]));
            bool held = j > round - (int)QKV_FREED_KEPT;
            EXPECT_ERROR(ctx, QKV_ERR_ARG, "qkv_mul", "b", not_live, held ? freed_msg : "freed with qkv_free");
        }
    }
    /* the FIFO holds QKV_FREED_KEPT tensors and their gradients: two blocks each */
    long held = g->live;
    qkv_ctx_free(ctx);
    cr_expect_geq(held, 2 * (long)QKV_FREED_KEPT);
    cr_expect_eq(g->live, 0);
    guard_release(g);
    free(g);
}
