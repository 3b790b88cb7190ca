/*
 * test_copy_task.c — the copy-task training loop (examples/copy_model.c): the default configuration reaches
 * 100% held-out accuracy for seeds 0, 1 and 2 on every task; the same seed gives the same bits with 1 and 2
 * threads and across runs; a run saved and resumed equals an uninterrupted one, optimizer state included.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "copy_model.h"
#include "test_alloc.h"

static void init_or_die(copy_model *m, const copy_config *c) {
    char err[512];
    cr_assert(copy_model_init(m, c, err, sizeof err), "%s", err);
}

static void train(copy_model *m, int64_t until, copy_stats *last) {
    while (m->step < until) cr_assert(copy_train_step(m, last), "step %lld: %s", (long long)m->step, qkv_errmsg(m->ctx));
}

static bool same_bits(const qkv_tensor *a, const qkv_tensor *b) {
    return a->numel == b->numel && memcmp(a->data, b->data, (size_t)a->numel * qkv_dtype_size(a->dtype)) == 0;
}

Test(copy_task, default_run_reaches_100_percent_for_seeds_0_1_2_on_every_task) {
    int failures = 0;
    for (int task = TASK_COPY; task <= TASK_REVERSE; task++)
        for (uint64_t seed = 0; seed < 3; seed++) {
            copy_config c = copy_default_config();
            c.task = (copy_task_kind)task;
            c.seed = seed;
            copy_model m;
            init_or_die(&m, &c);
            train(&m, c.steps, NULL);
            double acc = 0;
            cr_assert(copy_evaluate(&m, &acc, NULL, NULL));
            if (acc != 1.0) {
                failures++;
                cr_log_error("task %s seed %llu: held-out accuracy %.4f", copy_task_name(c.task),
                             (unsigned long long)seed, acc);
            }
            copy_model_free(&m);
        }
    cr_expect_eq(failures, 0);
}

Test(copy_task, gauss_embeddings_train_too) {
    copy_config c = copy_default_config();
    c.embed = EMBED_GAUSS;
    copy_model m;
    init_or_die(&m, &c);
    train(&m, c.steps, NULL);
    double acc = 0;
    cr_assert(copy_evaluate(&m, &acc, NULL, NULL));
    cr_expect_eq(acc, 1.0, "gauss: %.4f", acc);
    copy_model_free(&m);
}

Test(copy_task, the_reverse_task_learns_the_anti_diagonal) {
    copy_config c = copy_default_config();
    copy_model m;
    init_or_die(&m, &c);
    train(&m, c.steps, NULL);
    double acc, attn[64];
    cr_assert(copy_evaluate(&m, &acc, attn, NULL));
    for (int i = 0; i < 8; i++) cr_expect_gt(attn[i * 8 + (7 - i)], 0.9, "query %d attends to key %d: %.3f", i, 7 - i, attn[i * 8 + 7 - i]);
    copy_model_free(&m);
}

/* Run 40 steps and return the final loss; parameters are copied to out (wq, wk, wv). */
static double run_steps(int threads, int64_t steps, qkv_tensor **kept, copy_model *m) {
    copy_config c = copy_default_config();
    c.threads = threads;
    c.heads = 2;
    c.wo = true;
    init_or_die(m, &c);
    copy_stats s;
    train(m, steps, &s);
    kept[0] = m->wq, kept[1] = m->wk, kept[2] = m->wv, kept[3] = m->wo;
    return s.loss;
}

Test(copy_task, same_seed_same_bits_with_1_and_2_threads_and_across_runs) {
    copy_model a, b, c;
    qkv_tensor *pa[4], *pb[4], *pc[4];
    double la = run_steps(1, 40, pa, &a), lb = run_steps(2, 40, pb, &b), lc = run_steps(1, 40, pc, &c);
    cr_expect(memcmp(&la, &lb, sizeof la) == 0, "loss %.17g (1 thread) vs %.17g (2 threads)", la, lb);
    cr_expect(memcmp(&la, &lc, sizeof la) == 0, "loss %.17g vs %.17g on a second run", la, lc);
    for (int i = 0; i < 4; i++) {
        cr_expect(same_bits(pa[i], pb[i]), "parameter %d differs between 1 and 2 threads", i);
        cr_expect(same_bits(pa[i], pc[i]), "parameter %d differs between two runs", i);
    }
    copy_model_free(&a);
    copy_model_free(&b);
    copy_model_free(&c);
}

