/*
 * replay.c — the fuzz targets as a Criterion test (tests/meson.build builds it as test_fuzz_replay with gcc
 * and in the ASan/UBSan build, no libFuzzer needed): every file of the committed seed corpus
 * (fuzz/corpus/<target>/) and every input that once broke a target (fuzz/regress/<target>/) goes through
 * the target's entry point, whose invariant checks count failures here instead of aborting. Built with
 * -DQKV_FUZZ_REPLAY_MISUSE (fuzz/meson.build: test_fuzz_misuse_replay, with the misuse classes that are off
 * there) it replays fuzz_misuse instead of the other three.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qkv.h"

long qkv_fuzz_failures;

int qkv_fuzz_npy(const uint8_t *data, size_t size);
int qkv_fuzz_safetensors(const uint8_t *data, size_t size);
int qkv_fuzz_graph(const uint8_t *data, size_t size);
int qkv_fuzz_misuse(const uint8_t *data, size_t size);

typedef int (*entry_fn)(const uint8_t *, size_t);

static unsigned char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            unsigned char *bigger = realloc(buf, cap *= 2);
            if (!bigger) free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    *size = n;
    return buf;
}

/* Run every regular file of dir through fn; returns how many; logs the files that failed. */
static int replay_dir(const char *dir, entry_fn fn) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st; /* regular files only: fuzz/regress/misuse/unfixed/ holds findings not replayed yet */
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        size_t size = 0;
        unsigned char *data = read_all(path, &size);
        if (!data) continue;
        long before = qkv_fuzz_failures;
        fn(data, size);
        if (qkv_fuzz_failures != before) cr_log_error("%s broke an invariant (see stderr)", path);
        free(data);
        files++;
    }
    closedir(d);
    return files;
}

static void replay(const char *target, entry_fn fn, int min_seeds) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/corpus/%s", QKV_FUZZ_DIR, target);
    int seeds = replay_dir(dir, fn);
    snprintf(dir, sizeof dir, "%s/regress/%s", QKV_FUZZ_DIR, target);
    int regress = replay_dir(dir, fn);
    cr_expect_geq(seeds, min_seeds, "%s: %d seed files found in fuzz/corpus/%s", target, seeds, target);
    cr_expect_eq(qkv_fuzz_failures, 0, "%s: %ld invariant failures over %d seeds and %d regression inputs",
                 target, qkv_fuzz_failures, seeds, regress);
}

#ifdef QKV_FUZZ_REPLAY_MISUSE
Test(fuzz_replay, misuse_seed_corpus_and_regressions, .timeout = 300) { replay("misuse", qkv_fuzz_misuse, 10); }
#else
Test(fuzz_replay, npy_seed_corpus_and_regressions) { replay("npy", qkv_fuzz_npy, 10); }
Test(fuzz_replay, safetensors_seed_corpus_and_regressions) { replay("safetensors", qkv_fuzz_safetensors, 10); }
Test(fuzz_replay, graph_seed_corpus_and_regressions) { replay("graph", qkv_fuzz_graph, 10); }

#endif

/* ---- the inputs that broke a target, one named test each: the input itself, then the fix checked directly */

static void replay_one(const char *target, const char *name, entry_fn fn) {
    char path[4096];
    snprintf(path, sizeof path, "%s/regress/%s/%s", QKV_FUZZ_DIR, target, name);
    size_t size = 0;
    unsigned char *data = read_all(path, &size);
    cr_assert_not_null(data, "%s is missing", path);
    long before = qkv_fuzz_failures;
    fn(data, size);
    free(data);
    cr_expect_eq(qkv_fuzz_failures, before, "%s broke an invariant again", name);
}

#ifdef QKV_FUZZ_REPLAY_MISUSE
/* fuzz_misuse: the inputs that crashed it or broke an invariant in classes whose fixes were not in yet. With
 * the class off (fuzz/meson.build's misuse_off) an input replays without its misuse and passes; once the class
 * is on, it replays the misuse itself. The first line of each comment is the sanitizer's (or the invariant's). */
