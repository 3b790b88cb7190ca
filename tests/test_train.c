/*
 * test_train.c — examples/train, run as a user runs it: it learns a small generated language (sums of two
 * digits, "3+4=7;"), resumes a saved run to the same bits as an unbroken one, samples from a checkpoint, and
 * refuses bad data and bad flags with messages that name them.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qkv.h"

#ifndef TRAIN_EXE
#error "TRAIN_EXE must name the train program"
#endif

static char dir[256];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/qkv-test-train-%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static void remove_dir(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* Lines "a+b=c;" for a, b in 0..9 in a seeded order: the answer is a function of the prompt, so a model that
 * learns addition predicts the digits after '=' exactly; the rest (which pair comes next) is random. */
static void write_sums(const char *path, int count, unsigned seed) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < count; i++) {
        seed = seed * 1103515245u + 12345u;
        int a = (int)((seed >> 16) % 10);
        seed = seed * 1103515245u + 12345u;
        int b = (int)((seed >> 16) % 10);
        fprintf(f, "%d+%d=%d;", a, b, a + b);
    }
    fclose(f);
}

/* Run the program with args; capture stdout into out (and stderr into err); return its exit status. */
static int run(const char *args, char *out, size_t out_size, char *err, size_t err_size) {
    char cmd[2048], err_path[300];
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", TRAIN_EXE, args, err_path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, out_size - 1, p);
    out[n] = 0;
    int status = pclose(p);
    FILE *e = fopen(err_path, "r");
    size_t m = e ? fread(err, 1, err_size - 1, e) : 0;
    err[m] = 0;
    if (e) fclose(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static double json_number(const char *json, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    cr_assert_not_null(at, "no %s in %s", key, json);
    return strtod(at + strlen(pattern), NULL);
}

#define SMALL "--n-ctx 24 --d-model 32 --n-head 2 --n-layer 2 --d-mlp 64 --batch 16 --lr 3e-3 --quiet --json"

Test(train, learns_the_sums_language_well_below_the_uniform_loss, .timeout = 300) {
    make_dir();
    char data[300], args[1024], out[4096], err[4096];
    snprintf(data, sizeof data, "%s/sums.txt", dir);
    write_sums(data, 4000, 1);
    snprintf(args, sizeof args, "--data %s --steps 300 --eval-every 0 " SMALL, data);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    double val = json_number(out, "val_loss"), first_guess = 5.545; // log(256): a uniform byte model
    // Per "a+b=c;" line (6.45 bytes on average) the pair (a, b) carries log(100) = 4.61 nats and the rest
    // follows from it: 0.71 nats per byte for a model that adds, 1.12 for one that knows the format and the
    // distribution of the sum but not the sum itself, 2.3 for byte frequencies alone, 5.55 uniform.
    // Measured (one run each, on a loaded 2-core machine): seeds 0, 1, 2 end at 1.134, 1.154, 1.125 after these
    // 300 steps (600 steps of a wider model reach 0.96-0.99: addition is being learned, slowly). The bound 1.3
    // says the format and the sum's distribution were learned, with margin, and cannot be met by frequencies.
    cr_expect(val < 1.3, "validation loss %g nats per byte (uniform: %g)", val, first_guess);
    cr_expect(json_number(out, "tokens_per_s") > 0);
    cr_expect_eq(json_number(out, "steps"), 300);
    remove_dir();
}

static long file_size_and_bytes(const char *path, unsigned char **bytes) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *bytes = malloc((size_t)n);
    cr_assert_eq(fread(*bytes, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return n;
}

Test(train, a_run_resumed_from_its_checkpoint_ends_with_the_same_bits_as_an_unbroken_one, .timeout = 300) {
    make_dir();
    char data[300], args[1024], out[4096], err[4096], a[300], b[300], c[300];
    snprintf(data, sizeof data, "%s/sums.txt", dir);
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    snprintf(c, sizeof c, "%s/c.safetensors", dir);
    write_sums(data, 1000, 2);
    const char *cfg = "--n-ctx 16 --d-model 16 --n-head 2 --d-mlp 32 --batch 4 --dropout 0.1 --seed 3 --quiet";
    snprintf(args, sizeof args, "--data %s --steps 40 --eval-every 10 %s --save %s", data, cfg, a);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--data %s --steps 20 --lr-steps 40 --warmup 2 --eval-every 10 %s --save %s", data,
             cfg, b);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--data %s --steps 40 --eval-every 10 --quiet --load %s --save %s", data, b, c);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    unsigned char *x, *y;
    long nx = file_size_and_bytes(a, &x), ny = file_size_and_bytes(c, &y);
    cr_expect_eq(nx, ny);
    cr_expect(nx == ny && memcmp(x, y, (size_t)nx) == 0, "the resumed checkpoint differs from the unbroken run's");
    free(x);
    free(y);
    // sampling from the checkpoint: reproducible, printable bytes of the language
    snprintf(args, sizeof args, "--load %s --steps 40 --sample 30 --prompt 3+4= --temperature 0", c);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_expect(strncmp(out, "3+4=", 4) == 0 && strlen(out) == 4 + 30 + 1, "sample: '%s'", out);
    char again[4096];
    cr_assert_eq(run(args, again, sizeof again, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(out, again);
    // a model flag or a recipe flag with --load, and --steps below the checkpoint's step, are refused
    snprintf(args, sizeof args, "--data %s --load %s --steps 50 --lr 1e-2", data, c);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 2);
    cr_expect(strstr(err, "--lr: with --load the training recipe comes from the checkpoint") != NULL, "%s", err);
    snprintf(args, sizeof args, "--load %s --d-model 8", c);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 2);
    cr_expect(strstr(err, "--d-model: with --load the model's configuration") != NULL, "%s", err);
    snprintf(args, sizeof args, "--data %s --load %s --steps 10", data, c);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "is at step 40, past --steps 10") != NULL, "%s", err);
    remove_dir();
}

