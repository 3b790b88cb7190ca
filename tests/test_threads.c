/*
 * test_threads.c — determinism across thread counts and runs, and independent contexts in concurrent threads.
 *
 * Determinism: the copy-task model with 2 heads and W^O, n = 160 (the fused attention's backward then walks
 * two key blocks, whose dQ contributions are accumulated in a fixed order, and 4 x 2 (batch, head) tasks
 * are spread over the threads) trains 50 steps with 1 thread, with 2 threads, and again with 2 threads:
 * the parameters, the Adam moments and every step's loss are bit-identical (f32; f64 for 10 steps).
 *
 * Concurrency (the README's contract: one context per thread; different contexts in different threads are
 * safe): two pthreads each train their own context (the copy model, then a checkpoint save and reload, and
 * a graph of every attention operator with .npy I/O) at the same time, and each result equals the same work
 * done alone. ./build.sh tsan runs this file under ThreadSanitizer in a build without OpenMP (TSan cannot
 * see OpenMP's runtime), where a data race between the two contexts — shared state in the library, the
 * kernels' dispatch, the file writer or the JSON parser — is reported as an error.
 */
#define _POSIX_C_SOURCE 200809L
#ifndef QKV_TEST_STANDALONE
#include <criterion/criterion.h>
#else
/* Criterion does not start under ThreadSanitizer (its inheritable arena cannot be mapped next to TSan's
 * shadow memory: Snaipe/Criterion#274), so the tsan build (tests/meson.build) compiles this file with this
 * stand-in: each Test is a function run in turn in this process, cr_expect/cr_assert count failures (an
 * assert ends the test), and the output is TAP, as Criterion's. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>

typedef struct sa_test {
    const char *name;
    void (*fn)(void);
} sa_test;
static sa_test sa_tests[16];
static int sa_count, sa_failures;
static jmp_buf sa_abort;

static void sa_register(const char *name, void (*fn)(void)) {
    if (sa_count < 16) sa_tests[sa_count++] = (sa_test){name, fn};
}

static void sa_check(int ok, int fatal, const char *expr, const char *file, int line, const char *fmt, ...) {
    if (ok) return;
    sa_failures++;
    fprintf(stderr, "%s:%d: failed: %s: ", file, line, expr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (fatal) longjmp(sa_abort, 1);
}

#define Test(suite, name)                                                                                      \
    static void suite##_##name(void);                                                                          \
    __attribute__((constructor)) static void sa_register_##suite##_##name(void) {                              \
        sa_register(#suite "::" #name, suite##_##name);                                                        \
    }                                                                                                          \
    static void suite##_##name(void)
#define cr_expect(cond, ...) sa_check(!!(cond), 0, #cond, __FILE__, __LINE__, "" __VA_ARGS__)
#define cr_assert(cond, ...) sa_check(!!(cond), 1, #cond, __FILE__, __LINE__, "" __VA_ARGS__)
#define cr_expect_eq(a, b, ...) cr_expect((a) == (b), __VA_ARGS__)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL, __VA_ARGS__)

int main(void) {
    printf("1..%d\n", sa_count);
    int failed_tests = 0;
    for (int i = 0; i < sa_count; i++) {
        int before = sa_failures;
        if (setjmp(sa_abort) == 0) sa_tests[i].fn();
        bool ok = sa_failures == before;
        failed_tests += !ok;
        printf("%sok %d - %s\n", ok ? "" : "not ", i + 1, sa_tests[i].name);
        fflush(stdout);
    }
    return failed_tests ? 1 : 0;
}
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "copy_model.h"
#include "qkv.h"
#include "qkv_internal.h"

#include "../ops/kernels/attention_kernels.h"

/* ---- determinism ---------------------------------------------------------------------------------- */

typedef struct trained {
    unsigned char *state; /* parameters then optimizer state, as bytes */
    size_t size;
    double *losses;
    int threads_seen;
} trained;

static copy_config big_config(int threads, qkv_dtype dt) {
    copy_config c = copy_default_config();
    c.task = TASK_REVERSE;
    c.seed = 7;
    c.heads = 2;
    c.wo = true;
    c.n = 160;
    c.vocab = 8;
    c.batch = 4;
    c.d_k = 8;
    c.eval_size = 4;
    c.threads = threads;
    c.dtype = dt;
    return c;
}

