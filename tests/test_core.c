/*
 * test_core.c — contexts, the step arena, persistent tensors, creation, access, conversion, printing,
 * the RNG, and the promise that a step after the first makes no heap allocation.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qkv_internal.h"
#include "test_alloc.h"

static qkv_ctx *counting_ctx(counting *c, size_t chunk) {
    qkv_options o = qkv_default_options();
    o.allocator = counting_allocator(c);
    o.arena_chunk = chunk;
    return qkv_ctx_new(&o);
}

Test(core, zeros_ones_full_shapes_and_alignment) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *z = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){2, 3, 4});
    qkv_tensor *o = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){5, 1});
    qkv_tensor *f = qkv_full(ctx, QKV_I32, 1, (int64_t[]){7}, -3.0);
    qkv_tensor *s = qkv_scalar(ctx, QKV_F64, 2.5);
    cr_assert_not_null(z);
    cr_assert_not_null(o);
    cr_assert_not_null(f);
    cr_assert_not_null(s);
    cr_expect_eq(z->numel, 24);
    cr_expect_eq(z->shape[3], 1);
    cr_expect_eq(s->ndim, 0);
    cr_expect_eq(s->numel, 1);
    cr_expect_eq(qkv_f64(s)[0], 2.5);
    cr_expect_eq((uintptr_t)z->data % 64, 0);
    cr_expect_eq((uintptr_t)o->data % 64, 0);
    cr_expect_eq((uintptr_t)f->data % 64, 0);
    for (int i = 0; i < 24; i++) cr_expect_eq(qkv_f32(z)[i], 0.0f);
    for (int i = 0; i < 5; i++) cr_expect_eq(qkv_f64(o)[i], 1.0);
    /* qkv_empty: the same shape, dtype and alignment, elements unspecified but writable */
    qkv_tensor *e = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){3, 5});
    cr_assert_not_null(e, "%s", qkv_errmsg(ctx));
    cr_expect(e->ndim == 2 && e->shape[0] == 3 && e->shape[1] == 5 && e->numel == 15 && e->dtype == QKV_I32);
    cr_expect_eq((uintptr_t)e->data % 64, 0);
    for (int i = 0; i < 15; i++) qkv_i32(e)[i] = i;
    cr_expect_eq(qkv_i32(e)[14], 14);
    for (int i = 0; i < 7; i++) cr_expect_eq(qkv_i32(f)[i], -3);
    cr_expect_null(qkv_f64(z), "typed accessor of the wrong dtype gives NULL");
    cr_expect_eq(qkv_error(ctx), QKV_OK);
    qkv_ctx_free(ctx);
}

Test(core, from_data_copies_and_get_set) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    double buf[6] = {1, 2, 3, 4, 5, 6};
    qkv_tensor *t = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){2, 3}, buf);
    buf[0] = 100; /* the tensor holds a copy */
    cr_expect_eq(qkv_get(ctx, t, (int64_t[]){0, 0}), 1.0);
    cr_expect_eq(qkv_get(ctx, t, (int64_t[]){1, 2}), 6.0);
    cr_expect_eq(qkv_set(ctx, t, (int64_t[]){1, 1}, -7.5), QKV_OK);
    cr_expect_eq(qkv_get_flat(ctx, t, 4), -7.5);
    cr_expect_eq(qkv_set_flat(ctx, t, 0, 9), QKV_OK);
    cr_expect_eq(qkv_f64(t)[0], 9.0);
    cr_expect(isnan(qkv_get(ctx, t, (int64_t[]){2, 0})), "out-of-range index reads NaN");
    cr_expect_eq(qkv_error(ctx), QKV_ERR_ARG);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_get") && strstr(qkv_errmsg(ctx), "[2,3]"), "%s",
              qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

