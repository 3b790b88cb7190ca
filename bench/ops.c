/*
 * bench/ops.c — forward + backward time of the building blocks in f32, one thread, on x [32*128, 256]:
 *   embedding   table [4096, 256] (requires grad), ids i32 [32, 128] (every id 0..4095 once, shuffled)
 *   layer_norm  x, gamma, beta require grad, eps 1e-5
 *   rms_norm    x, gamma require grad, eps 1e-5
 *   gelu erf    x requires grad
 *   gelu tanh   x requires grad
 *   exp, sigmoid, tanh, softplus, abs, neg, square, clamp to [-0.5, 0.5], add 0.25, mul by 0.75   of x
 *   log, sqrt, rsqrt, pow 1.5   of b = |N(0, 1)| + 0.5 (their domain)
 *   div, maximum, minimum   x and b;  where   x and b under a u8 mask
 *   sum_dim and log_softmax along the last axis;  exp as a user-defined operator;  exp and it on [256]
 * An iteration: y = op(...), qkv_backward(y, dy), qkv_step_end. What each side does (bench/compare_ops.py
 * runs the PyTorch side):
 *   qkv      y is a new step tensor (the arena is reused: no allocation); qkv_backward takes the kept dy as
 *            y's gradient as it is, no copy (autograd/tape.c's borrows_dloss); the inputs are parameters
 *            whose gradients persist and add up (never zeroed), so the backward reads dx and writes it.
 *   PyTorch  y is a new tensor from its allocator; out.backward(dy) hands dy to the node as it is; the
 *            inputs' .grad are set to None after each iteration, so the backward writes a new dx (which it
 *            allocates) without reading an old one.
 * So qkv moves one array more per input (the old dx read). Each figure is the median of >= 5 samples; a
 * sample averages enough iterations to last >= 20 ms. GB/s counts the bytes an iteration must move at least
 * (forward: x read, y written; backward: dy and x read, dx written; embedding: rows read / written and
 * scattered).
 * Prints figures, asserts nothing.
 *
 *   build/bench/ops            the table
 *   build/bench/ops --tsv      one line per op: name, median seconds, fastest sample (compare_ops.py reads it)
 *   build/bench/ops --quick    3 shorter samples
 *   build/bench/ops --cpu-time the process's CPU time instead of the monotonic clock (on a shared, loaded
 *                              machine: charges each side only for its own cycles)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "bench.h"
#include "qkv.h"

enum { ROWS = 32 * 128, D = 256, V = 4096, MAX_SAMPLES = 15 };

static int n_samples = 7;
static double sample_seconds = 0.02;
static bool cpu_time = false;

static double now(void) {
    if (!cpu_time) return bench_now();
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef enum {
    OP_EMBEDDING, OP_LAYER_NORM, OP_RMS_NORM, OP_GELU_ERF, OP_GELU_TANH, OP_EXP, OP_SIGMOID, OP_TANH, OP_DIV,
    OP_MAXIMUM, OP_WHERE, OP_SUM_DIM, OP_LOG_SOFTMAX, OP_CUSTOM_EXP, OP_EXP_SMALL, OP_CUSTOM_EXP_SMALL,
    OP_LOG, OP_SQRT, OP_RSQRT, OP_SOFTPLUS, OP_ABS, OP_NEG, OP_SQUARE, OP_POW, OP_CLAMP, OP_ADD_SCALAR,
    OP_MUL_SCALAR, OP_MINIMUM, OP_COUNT
} op_kind;
static const char *const NAMES[OP_COUNT] = {
    "embedding", "layer_norm", "rms_norm", "gelu_erf", "gelu_tanh", "exp", "sigmoid", "tanh", "div", "maximum",
    "where", "sum_dim", "log_softmax", "custom_exp", "exp_small", "custom_exp_small", "log", "sqrt", "rsqrt",
    "softplus", "abs", "neg", "square", "pow", "clamp", "add_scalar", "mul_scalar", "minimum"};
/* bytes an iteration moves at least, in units of ROWS * D floats (0: not shown, the small ones) */
static const double TRAFFIC[OP_COUNT] = {4, 5, 5, 5, 5, 5, 5, 5, 8, 8, 7.25, 3, 5, 5, 0, 0,
                                         5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 8};

typedef struct setup {
    qkv_ctx *ctx;
    qkv_tensor *x, *gamma, *beta, *table, *ids, *dy, *dy3; /* dy3: dy as [32, 128, D] */
    qkv_tensor *b, *mask, *dy_rows;                       /* b like x, mask u8 like x, dy_rows [ROWS, 1] */
    qkv_tensor *small, *dy_small;                         /* [SMALL] */
} setup;

enum { SMALL = 256 };