static size_t model_state(copy_model *m, unsigned char *buf) {
    qkv_tensor *ts[64];
    int n = 0;
    ts[n++] = m->wq;
    ts[n++] = m->wk;
    ts[n++] = m->wv;
    ts[n++] = m->wo;
    for (int i = 0; i < qkv_optim_state_count(m->opt) && n < 64; i++) ts[n++] = qkv_optim_state(m->opt, i, NULL);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t b = (size_t)ts[i]->numel * qkv_dtype_size(ts[i]->dtype);
        if (buf) memcpy(buf + len, ts[i]->data, b);
        len += b;
    }
    return len;
}

static trained train(const copy_config *c, int steps) {
    trained t = {0};
    copy_model m;
    char err[512];
    cr_assert(copy_model_init(&m, c, err, sizeof err), "%s", err);
    t.threads_seen = qkv_threads(m.ctx);
    t.losses = calloc((size_t)steps, sizeof(double));
    for (int s = 0; s < steps; s++) {
        copy_stats st;
        cr_assert(copy_train_step(&m, &st), "step %d: %s", s, qkv_errmsg(m.ctx));
        t.losses[s] = st.loss;
    }
    t.size = model_state(&m, NULL);
    t.state = malloc(t.size);
    model_state(&m, t.state);
    copy_model_free(&m);
    return t;
}

static void release(trained *t) {
    free(t->state);
    free(t->losses);
}

static void same_run(const trained *a, const trained *b, int steps, const char *what) {
    cr_expect_eq(a->size, b->size);
    cr_expect(a->size == b->size && memcmp(a->state, b->state, a->size) == 0,
              "%s: parameters and optimizer state are not bit-identical", what);
    int first = -1;
    for (int s = 0; s < steps && first < 0; s++)
        if (memcmp(&a->losses[s], &b->losses[s], sizeof(double)) != 0) first = s;
    cr_expect_eq(first, -1, "%s: the losses first differ at step %d", what, first);
}

static void determinism(qkv_dtype dt, int steps) {
    copy_config c1 = big_config(1, dt), c2 = big_config(2, dt);
    trained one = train(&c1, steps);
    trained two = train(&c2, steps);
    trained again = train(&c2, steps);
    cr_expect_eq(one.threads_seen, 1);
    cr_expect_eq(two.threads_seen, 2, "the context was given 2 threads");
    same_run(&one, &two, steps, "1 thread vs 2 threads");
    same_run(&two, &again, steps, "two runs with 2 threads and the same seed");
    cr_expect(one.losses[steps - 1] != one.losses[0], "the model trains (loss %g -> %g)", one.losses[0],
              one.losses[steps - 1]);
    /* a different seed gives different bits (the comparison can fail) */
    copy_config other = big_config(1, dt);
    other.seed = 8;
    trained diff = train(&other, 2);
    cr_expect(diff.size == one.size && memcmp(diff.state, one.state, one.size) != 0);
    release(&one);
    release(&two);
    release(&again);
    release(&diff);
}

Test(threads, fifty_steps_are_bit_identical_with_1_and_2_threads_and_across_runs_f32) { determinism(QKV_F32, 50); }
Test(threads, ten_steps_are_bit_identical_with_1_and_2_threads_and_across_runs_f64) { determinism(QKV_F64, 10); }

/* ---- the grain size ------------------------------------------------------------------------------- */

/* Forward + backward of attention (fused or composed) with `threads` threads on [B, n, d] (d_k = d_v = d);
 * returns the OpenMP regions it opened and, in bits[0..3], hashes of out, dq, dk, dv. */