Test(core, dtype_conversion_truncates_and_saturates) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    float vals[5] = {1.75f, -2.5f, 300.0f, -1e10f, NAN};
    qkv_tensor *f = qkv_from_data(ctx, QKV_F32, 1, (int64_t[]){5}, vals);
    qkv_tensor *i = qkv_to_dtype(ctx, f, QKV_I32);
    qkv_tensor *u = qkv_to_dtype(ctx, f, QKV_U8);
    qkv_tensor *d = qkv_to_dtype(ctx, f, QKV_F64);
    int32_t want_i[5] = {1, -2, 300, INT32_MIN, 0};
    uint8_t want_u[5] = {1, 0, 255, 0, 0};
    for (int k = 0; k < 5; k++) {
        cr_expect_eq(qkv_i32(i)[k], want_i[k], "i32[%d] = %d", k, qkv_i32(i)[k]);
        cr_expect_eq(qkv_u8(u)[k], want_u[k], "u8[%d] = %d", k, qkv_u8(u)[k]);
    }
    cr_expect_eq(qkv_f64(d)[0], 1.75);
    qkv_tensor *back = qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){5});
    cr_expect_eq(qkv_copy_into(ctx, back, i), QKV_OK);
    cr_expect_eq(qkv_f32(back)[2], 300.0f);
    cr_expect_eq(qkv_fill(ctx, back, 0.5), QKV_OK);
    cr_expect_eq(qkv_f32(back)[4], 0.5f);
    qkv_ctx_free(ctx);
}

Test(core, rng_is_reproducible_and_has_the_right_moments) {
    qkv_options o = qkv_default_options();
    o.seed = 42;
    qkv_ctx *a = qkv_ctx_new(&o), *b = qkv_ctx_new(&o);
    int64_t n = 200000;
    qkv_tensor *x = qkv_randn(a, QKV_F64, 1, &n, 0.0, 1.0);
    qkv_tensor *y = qkv_randn(b, QKV_F64, 1, &n, 0.0, 1.0);
    cr_assert(memcmp(x->data, y->data, (size_t)n * 8) == 0, "same seed, same numbers");
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++) mean += qkv_f64(x)[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += (qkv_f64(x)[i] - mean) * (qkv_f64(x)[i] - mean);
    var /= (double)(n - 1);
    cr_expect(fabs(mean) < 0.01, "mean %g", mean);   /* 4.5 sigma */
    cr_expect(fabs(var - 1.0) < 0.015, "var %g", var); /* about 5 sigma */
    qkv_tensor *u = qkv_rand_uniform(a, QKV_F32, 1, &n, -2.0, 3.0);
    float lo = 10, hi = -10;
    for (int64_t i = 0; i < n; i++) {
        lo = fminf(lo, qkv_f32(u)[i]);
        hi = fmaxf(hi, qkv_f32(u)[i]);
    }
    cr_expect(lo >= -2.0f && hi <= 3.0f && lo < -1.99f && hi > 2.99f, "range [%g, %g]", lo, hi);
    qkv_seed(b, 7);
    qkv_tensor *z1 = qkv_randn(b, QKV_F32, 1, (int64_t[]){8}, 0, 1);
    qkv_seed(b, 7);
    qkv_tensor *z2 = qkv_randn(b, QKV_F32, 1, (int64_t[]){8}, 0, 1);
    cr_expect(memcmp(z1->data, z2->data, 32) == 0, "reseeding restarts the stream");
    qkv_ctx_free(a);
    qkv_ctx_free(b);
}

Test(core, xavier_and_he_init_have_their_variance) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_xavier_uniform(ctx, QKV_F64, 300, 500);
    qkv_tensor *h = qkv_he_normal(ctx, QKV_F64, 300, 500);
    cr_assert_eq(x->shape[0], 300);
    cr_assert_eq(x->shape[1], 500);
    double vx = 0, vh = 0, bound = sqrt(6.0 / 800.0);
    for (int64_t i = 0; i < x->numel; i++) {
        double v = qkv_f64(x)[i];
        cr_assert(v >= -bound && v <= bound);
        vx += v * v;
        vh += qkv_f64(h)[i] * qkv_f64(h)[i];
    }
    vx /= (double)x->numel;
    vh /= (double)h->numel;
    cr_expect(fabs(vx / (2.0 / 800.0) - 1) < 0.02, "xavier var %g", vx);
    cr_expect(fabs(vh / (2.0 / 300.0) - 1) < 0.02, "he var %g", vh);
    qkv_ctx_free(ctx);
}