/* exp as a user-defined operator (qkv/custom.h): the forward is qkv_exp, the backward dx += dy y in one loop,
 * so that custom_exp against exp is what the user-defined machinery costs. */
static qkv_status custom_exp_forward(qkv_ctx *ctx, qkv_custom_call *call) {
    call->outputs[0] = qkv_exp(ctx, call->inputs[0]);
    return qkv_error(ctx);
}
static qkv_status custom_exp_backward(qkv_ctx *ctx, qkv_custom_call *call) {
    (void)ctx;
    qkv_tensor *dx = call->grad_inputs[0];
    if (!dx) return QKV_OK;
    const float *dy = call->grad_outputs[0]->data, *y = call->outputs[0]->data;
    float *g = dx->data;
    for (int64_t i = 0; i < dx->numel; i++) g[i] += dy[i] * y[i];
    return QKV_OK;
}
static const qkv_custom_op custom_exp = {"custom_exp", 1, 1, custom_exp_forward, custom_exp_backward, NULL};

static setup make_setup(void) {
    qkv_options o = qkv_default_options();
    o.seed = 42;
    setup s;
    memset(&s, 0, sizeof s);
    s.ctx = qkv_ctx_new(&o);
    qkv_ctx *ctx = s.ctx;
    int64_t xs[2] = {ROWS, D}, ds = D, ts[2] = {V, D}, is[2] = {32, 128};
    s.x = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, xs, 0, 1));
    s.gamma = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 1, &ds, 1, 0.1));
    s.beta = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 1, &ds, 0, 0.1));
    s.table = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 2, ts, 0, 1));
    s.dy = qkv_keep(ctx, qkv_randn(ctx, QKV_F32, 2, xs, 0, 1));
    s.dy3 = qkv_keep(ctx, qkv_reshape(ctx, s.dy, 3, (int64_t[]){32, 128, D}));
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 2, is);
    int32_t *p = qkv_i32(ids);
    for (int i = 0; i < ROWS; i++) p[i] = i % V;
    uint64_t z = 7;
    for (int i = ROWS - 1; i > 0; i--) { /* shuffle */
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((z >> 33) % (uint64_t)(i + 1));
        int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    s.ids = qkv_keep(ctx, ids);
    s.b = qkv_param(ctx, qkv_add_scalar(ctx, qkv_abs(ctx, qkv_randn(ctx, QKV_F32, 2, xs, 0, 1)), 0.5));
    qkv_tensor *mask = qkv_zeros(ctx, QKV_U8, 2, xs);
    for (int64_t i = 0; mask && i < mask->numel; i++) qkv_u8(mask)[i] = (uint8_t)((i * 7 + i / 3) % 2);
    s.mask = qkv_keep(ctx, mask);
    s.dy_rows = qkv_keep(ctx, qkv_randn(ctx, QKV_F32, 2, (int64_t[]){ROWS, 1}, 0, 1));
    s.small = qkv_param(ctx, qkv_randn(ctx, QKV_F32, 1, (int64_t[]){SMALL}, 0, 1));
    s.dy_small = qkv_keep(ctx, qkv_randn(ctx, QKV_F32, 1, (int64_t[]){SMALL}, 0, 1));
    qkv_step_end(ctx);
    if (qkv_error(ctx)) {
        fprintf(stderr, "bench/ops: %s\n", qkv_errmsg(ctx));
        exit(1);
    }
    return s;
}