static long long attention_regions(int threads, int64_t B, int64_t n, int64_t d, bool fused, uint64_t bits[4]) {
    qkv_options o = qkv_default_options();
    o.seed = 3;
    o.threads = threads;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    cr_assert_not_null(ctx);
    qkv_tensor *q = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){B, n, d}, 0, 1);
    qkv_tensor *k = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){B, n, d}, 0, 1);
    qkv_tensor *v = qkv_randn(ctx, QKV_F32, 3, (int64_t[]){B, n, d}, 0, 1);
    qkv_set_requires_grad(ctx, q, true);
    qkv_set_requires_grad(ctx, k, true);
    qkv_set_requires_grad(ctx, v, true);
    long long before = qkv_parallel_regions_();
    qkv_tensor *attn = NULL;
    qkv_tensor *out = fused ? qkv_attention(ctx, q, k, v, NULL, QKV_SCALE_DEFAULT, 0, NULL)
                            : qkv_attention_composed_(ctx, "composed", q, k, v, NULL, QKV_SCALE_DEFAULT, 0, &attn);
    cr_assert_eq(qkv_backward(ctx, out, qkv_ones(ctx, QKV_F32, 3, out->shape)), QKV_OK, "%s", qkv_errmsg(ctx));
    long long regions = qkv_parallel_regions_() - before;
    const qkv_tensor *ts[4] = {out, q->grad, k->grad, v->grad};
    for (int t = 0; t < 4; t++) {
        uint64_t h = 1469598103934665603ull;
        const unsigned char *b = ts[t]->data;
        for (size_t i = 0; i < (size_t)ts[t]->numel * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
        bits[t] = h;
    }
    qkv_ctx_free(ctx);
    return regions;
}

/* Below the grain (QKV_GRAIN_FLOPS_ a thread, attention_kernels.h) a call opens no OpenMP region even with 2
 * threads: the copy task's d16 step (B 32, n 8, d 16; 2 B n^2 2d = 262144 flops) and a tiled shape just under
 * the grain (B 2, n 64, d 16: 524288 flops for 2 threads of 2^20 each). Above it (B 4, n 512, d 64, 268M
 * flops) the fused path and the composed one (its softmax, 2^20 entries) do open regions, and the results
 * are the bits of 1 thread in every case. */
Test(threads, calls_below_the_grain_size_stay_on_the_calling_thread) {
    const struct { int64_t B, n, d; bool parallel; } shapes[] = {{32, 8, 16, false}, {2, 64, 16, false},
                                                                 {4, 512, 64, true}};
    for (int s = 0; s < 3; s++)
        for (int fused = 0; fused < 2; fused++) {
            uint64_t one[4], two[4];
            long long r1 = attention_regions(1, shapes[s].B, shapes[s].n, shapes[s].d, fused, one);
            long long r2 = attention_regions(2, shapes[s].B, shapes[s].n, shapes[s].d, fused, two);
            cr_expect_eq(r1, 0, "1 thread opened %lld regions", r1);
            if (shapes[s].parallel)
                cr_expect(r2 > 0, "[%lld,%lld,%lld] %s: no region with 2 threads", (long long)shapes[s].B,
                          (long long)shapes[s].n, (long long)shapes[s].d, fused ? "fused" : "composed");
            else
                cr_expect_eq(r2, 0, "[%lld,%lld,%lld] %s: %lld regions below the grain", (long long)shapes[s].B,
                             (long long)shapes[s].n, (long long)shapes[s].d, fused ? "fused" : "composed", r2);
            cr_expect(memcmp(one, two, sizeof one) == 0, "[%lld,%lld,%lld] %s: 1 and 2 threads differ",
                      (long long)shapes[s].B, (long long)shapes[s].n, (long long)shapes[s].d,
                      fused ? "fused" : "composed");
        }
}

/* ---- the elementwise and row-wise operators -------------------------------------------------------- */

/* The operators a training step runs besides the GEMMs and attention, each split over the threads
 * (ops/parallel.h). One case, forward and backward, with `threads` threads: the inputs (requiring grad) from
 * the context's RNG, the output, then the gradients of every input after a backward seeded with a random dy,
 * all appended as bytes to *buf (the caller compares them with memcmp). The shapes are above the grain
 * (QKV_GRAIN_ELEMENTS_: 32768 elements a thread) and odd (1023 rows: not whole blocks of 16 rows, nor
 * whole ranges of 64 elements), so that 2 and 3 threads split them with a short last range; the heads
 * cases take [8, 129, 128], [8, 129, 120] and [32, 129, 30], the embedding a [300, 257] table and 1028 ids
 * (repeated: the scatter adds several rows into one), the cross-entropy [1023, 257] logits with ignored
 * targets and rows whose target's probability underflows, the layer norm [2047, 385]. twice: the
 * operator is applied twice to the same inputs and the results added, so that the second backward adds into
 * gradients that are already there (the accumulating paths). Returns the OpenMP regions opened. */