static const char *misuse_classes_off(void) {
    static char off[256];
    off[0] = '\0';
#define QKV_CLASS_OFF_(name, on)                                                                           \
    if (!(on)) strcat(off, " " name);
#if defined(QKV_MISUSE_STALE)
    QKV_CLASS_OFF_("STALE", QKV_MISUSE_STALE)
#endif
#if defined(QKV_MISUSE_FREED)
    QKV_CLASS_OFF_("FREED", QKV_MISUSE_FREED)
#endif
#if defined(QKV_MISUSE_FREED_UNDER_OPTIM)
    QKV_CLASS_OFF_("FREED_UNDER_OPTIM", QKV_MISUSE_FREED_UNDER_OPTIM)
#endif
#if defined(QKV_MISUSE_GRAD_FREE)
    QKV_CLASS_OFF_("GRAD_FREE", QKV_MISUSE_GRAD_FREE)
#endif
#if defined(QKV_MISUSE_FOREIGN)
    QKV_CLASS_OFF_("FOREIGN", QKV_MISUSE_FOREIGN)
#endif
#if defined(QKV_MISUSE_GRADCHECK)
    QKV_CLASS_OFF_("GRADCHECK", QKV_MISUSE_GRADCHECK)
#endif
#if defined(QKV_MISUSE_XENT)
    QKV_CLASS_OFF_("XENT", QKV_MISUSE_XENT)
#endif
#if defined(QKV_MISUSE_TINY_EPS)
    QKV_CLASS_OFF_("TINY_EPS", QKV_MISUSE_TINY_EPS)
#endif
#if defined(QKV_MISUSE_THREADS)
    QKV_CLASS_OFF_("THREADS", QKV_MISUSE_THREADS)
#endif
#if defined(QKV_MISUSE_EMPTY)
    QKV_CLASS_OFF_("EMPTY", QKV_MISUSE_EMPTY)
#endif
#if defined(QKV_MISUSE_FILES)
    QKV_CLASS_OFF_("FILES", QKV_MISUSE_FILES)
#endif
#undef QKV_CLASS_OFF_
    return off[0] ? off : " none";
}

static void replay_misuse(const char *name) {
    cr_log_info("fuzz/regress/misuse/%s, misuse classes off:%s", name, misuse_classes_off());
    replay_one("misuse", name, qkv_fuzz_misuse);
}

/* STALE. ERROR: AddressSanitizer: heap-use-after-free in qkv_check_tensor_ (tensor/tensor.c:148) from
 * qkv_backward: a step that outgrew its first 512-byte arena chunk, qkv_step_end (which frees the extra
 * chunks, tensor/ctx.c:230), then a tensor of that step passed to qkv_backward: the epoch check reads the
 * freed header. */
Test(fuzz_regress_misuse, stale_step_tensor_after_its_arena_chunk_was_freed) {
    replay_misuse("stale-step-tensor-after-arena-chunk-freed");
}

/* FREED. ERROR: AddressSanitizer: heap-use-after-free in qkv_check_tensor_ (tensor/tensor.c:148) from
 * qkv_backward: qkv_free of a persistent tensor, then that tensor passed to qkv_backward as the loss. */
Test(fuzz_regress_misuse, freed_parameter_passed_to_backward) { replay_misuse("freed-param-passed-to-backward"); }

/* FOREIGN. fuzz invariant: qkv_relu accepted a stale, freed or foreign handle: qkv_full on B, then
 * qkv_relu(A, that tensor) succeeds (a result in A's arena computed from B's memory). */
Test(fuzz_regress_misuse, tensor_of_another_context_accepted) { replay_misuse("foreign-tensor-accepted-by-relu"); }

/* GRADCHECK. ERROR: AddressSanitizer: heap-use-after-free in qkv_check_tensor_ from qkv_scale from the
 * gradcheck function: a function that calls qkv_step_end frees the arena chunks holding the step inputs,
 * and qkv_gradcheck (autograd/gradcheck.c:115) calls it again with them. */
Test(fuzz_regress_misuse, gradcheck_function_that_ends_the_step) { replay_misuse("gradcheck-fn-ends-the-step"); }

/* XENT. ERROR: AddressSanitizer: SEGV in cross_entropy_backward (ops/cross_entropy.c:300): the backward
 * reads the targets tensor again, after the program set a target to INT32_MAX (the forward had checked
 * them). */
Test(fuzz_regress_misuse, cross_entropy_backward_rereads_changed_targets) {
    replay_misuse("cross-entropy-backward-rereads-targets");
}

/* TINY_EPS. fuzz invariant: qkv_layer_norm: element 0 is -nan, outside the bound 1 its inputs give: an f32
 * qkv_layer_norm (and qkv_rms_norm) of a constant row with eps 1e-300, which is > 0 as the double the API
 * takes but 0 as a float, gives 0 / 0 (f64 gives 0, as documented for a constant row). */
Test(fuzz_regress_misuse, f32_norm_with_an_eps_that_is_zero_as_a_float) {
    replay_misuse("tiny-eps-f32-layer-norm-nan");
}

/* FILES (hand-written: the fuzzer's alarm interrupts the open, so it saw a slow input, not a hang). qkv_npy_load
 * (and qkv_safetensors_load) of a FIFO with no writer blocks in open() for ever; of /dev/zero it reads until
 * the allocator refuses (32 MiB under the fuzz allocator's budget; without one, until memory runs out):
 * fuzz invariant: qkv_npy_load read /dev/zero until memory ran out. */