static void iterate(setup *s, op_kind op) {
    qkv_ctx *ctx = s->ctx;
    qkv_tensor *y = NULL, *dy = s->dy;
    switch (op) {
    case OP_EMBEDDING: y = qkv_embedding(ctx, s->table, s->ids); break;
    case OP_LAYER_NORM: y = qkv_layer_norm(ctx, s->x, s->gamma, s->beta, 1e-5); break;
    case OP_RMS_NORM: y = qkv_rms_norm(ctx, s->x, s->gamma, 1e-5); break;
    case OP_GELU_ERF: y = qkv_gelu(ctx, s->x, QKV_GELU_ERF); break;
    case OP_GELU_TANH: y = qkv_gelu(ctx, s->x, QKV_GELU_TANH); break;
    case OP_EXP: y = qkv_exp(ctx, s->x); break;
    case OP_SIGMOID: y = qkv_sigmoid(ctx, s->x); break;
    case OP_TANH: y = qkv_tanh(ctx, s->x); break;
    case OP_DIV: y = qkv_div(ctx, s->x, s->b); break;
    case OP_MAXIMUM: y = qkv_maximum(ctx, s->x, s->b); break;
    case OP_WHERE: y = qkv_where(ctx, s->mask, s->x, s->b); break;
    case OP_SUM_DIM: y = qkv_sum_dim(ctx, s->x, -1, true), dy = s->dy_rows; break;
    case OP_LOG_SOFTMAX: y = qkv_log_softmax(ctx, s->x, -1); break;
    case OP_CUSTOM_EXP: y = qkv_custom1(ctx, &custom_exp, &s->x); break;
    case OP_EXP_SMALL: y = qkv_exp(ctx, s->small), dy = s->dy_small; break;
    case OP_LOG: y = qkv_log(ctx, s->b); break; /* b = |N(0, 1)| + 0.5: in log's, sqrt's and pow's domain */
    case OP_SQRT: y = qkv_sqrt(ctx, s->b); break;
    case OP_RSQRT: y = qkv_rsqrt(ctx, s->b); break;
    case OP_SOFTPLUS: y = qkv_softplus(ctx, s->x); break;
    case OP_ABS: y = qkv_abs(ctx, s->x); break;
    case OP_NEG: y = qkv_neg(ctx, s->x); break;
    case OP_SQUARE: y = qkv_square(ctx, s->x); break;
    case OP_POW: y = qkv_pow_scalar(ctx, s->b, 1.5); break;
    case OP_CLAMP: y = qkv_clamp(ctx, s->x, -0.5, 0.5); break;
    case OP_ADD_SCALAR: y = qkv_add_scalar(ctx, s->x, 0.25); break;
    case OP_MUL_SCALAR: y = qkv_mul_scalar(ctx, s->x, 0.75); break;
    case OP_MINIMUM: y = qkv_minimum(ctx, s->x, s->b); break;
    default: y = qkv_custom1(ctx, &custom_exp, &s->small), dy = s->dy_small; break;
    }
    if (op == OP_EMBEDDING) dy = s->dy3;
    if (!y || qkv_backward(ctx, y, dy) != QKV_OK) {
        fprintf(stderr, "bench/ops: %s: %s\n", NAMES[op], qkv_errmsg(ctx));
        exit(1);
    }
    qkv_step_end(ctx);
}

/* Median and fastest seconds per iteration. */
static void time_op(setup *s, op_kind op, double *median, double *fastest) {
    iterate(s, op); /* warm up: the arena reaches its size */
    double t0 = now();
    iterate(s, op);
    double once = now() - t0;
    int inner = once > 0 ? (int)(sample_seconds / once) + 1 : 1000;
    double samples[MAX_SAMPLES];
    for (int k = 0; k < n_samples; k++) {
        double start = now();
        for (int i = 0; i < inner; i++) iterate(s, op);
        samples[k] = (now() - start) / inner;
    }
    qsort(samples, (size_t)n_samples, sizeof samples[0], bench_cmp_double);
    *median = samples[n_samples / 2];
    *fastest = samples[0];
}

int main(int argc, char **argv) {
    bool tsv = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (args_is_help(argv[i])) {
            printf("usage: ops [--tsv] [--quick] [--cpu-time] [--only NAME]\n"
                   "  forward + backward of embedding, layer norm, RMS norm and GELU on f32 [%d, %d], one thread\n"
                   "  --tsv        one tab-separated line per operator (for bench/compare_ops.py)\n"
                   "  --quick      3 short samples instead of the default\n"
                   "  --cpu-time   time by process CPU time instead of wall time (a loaded machine)\n"
                   "  --only NAME  time only this operator (for a profiler)\n", ROWS, D);
            return 0;
        }
        if (!strcmp(argv[i], "--tsv")) tsv = true;
        else if (!strcmp(argv[i], "--quick")) n_samples = 3, sample_seconds = 0.005;
        else if (!strcmp(argv[i], "--cpu-time")) cpu_time = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else return args_unknown("ops", argv[i]);
    }
    setup s = make_setup();
    if (!tsv)
        printf("building blocks, f32, forward + backward, one thread, x [%d, %d]; median of %d samples (%s)\n\n"
               "%-16s %10s %10s %8s\n",
               ROWS, D, n_samples, cpu_time ? "CPU time" : "wall time", "op", "ms", "fastest", "GB/s");
    for (int op = 0; op < OP_COUNT; op++) {
        if (only && strcmp(only, NAMES[op])) continue;
        double median, fastest;
        time_op(&s, (op_kind)op, &median, &fastest);
        if (tsv)
            printf("%s\t%.9g\t%.9g\n", NAMES[op], median, fastest);
        else if (TRAFFIC[op] > 0)
            printf("%-16s %10.4f %10.4f %8.2f\n", NAMES[op], median * 1e3, fastest * 1e3,
                   TRAFFIC[op] * ROWS * D * sizeof(float) / median * 1e-9);
        else
            printf("%-16s %10.4f %10.4f %8s\n", NAMES[op], median * 1e3, fastest * 1e3, "");
    }
    qkv_ctx_free(s.ctx);
    return 0;
}