enum {
    EW_LAYER_NORM, EW_GELU_ERF, EW_GELU_TANH, EW_ADD, EW_ADD_BIAS, EW_SUB, EW_SUB_BIAS, EW_PROJECTION,
    EW_SPLIT_HEADS, EW_SPLIT_HEADS_WIDE, EW_MERGE_HEADS, EW_EMBEDDING, EW_CROSS_ENTROPY, EW_CASES
};
static const char *ew_names[EW_CASES] = {"layer_norm", "gelu erf", "gelu tanh", "add", "add bias", "sub", "sub bias",
                                         "projection", "split_heads (d 8)", "split_heads (d 30)", "merge_heads",
                                         "embedding", "cross_entropy"};

typedef struct byte_buf {
    unsigned char *data;
    size_t len, cap;
} byte_buf;

static void append_tensor(byte_buf *b, const qkv_tensor *t) {
    cr_assert_not_null(t);
    size_t n = (size_t)t->numel * qkv_dtype_size(t->dtype);
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->data = realloc(b->data, b->cap);
        cr_assert_not_null(b->data);
    }
    memcpy(b->data + b->len, t->data, n);
    b->len += n;
}

static qkv_tensor *ew_apply(qkv_ctx *ctx, int c, qkv_tensor **in, const qkv_tensor *ints) {
    switch (c) {
    case EW_SPLIT_HEADS: return qkv_split_heads(ctx, in[0], 16);
    case EW_SPLIT_HEADS_WIDE: return qkv_split_heads(ctx, in[0], 4);
    case EW_MERGE_HEADS: return qkv_merge_heads(ctx, in[0], 4);
    case EW_EMBEDDING: return qkv_embedding(ctx, in[0], ints);
    case EW_CROSS_ENTROPY: return qkv_cross_entropy(ctx, in[0], ints);
    case EW_LAYER_NORM: return qkv_layer_norm(ctx, in[0], in[1], in[2], 1e-5);
    case EW_GELU_ERF: return qkv_gelu(ctx, in[0], QKV_GELU_ERF);
    case EW_GELU_TANH: return qkv_gelu(ctx, in[0], QKV_GELU_TANH);
    case EW_ADD: case EW_ADD_BIAS: return qkv_add(ctx, in[0], in[1]);
    case EW_SUB: case EW_SUB_BIAS: return qkv_sub(ctx, in[0], in[1]);
    default: return qkv_projection(ctx, in[0], in[1], in[2]);
    }
}