Test(core, persistent_tensors_survive_step_end_and_step_tensors_go_stale) {
    counting c = {0};
    qkv_ctx *ctx = counting_ctx(&c, 4096);
    qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F32, 2, (int64_t[]){3, 3}));
    qkv_tensor *kept = qkv_keep(ctx, qkv_full(ctx, QKV_I32, 1, (int64_t[]){4}, 5));
    cr_assert(w && kept);
    cr_expect(w->requires_grad);
    cr_expect(!kept->requires_grad);
    qkv_step_end(ctx);
    qkv_tensor *t = qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){3});
    cr_expect_eq(qkv_f32(w)[8], 1.0f);
    cr_expect_eq(qkv_i32(kept)[3], 5);
    qkv_step_end(ctx);
    /* t lives in the (single, kept) chunk, so its header is still readable: the use is detected */
    cr_expect_null(qkv_sum(ctx, t));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_STALE);
    cr_expect(strstr(qkv_errmsg(ctx), "qkv_step_end") != NULL, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    int n;
    qkv_tensor *const *ps = qkv_params(ctx, &n);
    cr_expect_eq(n, 1);
    cr_expect_eq(ps[0], w);
    qkv_free(ctx, w);
    qkv_params(ctx, &n);
    cr_expect_eq(n, 0);
    qkv_free(ctx, kept);
    qkv_ctx_free(ctx);
    cr_expect_eq(c.live, 0, "every allocation freed, %ld live", c.live);
}

/* One training-like step: forward, backward, a plain SGD update written out by hand. */
static void toy_step(qkv_ctx *ctx, qkv_tensor *w, qkv_tensor *b) {
    qkv_tensor *x = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){4, 8, 16}, 0, 1);
    qkv_tensor *y = qkv_add(ctx, qkv_mul(ctx, x, w), b);
    qkv_tensor *loss = qkv_mean(ctx, qkv_mul(ctx, y, y));
    cr_assert_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    for (int64_t i = 0; i < w->numel; i++) qkv_f32(w)[i] -= 0.1f * qkv_f32(w->grad)[i];
    qkv_zero_grads(ctx);
    qkv_step_end(ctx);
}

Test(core, a_step_after_the_first_makes_no_heap_allocation) {
    counting c = {0};
    qkv_ctx *ctx = counting_ctx(&c, 1024); /* small first chunk: the first step must grow the arena */
    qkv_tensor *w = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, (int64_t[]){8, 16}, 0, 1));
    qkv_tensor *b = qkv_param(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){16}));
    qkv_step_end(ctx);
    toy_step(ctx, w, b);
    cr_assert_gt(c.calls, 3, "the first step allocated (arena chunks, gradients)");
    long before = c.calls;
    for (int s = 0; s < 5; s++) toy_step(ctx, w, b);
    cr_expect_eq(c.calls, before, "steps 2-6 made %ld heap allocations", c.calls - before);
    cr_expect_eq(qkv_error(ctx), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    cr_expect_eq(c.live, 0);
}

Test(core, failing_allocator_is_reported_and_the_context_recovers) {
    for (long k = 1; k <= 12; k++) {
        counting c = {0};
        c.fail_at = k;
        qkv_ctx *ctx = counting_ctx(&c, 256);
        if (!ctx) { /* the very first allocation is the context itself */
            cr_expect_eq(k, 1);
            continue;
        }
        qkv_tensor *w = qkv_param(ctx, qkv_ones(ctx, QKV_F64, 2, (int64_t[]){16, 16}));
        qkv_tensor *x = qkv_ones(ctx, QKV_F64, 2, (int64_t[]){16, 16});
        qkv_tensor *loss = qkv_sum(ctx, qkv_mul(ctx, x, w));
        qkv_backward(ctx, loss, NULL);
        if (qkv_error(ctx) != QKV_OK) {
            cr_expect_eq(qkv_error(ctx), QKV_ERR_NOMEM, "k=%ld: %s", k, qkv_errmsg(ctx));
            cr_expect(strstr(qkv_errmsg(ctx), "out of memory") != NULL, "%s", qkv_errmsg(ctx));
            qkv_clear_error(ctx);
            qkv_step_end(ctx);
            qkv_tensor *again = qkv_sum(ctx, qkv_ones(ctx, QKV_F64, 1, (int64_t[]){3}));
            cr_expect(again && qkv_f64(again)[0] == 3.0, "k=%ld: the context works after clearing", k);
        }
        qkv_ctx_free(ctx);
        cr_expect_eq(c.live, 0, "k=%ld: %ld allocations leaked", k, c.live);
    }
}