Test(copy_task, save_then_load_resumes_exactly) {
    char dir[] = "/tmp/qkv-copy-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    for (int optimizer = QKV_OPTIM_SGD; optimizer <= QKV_OPTIM_ADAMW; optimizer++) {
        copy_config c = copy_default_config();
        c.optimizer = (qkv_optim_kind)optimizer;
        c.lr = optimizer == QKV_OPTIM_SGD ? 0.5 : 0.05;
        c.wo = true;
        copy_model whole, first, resumed;
        copy_stats s_whole, s_resumed;
        char err[1024];
        init_or_die(&whole, &c);
        train(&whole, 60, &s_whole);
        init_or_die(&first, &c);
        train(&first, 30, NULL);
        cr_assert(copy_save(&first, path, err, sizeof err), "%s", err);
        copy_model_free(&first);
        init_or_die(&resumed, &c);
        cr_assert(copy_load(&resumed, path, err, sizeof err), "%s", err);
        cr_expect_eq(resumed.step, 30);
        train(&resumed, 60, &s_resumed);
        cr_expect(memcmp(&s_whole.loss, &s_resumed.loss, sizeof(double)) == 0, "optimizer %d: loss %.17g vs %.17g",
                  optimizer, s_whole.loss, s_resumed.loss);
        cr_expect(same_bits(whole.wq, resumed.wq) && same_bits(whole.wk, resumed.wk) &&
                      same_bits(whole.wv, resumed.wv) && same_bits(whole.wo, resumed.wo),
                  "optimizer %d: parameters differ after resuming", optimizer);
        /* a checkpoint of another configuration is refused with both configurations in the message */
        copy_config other = c;
        other.d_k = 8;
        copy_model wrong;
        init_or_die(&wrong, &other);
        cr_expect(!copy_load(&wrong, path, err, sizeof err));
        cr_expect(strstr(err, "different configuration") && strstr(err, "d_k=8"), "%s", err);
        copy_model_free(&wrong);
        copy_model_free(&whole);
        copy_model_free(&resumed);
    }
    unlink(path);
    rmdir(dir);
}

Test(copy_task, after_the_first_step_a_training_step_makes_no_heap_allocation) {
    copy_config c = copy_default_config();
    c.heads = 2;
    c.wo = true;
    counting heap = {0};
    c.allocator = counting_allocator(&heap);
    copy_model m;
    init_or_die(&m, &c);
    train(&m, 1, NULL); /* the first step sizes the arena and makes the gradients */
    long before = heap.calls;
    train(&m, 50, NULL);
    cr_expect_eq(heap.calls, before, "steps 2-50 made %ld heap allocations (forward, backward, clip, Adam)",
                 heap.calls - before);
    copy_model_free(&m);
}

/* A checkpoint whose "step" metadata does not fit in 64 bits (or is not a count) is refused, not clamped. */
Test(copy_task, a_step_that_does_not_fit_is_refused) {
    char dir[] = "/tmp/qkv-copy-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256], bad[256];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    copy_config c = copy_default_config();
    copy_model m;
    char err[1024];
    init_or_die(&m, &c);
    train(&m, 2, NULL);
    cr_assert(copy_save(&m, path, err, sizeof err), "%s", err);
    qkv_ctx *ctx = m.ctx;
    qkv_safetensors *st = qkv_safetensors_load(ctx, path);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    const char *steps[] = {"99999999999999999999", "9223372036854775808", "-1", "12x"};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        qkv_named_tensor named[32];
        const char *meta[32];
        int n = qkv_safetensors_count(st), nm = 0;
        cr_assert_lt(n, 32);
        for (int i = 0; i < n; i++) {
            named[i].name = qkv_safetensors_name(st, i);
            named[i].tensor = qkv_safetensors_get(st, named[i].name);
        }
        for (int i = 0; i < qkv_safetensors_metadata_count(st); i++) {
            const char *k = qkv_safetensors_metadata_key(st, i);
            meta[nm++] = k;
            meta[nm++] = strcmp(k, "step") ? qkv_safetensors_metadata(st, k) : steps[s];
        }
        cr_assert_eq(qkv_safetensors_save(ctx, bad, named, n, meta, nm / 2), QKV_OK, "%s", qkv_errmsg(ctx));
        copy_model fresh;
        init_or_die(&fresh, &c);
        cr_expect(!copy_load(&fresh, bad, err, sizeof err), "step %s was accepted as %lld", steps[s],
                  (long long)fresh.step);
        cr_expect(strstr(err, "is not a non-negative 64-bit integer"), "%s", err);
        copy_model_free(&fresh);
    }
    qkv_safetensors_free(ctx, st);
    copy_model_free(&m);
    unlink(path);
    unlink(bad);
    rmdir(dir);
}