static long long elementwise_case(int threads, int c, bool twice, byte_buf *buf) {
    qkv_options o = qkv_default_options();
    o.seed = 11;
    o.threads = threads;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    cr_assert_not_null(ctx);
    const int64_t rows = 1023, d = 257;
    qkv_tensor *in[3] = {NULL, NULL, NULL}, *ints = NULL;
    int n_in = 1;
    in[0] = qkv_randn(ctx, QKV_F32, 2, (int64_t[]){rows, d}, 0.5, 2.0);
    if (c == EW_SPLIT_HEADS || c == EW_SPLIT_HEADS_WIDE || c == EW_MERGE_HEADS) {
        int64_t shape[3] = {8, 129, c == EW_SPLIT_HEADS ? 128 : 120}; /* d_head 8 (the 32-byte copies) or 30 */
        if (c == EW_MERGE_HEADS) shape[0] = 32, shape[2] = 30;
        in[0] = qkv_randn(ctx, QKV_F32, 3, shape, 0.0, 1.0);
    } else if (c == EW_EMBEDDING) { /* table [300, d]; ids [4, 257], each id repeated about 3 times */
        in[0] = qkv_randn(ctx, QKV_F32, 2, (int64_t[]){300, d}, 0.0, 1.0);
        ints = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){4, 257});
        cr_assert_not_null(ints);
        for (int64_t p = 0; p < ints->numel; p++) ((int32_t *)ints->data)[p] = (int32_t)((p * 7 + p / 5) % 300);
    } else if (c == EW_CROSS_ENTROPY) { /* every 7th target ignored; rows 3 and 500 measured from their argmax */
        ints = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){rows});
        cr_assert_not_null(ints);
        for (int64_t r = 0; r < rows; r++) ((int32_t *)ints->data)[r] = r % 7 == 6 ? -1 : (int32_t)((r * 31) % d);
        ((float *)in[0]->data)[3 * d + 1] = 300.0f;
        ((float *)in[0]->data)[500 * d + 2] = 400.0f;
    }
    if (c == EW_LAYER_NORM) /* 128 blocks of 16 rows: their dgamma / dbeta (128 x 770) are summed on 3 threads */
        in[0] = qkv_randn(ctx, QKV_F32, 2, (int64_t[]){2047, 385}, 0.5, 2.0);
    if (c == EW_LAYER_NORM || c == EW_PROJECTION) {
        int64_t d_out = c == EW_LAYER_NORM ? 385 : 200;
        in[1] = c == EW_LAYER_NORM ? qkv_randn(ctx, QKV_F32, 1, (int64_t[]){d_out}, 1.0, 0.2)
                                   : qkv_randn(ctx, QKV_F32, 2, (int64_t[]){d, d_out}, 0.0, 0.1);
        in[2] = qkv_randn(ctx, QKV_F32, 1, (int64_t[]){d_out}, 0.0, 0.2);
        n_in = 3;
    } else if (c >= EW_ADD && c <= EW_SUB_BIAS) {
        bool bias = c == EW_ADD_BIAS || c == EW_SUB_BIAS;
        in[1] = bias ? qkv_randn(ctx, QKV_F32, 1, (int64_t[]){d}, 0.0, 1.0)
                     : qkv_randn(ctx, QKV_F32, 2, (int64_t[]){rows, d}, 0.0, 1.0);
        n_in = 2;
    }
    for (int i = 0; i < n_in; i++) qkv_set_requires_grad(ctx, in[i], true);
    long long before = qkv_parallel_regions_();
    qkv_tensor *y = ew_apply(ctx, c, in, ints);
    if (twice) y = qkv_add(ctx, y, ew_apply(ctx, c, in, ints));
    cr_assert_not_null(y, "%s: %s", ew_names[c], qkv_errmsg(ctx));
    qkv_tensor *dy = qkv_randn(ctx, QKV_F32, y->ndim, y->shape, 0.0, 1.0);
    cr_assert_eq(qkv_backward(ctx, y, dy), QKV_OK, "%s: %s", ew_names[c], qkv_errmsg(ctx));
    long long regions = qkv_parallel_regions_() - before;
    append_tensor(buf, y);
    for (int i = 0; i < n_in; i++) {
        cr_assert_not_null(in[i]->grad, "%s: input %d has no gradient", ew_names[c], i);
        append_tensor(buf, in[i]->grad);
    }
    qkv_ctx_free(ctx);
    return regions;
}

/* Each operator, forward and backward, fresh and accumulating gradients, gives the same bytes with 1, 2 and 3
 * threads, and with 2 and 3 it did split (qkv_parallel_regions_ counts the splits; in a build without OpenMP
 * the ranges run in turn on the calling thread). */
Test(threads, elementwise_and_row_operators_give_the_same_bits_with_1_2_and_3_threads) {
    for (int c = 0; c < EW_CASES; c++)
        for (int twice = 0; twice < 2; twice++) {
            byte_buf one = {0}, more = {0};
            long long r1 = elementwise_case(1, c, twice, &one);
            cr_expect_eq(r1, 0, "%s: 1 thread opened %lld regions", ew_names[c], r1);
            for (int threads = 2; threads <= 3; threads++) {
                more.len = 0;
                long long r = elementwise_case(threads, c, twice, &more);
                cr_expect(r > 0, "%s: no region with %d threads", ew_names[c], threads);
                cr_expect(one.len == more.len && memcmp(one.data, more.data, one.len) == 0,
                          "%s%s: 1 and %d threads give different bits", ew_names[c], twice ? " (twice)" : "",
                          threads);
            }
            free(one.data);
            free(more.data);
        }
}

/* qkv_optim_zero_grad zeroes gradients in ranges over the threads: with 3 threads (split: regions counted)
 * every byte of a [1000, 301] gradient (not whole cache lines) and of a small one is zero afterwards. */