Test(train, bad_data_and_bad_flags_are_refused_with_messages_naming_them) {
    make_dir();
    char path[300], args[1024], out[4096], err[4096];
    // shorter than one sequence
    snprintf(path, sizeof path, "%s/short.txt", dir);
    FILE *f = fopen(path, "w");
    fputs("1+1=2;", f);
    fclose(f);
    snprintf(args, sizeof args, "--data %s --n-ctx 16 --steps 5", path);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "each need at least n_ctx + 1 = 17") != NULL, "%s", err);
    // a float .npy
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    snprintf(path, sizeof path, "%s/floats.npy", dir);
    qkv_npy_save(ctx, qkv_zeros(ctx, QKV_F32, 1, (int64_t[]){100}), path);
    snprintf(args, sizeof args, "--data %s --steps 5", path);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "the ids are f32; token ids must be integers") != NULL, "%s", err);
    // i32 ids load, and an id past --vocab is named
    snprintf(path, sizeof path, "%s/ids.npy", dir);
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){200});
    qkv_i32(ids)[150] = 9;
    qkv_npy_save(ctx, ids, path);
    snprintf(args, sizeof args, "--data %s --steps 5 --vocab 5 --n-ctx 8", path);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "holds id 9 but the model's vocabulary is 5") != NULL, "%s", err);
    qkv_ctx_free(ctx);
    // flags
    cr_expect_eq(run("--help", out, sizeof out, err, sizeof err), 0);
    cr_expect(strstr(out, "--data FILE") != NULL);
    cr_expect_eq(run("--data x --d-model 12 --n-head 5 --steps 1", out, sizeof out, err, sizeof err), 1);
    cr_expect_eq(run("--bogus", out, sizeof out, err, sizeof err), 2);
    cr_expect(strstr(err, "unknown flag --bogus") != NULL, "%s", err);
    cr_expect_eq(run("--data x --norm batch", out, sizeof out, err, sizeof err), 2);
    cr_expect(strstr(err, "--norm needs one of none|layer|rms, got 'batch'") != NULL, "%s", err);
    cr_expect_eq(run("--data x --steps -3", out, sizeof out, err, sizeof err), 2);
    cr_expect(strstr(err, "--steps") != NULL, "%s", err);
    snprintf(args, sizeof args, "--data %s/short.txt --d-model 12 --n-head 5 --n-ctx 2", dir);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "config.d_model 12 is not divisible by config.n_head 5") != NULL, "%s", err);
    remove_dir();
}