Test(core, print_shows_shape_and_elides_long_dimensions) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    qkv_tensor *t = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){2, 2}, (double[]){1, 2.5, -3, 4});
    cr_assert_eq(qkv_print(ctx, t, f), QKV_OK);
    int64_t n = 10;
    qkv_tensor *r = qkv_zeros(ctx, QKV_I32, 1, &n);
    for (int i = 0; i < 10; i++) qkv_i32(r)[i] = i;
    cr_assert_eq(qkv_print(ctx, r, f), QKV_OK);
    fclose(f);
    cr_expect(strstr(buf, "tensor [2,2] f64") != NULL, "%s", buf);
    cr_expect(strstr(buf, "[[1, 2.5],\n [-3, 4]]") != NULL, "%s", buf);
    cr_expect(strstr(buf, "[0, 1, 2, ..., 7, 8, 9]") != NULL, "%s", buf);
    free(buf);
    qkv_ctx_free(ctx);
}

Test(core, reshape_keeps_values_and_passes_gradients) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 6});
    qkv_set_requires_grad(ctx, a, true);
    qkv_tensor *r = qkv_reshape(ctx, a, 3, (int64_t[]){3, 1, 2});
    qkv_tensor *w = qkv_from_data(ctx, QKV_F64, 3, (int64_t[]){3, 1, 2}, (double[]){1, -1, 2, -2, 3, -3});
    cr_assert_eq(qkv_backward(ctx, qkv_sum(ctx, qkv_mul(ctx, r, w)), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    double want[6] = {1, -1, 2, -2, 3, -3};
    for (int i = 0; i < 6; i++) cr_expect_eq(qkv_f64(a->grad)[i], want[i]);
    cr_expect_null(qkv_reshape(ctx, a, 1, (int64_t[]){5}));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_SHAPE);
    qkv_ctx_free(ctx);
}

/* The header's version macros agree with each other, and qkv_version() (meson's project version, passed
 * in when the library was built) agrees with them. meson.build refuses to configure when QKV_VERSION
 * differs from the project version; tests/check_packaging.sh compares qkv_version() with pkg-config's. */
Test(core, version_macros_and_qkv_version_agree) {
    char numbers[64];
    snprintf(numbers, sizeof numbers, "%d.%d.%d", QKV_VERSION_MAJOR, QKV_VERSION_MINOR, QKV_VERSION_PATCH);
    cr_expect_str_eq(QKV_VERSION, numbers);
    const char *v = qkv_version();
    cr_assert_not_null(v);
    cr_expect_str_eq(v, QKV_VERSION);
    cr_expect_str_eq(v, numbers);
}

/* qkv_f32 and the others give a pointer as writable as the tensor (C11 _Generic in qkv.h): a const tensor
 * gives a const pointer, so writing through it does not compile. */
#define QKV_IS_CONST_FLOAT(p) _Generic((p), const float *: 1, default: 0)
Test(core, typed_pointers_follow_the_tensors_constness) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *t = qkv_full(ctx, QKV_F32, 1, (int64_t[]){3}, 2.0);
    const qkv_tensor *ct = t;
    _Static_assert(_Generic(qkv_f32(t), float *: 1, default: 0), "a mutable tensor gives float *");
    _Static_assert(QKV_IS_CONST_FLOAT(qkv_f32(ct)), "a const tensor gives const float *");
    _Static_assert(_Generic(qkv_f64(ct), const double *: 1, default: 0), "f64");
    _Static_assert(_Generic(qkv_i32(ct), const int32_t *: 1, default: 0), "i32");
    _Static_assert(_Generic(qkv_u8(ct), const uint8_t *: 1, default: 0), "u8");
    _Static_assert(_Generic(qkv_f32_const(t), const float *: 1, default: 0), "the explicit const accessor");
    qkv_f32(t)[1] = 5.0f;
    cr_expect_eq(qkv_f32(ct)[1], 5.0f);
    cr_expect_null(qkv_f64(ct), "a dtype that differs gives NULL");
    cr_expect_null(qkv_f32((const qkv_tensor *)NULL));
    qkv_ctx_free(ctx);
}