Test(threads, optim_zero_grad_over_three_threads_zeroes_every_byte) {
    qkv_options o = qkv_default_options();
    o.seed = 5;
    o.threads = 3;
    qkv_ctx *ctx = qkv_ctx_new(&o);
    cr_assert_not_null(ctx);
    qkv_tensor *p[2] = {qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, (int64_t[]){1000, 301}, 0, 1)),
                        qkv_param(ctx, qkv_randn(ctx, QKV_F32, 1, (int64_t[]){7}, 0, 1))};
    qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    qkv_optimizer *opt = qkv_optim_new(ctx, &oo, p, 2);
    cr_assert_not_null(opt, "%s", qkv_errmsg(ctx));
    qkv_tensor *y = qkv_add(ctx, qkv_sum(ctx, p[0]), qkv_sum(ctx, p[1]));
    cr_assert_eq(qkv_backward(ctx, y, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    cr_assert(((float *)p[0]->grad->data)[300999] == 1.0f && ((float *)p[1]->grad->data)[6] == 1.0f);
    long long before = qkv_parallel_regions_();
    cr_assert_eq(qkv_optim_zero_grad(opt), QKV_OK);
    cr_expect(qkv_parallel_regions_() > before, "the large gradient was not split");
    for (int i = 0; i < 2; i++) {
        const unsigned char *b = p[i]->grad->data;
        size_t n = (size_t)p[i]->grad->numel * sizeof(float), nonzero = 0;
        for (size_t k = 0; k < n; k++) nonzero += b[k] != 0;
        cr_expect_eq(nonzero, 0, "gradient %d: %zu bytes not zeroed", i, nonzero);
    }
    qkv_optim_free(opt);
    qkv_ctx_free(ctx);
}

/* ---- two contexts in two threads ------------------------------------------------------------------ */

typedef struct job {
    int id;
    int threads; /* per context */
    char dir[128];
    /* results */
    bool ok;
    char err[512];
    unsigned char *state;
    size_t size;
    double graph_sum;
} job;

/* Every attention operator, f64 and f32, with .npy round trips; returns a checksum of the results. */
static double attention_graph(qkv_ctx *ctx, int id, const char *dir) {
    double total = 0;
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        qkv_seed(ctx, 100 + (uint64_t)id);
        qkv_tensor *x = qkv_randn(ctx, (qkv_dtype)dt, 3, (int64_t[]){3, 70, 12}, 0, 1);
        qkv_tensor *wq = qkv_param(ctx, qkv_xavier_uniform(ctx, (qkv_dtype)dt, 12, 8));
        qkv_tensor *wk = qkv_param(ctx, qkv_xavier_uniform(ctx, (qkv_dtype)dt, 12, 8));
        qkv_tensor *wv = qkv_param(ctx, qkv_xavier_uniform(ctx, (qkv_dtype)dt, 12, 8));
        qkv_tensor *wo = qkv_param(ctx, qkv_xavier_uniform(ctx, (qkv_dtype)dt, 8, 8));
        qkv_tensor *mask = qkv_ones(ctx, QKV_U8, 3, (int64_t[]){3, 1, 70});
        if (!mask) return NAN;
        qkv_u8(mask)[69] = 0;
        qkv_tensor *attn = NULL;
        qkv_tensor *h = qkv_self_attention(ctx, x, wq, wk, wv, mask, QKV_SCALE_DEFAULT, QKV_CAUSAL, NULL);
        qkv_tensor *h2 = qkv_merge_heads(ctx, qkv_attention(ctx, qkv_split_heads(ctx, qkv_projection(ctx, x, wq, NULL), 2),
                                                            qkv_split_heads(ctx, qkv_projection(ctx, x, wk, NULL), 2),
                                                            qkv_split_heads(ctx, qkv_projection(ctx, x, wv, NULL), 2),
                                                            mask, 0.5, 0, &attn),
                                         2);
        qkv_tensor *logits = qkv_projection(ctx, qkv_add(ctx, h, qkv_scale(ctx, h2, 0.5)), wo, NULL);
        qkv_tensor *targets = qkv_zeros(ctx, QKV_I32, 2, (int64_t[]){3, 70});
        if (!targets || !logits) return NAN;
        for (int i = 0; i < 210; i++) qkv_i32(targets)[i] = i % 8;
        qkv_tensor *loss = qkv_cross_entropy(ctx, logits, targets);
        if (qkv_backward(ctx, loss, NULL) != QKV_OK) return NAN;
        char path[256];
        snprintf(path, sizeof path, "%s/wq-%d-%d.npy", dir, id, dt);
        if (qkv_npy_save(ctx, wq->grad, path) != QKV_OK) return NAN;
        qkv_tensor *back = qkv_npy_load(ctx, path);
        if (!back) return NAN;
        for (int64_t i = 0; i < back->numel; i++) total += qkv_get_flat(ctx, back, i);
        total += qkv_get_flat(ctx, loss, 0) + qkv_get_flat(ctx, attn, 5);
        unlink(path);
        qkv_step_end(ctx);
    }
    return total;
}