Test(fuzz_regress_misuse, loading_a_fifo_does_not_block, .timeout = 60) { replay_misuse("npy-load-of-a-fifo-blocks"); }
Test(fuzz_regress_misuse, loading_dev_zero_is_refused) { replay_misuse("npy-load-of-dev-zero-never-ends"); }

/* EMPTY (huge dimensions). tensor/tensor.c:312: runtime error: signed integer overflow: 1073741824 +
 * 9223372036854775807: qkv_xavier_uniform(ctx, dtype, 1 << 30, INT64_MAX) adds fan_in + fan_out in int64_t
 * before the shape check could refuse the [2^30, 2^63 - 1] tensor. */
Test(fuzz_regress_misuse, xavier_uniform_of_huge_fans_does_not_overflow) {
    replay_misuse("xavier-uniform-fan-sum-overflow");
}

#else
/* ops/binary.c: a + b with an empty trailing-dimension bias (a [2, 0], b [0]) divided by b's numel, 0, in the
 * bias gradient (UBSan: division by zero; SIGFPE without it). */
Test(fuzz_regress, empty_bias_gradient_divided_by_zero) {
    replay_one("graph", "empty-bias-division-by-zero", qkv_fuzz_graph);
    for (int dt = QKV_F32; dt <= QKV_F64; dt++) {
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        qkv_tensor *a = qkv_zeros(ctx, (qkv_dtype)dt, 2, (int64_t[]){2, 0});
        qkv_tensor *b = qkv_zeros(ctx, (qkv_dtype)dt, 1, (int64_t[]){0});
        qkv_set_requires_grad(ctx, a, true);
        qkv_set_requires_grad(ctx, b, true);
        qkv_tensor *loss = qkv_sum(ctx, qkv_sub(ctx, qkv_add(ctx, a, b), qkv_mul(ctx, a, b)));
        cr_expect_eq(qkv_backward(ctx, loss, NULL), QKV_OK, "%s", qkv_errmsg(ctx));
        cr_expect(b->grad && b->grad->numel == 0);
        qkv_ctx_free(ctx);
    }
}

/* ops/heads.c: an empty x [1, 3, 0] split into 2^30 heads moves nothing, but looped 2^30 * 3 times (a hang:
 * the fuzzer's 10-second timeout). */
Test(fuzz_regress, splitting_an_empty_tensor_into_many_heads_does_not_hang, .timeout = 20) {
    replay_one("graph", "split-empty-into-2e30-heads-hang", qkv_fuzz_graph);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *x = qkv_zeros(ctx, QKV_F32, 3, (int64_t[]){1, 3, 0});
    qkv_set_requires_grad(ctx, x, true);
    qkv_tensor *y = qkv_split_heads(ctx, x, 1 << 30);
    cr_assert_not_null(y, "%s", qkv_errmsg(ctx));
    cr_expect(y->shape[0] == (int64_t)1 << 30 && y->shape[1] == 3 && y->shape[2] == 0);
    qkv_tensor *z = qkv_merge_heads(ctx, y, 1 << 30);
    cr_assert_not_null(z, "%s", qkv_errmsg(ctx));
    cr_expect(z->shape[0] == 1 && z->shape[1] == 3 && z->shape[2] == 0);
    cr_expect_eq(qkv_backward(ctx, qkv_sum(ctx, z), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}

/* ops/matmul.c: a [0, m, k] with a huge m (a legal empty tensor) overflowed m * k in the batch stride (UBSan:
 * signed integer overflow). Since then an empty tensor obeys the size bound of a full one (qkv.h,
 * QKV_MAX_NUMEL): [0, 2^62, 5] is refused, and the largest m that is not, 2^57 with k = 5, multiplies. */
Test(fuzz_regress, matmul_of_an_empty_batch_with_huge_rows_does_not_overflow) {
    replay_one("graph", "matmul-empty-batch-stride-overflow", qkv_fuzz_graph);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    cr_expect_null(qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){0, (int64_t)1 << 62, 5}));
    cr_expect_eq(qkv_error(ctx), QKV_ERR_OVERFLOW, "%s", qkv_errmsg(ctx));
    qkv_clear_error(ctx);
    qkv_tensor *a = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){0, (int64_t)1 << 57, 5});
    qkv_tensor *b = qkv_zeros(ctx, QKV_F64, 3, (int64_t[]){0, 7, 5});
    qkv_set_requires_grad(ctx, a, true);
    qkv_set_requires_grad(ctx, b, true);
    qkv_tensor *c = qkv_matmul(ctx, a, b, QKV_TRANS_B);
    cr_assert_not_null(c, "%s", qkv_errmsg(ctx));
    cr_expect(c->shape[0] == 0 && c->shape[1] == (int64_t)1 << 57 && c->shape[2] == 7);
    cr_expect_eq(qkv_backward(ctx, qkv_sum(ctx, c), NULL), QKV_OK, "%s", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
}
#endif