static void *run_job(void *arg) {
    job *j = arg;
    copy_config c = copy_default_config();
    c.seed = (uint64_t)j->id;
    c.heads = 2;
    c.wo = true;
    c.n = 40;
    c.batch = 8;
    c.eval_size = 16;
    c.threads = j->threads;
    copy_model m;
    if (!copy_model_init(&m, &c, j->err, sizeof j->err)) return NULL;
    for (int s = 0; s < 30; s++)
        if (!copy_train_step(&m, NULL)) {
            snprintf(j->err, sizeof j->err, "step %d: %s", s, qkv_errmsg(m.ctx));
            copy_model_free(&m);
            return NULL;
        }
    char path[256];
    snprintf(path, sizeof path, "%s/model-%d.safetensors", j->dir, j->id);
    double acc = 0;
    bool ok = copy_save(&m, path, j->err, sizeof j->err) && copy_load(&m, path, j->err, sizeof j->err) &&
              copy_evaluate(&m, &acc, NULL, NULL);
    unlink(path);
    if (ok) {
        j->size = model_state(&m, NULL);
        j->state = malloc(j->size);
        model_state(&m, j->state);
        j->graph_sum = attention_graph(m.ctx, j->id, j->dir) + acc;
        j->ok = j->graph_sum == j->graph_sum; /* not NaN */
        if (!j->ok) snprintf(j->err, sizeof j->err, "attention graph: %s", qkv_errmsg(m.ctx));
    }
    copy_model_free(&m);
    return NULL;
}

static void concurrent(int threads_per_context) {
    char dir[] = "/tmp/qkv-threads-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    job alone[2], together[2];
    for (int i = 0; i < 2; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        alone[i].id = i + 1;
        alone[i].threads = threads_per_context;
        snprintf(alone[i].dir, sizeof alone[i].dir, "%s", dir);
        together[i] = alone[i];
    }
    /* each job alone, one after the other */
    for (int i = 0; i < 2; i++) run_job(&alone[i]);
    /* both at once */
    pthread_t t[2];
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, run_job, &together[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_expect(alone[i].ok, "job %d alone: %s", i, alone[i].err);
        cr_expect(together[i].ok, "job %d concurrent: %s", i, together[i].err);
        if (!alone[i].ok || !together[i].ok) continue;
        cr_expect(alone[i].size == together[i].size && memcmp(alone[i].state, together[i].state, alone[i].size) == 0,
                  "job %d: the model trained concurrently differs from the one trained alone", i);
        cr_expect(memcmp(&alone[i].graph_sum, &together[i].graph_sum, sizeof(double)) == 0,
                  "job %d: the attention graph gave %.17g concurrently, %.17g alone", i, together[i].graph_sum,
                  alone[i].graph_sum);
    }
    cr_expect(alone[0].ok && alone[1].ok && alone[0].size == alone[1].size &&
                  memcmp(alone[0].state, alone[1].state, alone[0].size) != 0,
              "the two jobs (seeds 1 and 2) train different models");
    for (int i = 0; i < 2; i++) {
        free(alone[i].state);
        free(together[i].state);
    }
    rmdir(dir);
}

Test(threads, two_contexts_train_concurrently_in_two_threads) { concurrent(1); }
Test(threads, two_contexts_with_two_kernel_threads_each_train_concurrently) { concurrent(2); }
