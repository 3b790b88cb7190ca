/*
 * test_train.c — examples/train, run as a user runs it: it learns a small generated language (sums of two
 * digits, "3+4=7;"), resumes a saved run to the same bits as an unbroken one, samples from a checkpoint, and
 * refuses bad data and bad flags with messages that name them.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qkv.h"
#include "test_deadline.h"

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

Test(train, learns_the_sums_language_well_below_the_uniform_loss) {
    QKV_TEST_DEADLINE(300);
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

Test(train, a_run_resumed_from_its_checkpoint_ends_with_the_same_bits_as_an_unbroken_one) {
    QKV_TEST_DEADLINE(300);
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

/* The README's resume: a run of 20 steps of a 40-step schedule (--lr-steps 40, the warm-up left to its
 * default), resumed to 40, ends with the bits of an unbroken 40-step run: the default warm-up is 5% of the
 * schedule, not of the first run's --steps (which gave 1 step of warm-up against 2). */
Test(train, the_default_warmup_follows_the_schedule_so_a_resumed_run_matches_an_unbroken_one) {
    QKV_TEST_DEADLINE(300);
    make_dir();
    char data[300], args[1024], out[4096], err[4096], a[300], b[300];
    snprintf(data, sizeof data, "%s/sums.txt", dir);
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    write_sums(data, 1000, 2);
    const char *cfg = "--n-ctx 16 --d-model 16 --n-head 2 --d-mlp 32 --batch 4 --seed 3 --quiet";
    snprintf(args, sizeof args, "--data %s --steps 40 %s --save %s", data, cfg, a);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--data %s --steps 20 --lr-steps 40 %s --save %s", data, cfg, b);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--data %s --steps 40 --quiet --load %s --save %s", data, b, b);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    unsigned char *x, *y;
    long nx = file_size_and_bytes(a, &x), ny = file_size_and_bytes(b, &y);
    cr_expect(nx == ny && memcmp(x, y, (size_t)nx) == 0, "the resumed checkpoint differs from the unbroken run's");
    free(x);
    free(y);
    remove_dir();
}

/* Sampling from a checkpoint needs no --steps (it is the checkpoint's step), takes a sampling seed with --load,
 * and draws several samples, one per line: reproducible for a seed, different across seeds and samples. */
Test(train, sampling_from_a_checkpoint_needs_no_steps_and_takes_a_seed_and_a_count) {
    QKV_TEST_DEADLINE(300);
    make_dir();
    char data[300], args[1024], out[4096], err[4096], again[4096], other[4096], a[300];
    snprintf(data, sizeof data, "%s/sums.txt", dir);
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    write_sums(data, 1000, 2);
    snprintf(args, sizeof args, "--data %s --steps 30 --n-ctx 16 --d-model 16 --n-head 2 --d-mlp 32 --batch 4 --quiet "
             "--save %s", data, a);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--load %s --sample 20 --prompt 3+4= --temperature 0", a);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_expect(strncmp(out, "3+4=", 4) == 0 && strlen(out) == 4 + 20 + 1, "sample: '%s'", out);
    // several samples of a token-id model (ids print as numbers, so a line is a sample whatever it drew)
    char ids_path[300], b[300];
    snprintf(ids_path, sizeof ids_path, "%s/ids.npy", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){2000});
    for (int i = 0; i < 2000; i++) qkv_i32(ids)[i] = (i * 7 + i / 13) % 11;
    cr_assert_eq(qkv_npy_save(ctx, ids, ids_path), QKV_OK);
    qkv_ctx_free(ctx);
    snprintf(args, sizeof args, "--data %s --steps 20 --n-ctx 16 --d-model 16 --n-head 2 --d-mlp 32 --batch 4 --quiet "
             "--save %s", ids_path, b);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--load %s --sample 20 --temperature 1.5 --num-samples 3 --sample-seed 7", b);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_eq(run(args, again, sizeof again, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(out, again);
    char *line[3] = {out, NULL, NULL};
    for (int k = 1; k < 3; k++) {
        char *nl = strchr(line[k - 1], '\n');
        cr_assert_not_null(nl, "3 samples, one per line: '%s'", out);
        *nl = 0, line[k] = nl + 1;
    }
    cr_assert_not_null(strchr(line[2], '\n'));
    *strchr(line[2], '\n') = 0;
    for (int k = 0; k < 3; k++) { // 20 ids each
        int count = 0;
        for (char *p = line[k]; *p;) count++, p += strcspn(p, " "), p += *p == ' ';
        cr_expect_eq(count, 20, "sample %d: '%s'", k, line[k]);
    }
    cr_expect(strcmp(line[0], line[1]) || strcmp(line[1], line[2]), "three samples at T 1.5 all alike");
    snprintf(args, sizeof args, "--load %s --sample 20 --temperature 1.5 --sample-seed 8", b);
    cr_assert_eq(run(args, other, sizeof other, err, sizeof err), 0, "%s", err);
    other[strcspn(other, "\n")] = 0;
    cr_expect(strcmp(other, line[0]) != 0, "seeds 7 and 8 gave the same sample '%s'", other);
    cr_expect_eq(run("--load x --num-samples 2", out, sizeof out, err, sizeof err), 2);
    cr_expect(strstr(err, "--num-samples needs --sample N") != NULL, "%s", err);
    remove_dir();
}

/* SIGTERM during training: the step under way ends, the run is saved to --save and the program exits 143; the
 * checkpoint (also written every --save-every steps) resumes to the bits of an unbroken run. A CSV log and an
 * SVG of the curves are written as it goes. */
Test(train, a_signal_saves_the_run_and_periodic_checkpoints_resume_exactly) {
    QKV_TEST_DEADLINE(300);
    make_dir();
    char data[300], args[2048], out[4096], err[4096], a[300], b[300], csv[300], svg[300], cmd[4096];
    snprintf(data, sizeof data, "%s/sums.txt", dir);
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    snprintf(csv, sizeof csv, "%s/log.csv", dir);
    snprintf(svg, sizeof svg, "%s/log.svg", dir);
    write_sums(data, 1000, 2);
    const char *cfg = "--n-ctx 16 --d-model 16 --n-head 2 --d-mlp 32 --batch 4 --seed 3 --lr-steps 100000 --quiet";
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        snprintf(cmd, sizeof cmd, "exec %s --data %s --steps 100000 --save-every 7 --eval-every 5 %s --save %s "
                 "--log-csv %s --log-every 5 2>%s/stderr-bg.txt", TRAIN_EXE, data, cfg, a, csv, dir);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    struct stat st;
    for (int i = 0; i < 600 && stat(a, &st) != 0; i++) nanosleep(&(struct timespec){0, 100000000}, NULL);
    cr_assert_eq(stat(a, &st), 0, "no periodic checkpoint after 60 s");
    kill(pid, SIGTERM);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 143, "exit status %d", status);
    char bg[300];
    snprintf(bg, sizeof bg, "%s/stderr-bg.txt", dir);
    FILE *e = fopen(bg, "r");
    size_t m = e ? fread(err, 1, sizeof err - 1, e) : 0;
    err[m] = 0;
    if (e) fclose(e);
    const char *said = strstr(err, "SIGTERM at step ");
    cr_assert_not_null(said, "%s", err);
    long stopped = strtol(said + 16, NULL, 10);
    cr_assert(stopped > 0 && strstr(err, "saved the run to"), "%s", err);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_safetensors *ck = qkv_safetensors_load(ctx, a);
    cr_assert_not_null(ck, "%s", qkv_errmsg(ctx));
    cr_expect_eq(strtol(qkv_safetensors_metadata(ck, "train.step"), NULL, 10), stopped);
    qkv_safetensors_free(ctx, ck);
    qkv_ctx_free(ctx);
    // the CSV: a header, then one line per 5 steps up to the stop (validation every 5 steps too)
    FILE *f = fopen(csv, "r");
    cr_assert_not_null(f);
    char line[256];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_expect_str_eq(line, "step,train_loss,val_loss,lr,tokens_per_s,seconds\n");
    int rows = 0;
    long last_step = 0;
    while (fgets(line, sizeof line, f)) {
        last_step = strtol(line, NULL, 10);
        rows++;
        cr_expect(strstr(line, ",,") == NULL || last_step % 5 != 0, "a 5th step without validation: %s", line);
    }
    fclose(f);
    cr_expect(rows >= stopped / 5 && last_step == stopped, "%d rows, last step %ld, stopped at %ld", rows, last_step,
              stopped);
    // resumed to stopped + 6 it ends with the bits of an unbroken run to the same step
    snprintf(args, sizeof args, "--data %s --steps %ld --quiet --load %s --save %s --log-svg %s", data, stopped + 6, a,
             a, svg);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--data %s --steps %ld %s --save %s", data, stopped + 6, cfg, b);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    unsigned char *x, *y;
    long nx = file_size_and_bytes(a, &x), ny = file_size_and_bytes(b, &y);
    cr_expect(nx == ny && memcmp(x, y, (size_t)nx) == 0, "resumed after SIGTERM at %ld: differs from unbroken", stopped);
    free(x);
    free(y);
    f = fopen(svg, "r");
    cr_assert_not_null(f, "--log-svg wrote nothing");
    cr_expect(fgets(line, sizeof line, f) && strstr(line, "<svg") != NULL, "%s", line);
    fclose(f);
    remove_dir();
}

/* What is not a file of tokens is refused before it is read, naming what it is. */
Test(train, the_data_path_refuses_fifos_devices_huge_ids_and_raw_files_of_unknown_width) {
    QKV_TEST_DEADLINE(120);
    make_dir();
    char path[300], args[1024], out[4096], err[4096];
    snprintf(path, sizeof path, "%s/fifo", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    snprintf(args, sizeof args, "--data %s --steps 5", path); // used to block forever in fopen
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "not a regular file (a FIFO)") != NULL, "%s", err);
    cr_expect_eq(run("--data /dev/zero --steps 5", out, sizeof out, err, sizeof err), 1); // used to read 4 GB
    cr_expect(strstr(err, "/dev/zero: not a regular file (a device or socket)") != NULL, "%s", err);
    // ids at the top of int32: named with the vocabulary they imply, not an overflow or a bare out-of-memory
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    const int32_t huge[2] = {2147483647, 2147483646};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/huge%d.npy", dir, k);
        qkv_tensor *ids = qkv_zeros(ctx, QKV_I32, 1, (int64_t[]){100});
        qkv_i32(ids)[42] = huge[k];
        cr_assert_eq(qkv_npy_save(ctx, ids, path), QKV_OK);
        snprintf(args, sizeof args, "--data %s --steps 5 --n-ctx 8", path);
        cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
        char want[160];
        snprintf(want, sizeof want, "id %d at position 42 implies a vocabulary of %lld tokens", huge[k],
                 (long long)huge[k] + 1);
        cr_expect(strstr(err, want) != NULL, "%s", err);
    }
    qkv_ctx_free(ctx);
    // nanoGPT's train.bin: uint16 ids; refused without --token-dtype, trained with it, refused at an odd size
    snprintf(path, sizeof path, "%s/train.bin", dir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 600; i++) {
        uint16_t id = (uint16_t)(i % 7 == 0 ? 300 : i % 5); // ids up to 300: more than a byte
        fwrite(&id, 2, 1, f);
    }
    fclose(f);
    snprintf(args, sizeof args, "--data %s --steps 2 --n-ctx 8 --d-model 8 --n-head 2 --quiet --json", path);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "say which with --token-dtype u16") != NULL, "%s", err);
    snprintf(args, sizeof args, "--data %s --token-dtype u16 --steps 2 --n-ctx 8 --d-model 8 --n-head 2 --quiet --json",
             path);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_expect_eq(json_number(out, "vocab"), 301);
    f = fopen(path, "ab");
    fputc(1, f);
    fclose(f);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "1201 bytes is not a whole number of 2-byte ids") != NULL, "%s", err);
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
    // numbers are parsed strictly: a blank before is refused as one after is
    cr_expect_eq(run("--data x --steps ' 5'", out, sizeof out, err, sizeof err), 2);
    cr_expect(strstr(err, "--steps needs an integer in [0, 1099511627776], got ' 5'") != NULL, "%s", err);
    cr_expect_eq(run("--data x --lr ' 1e-3'", out, sizeof out, err, sizeof err), 2);
    cr_expect_eq(run("--data x --lr 0", out, sizeof out, err, sizeof err), 2);
    cr_expect(strstr(err, "--lr 0 would train nothing") != NULL, "%s", err);
    // the configuration's errors name the flags that set it
    snprintf(args, sizeof args, "--data %s/short.txt --d-model 12 --n-head 5 --n-ctx 2", dir);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1);
    cr_expect(strstr(err, "--d-model 12 is not divisible by --n-head 5") != NULL, "%s", err);
    remove_dir();
}

/* The gated MLPs, the attention biases, grouped-query attention, the initial stds and an attention variant from
 * the command line: a SwiGLU model with biases, one key/value head, sinks and a head gate trains, its checkpoint records all
 * of them (and holds W_gate, b_O and a W_K of one
 * head), resuming it continues, and --load with another activation is refused naming the flag. */
Test(train, gated_mlps_and_attention_biases_train_save_and_resume) {
    QKV_TEST_DEADLINE(300);
    make_dir();
    char data[300], args[1024], out[4096], err[4096], a[300];
    snprintf(data, sizeof data, "%s/sums.txt", dir);
    snprintf(a, sizeof a, "%s/gated.safetensors", dir);
    write_sums(data, 1000, 3);
    snprintf(args, sizeof args, "--data %s --steps 20 --n-ctx 16 --d-model 16 --n-head 2 --d-mlp 32 --batch 4 --quiet "
             "--activation swiglu --attn-bias --norm rms --positions rope --n-kv-head 1 --init-embed-std 1 "
             "--init-resid-std 0.25 --attn-variant sink --attn-gate head --save %s", data, a);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_safetensors *st = qkv_safetensors_load(ctx, a);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.activation"), "swiglu");
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.attn_bias"), "true");
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.n_kv_head"), "1");
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.init_embed_std"), "1");
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.init_resid_std"), "0.25");
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.init_std"), "0.02");
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.attn_variant"), "sink");
    cr_expect_not_null(qkv_safetensors_get(st, "blocks.0.attn.sink"));
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.attn_gate"), "head");
    const qkv_tensor *wg = qkv_safetensors_get(st, "blocks.1.attn.W_G"), *bg = qkv_safetensors_get(st, "blocks.1.attn.b_G");
    cr_expect(wg && wg->shape[0] == 16 && wg->shape[1] == 2, "W_G of a head gate: [d_model 16, n_head 2]");
    cr_expect(bg && bg->shape[0] == 2, "b_G [n_head 2] with --attn-bias");
    const qkv_tensor *wk = qkv_safetensors_get(st, "blocks.0.attn.W_K");
    cr_expect(wk && wk->shape[0] == 16 && wk->shape[1] == 8, "W_K of one key/value head of 8: [16, 8]");
    cr_expect_not_null(qkv_safetensors_get(st, "blocks.0.mlp.W_gate"));
    cr_expect_not_null(qkv_safetensors_get(st, "blocks.1.attn.b_O"));
    qkv_safetensors_free(ctx, st);
    qkv_ctx_free(ctx);
    snprintf(args, sizeof args, "--data %s --load %s --steps 30 --quiet --save %s", data, a, a);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 0, "resume: %s", err);
    snprintf(args, sizeof args, "--data %s --load %s --steps 40 --activation geglu --quiet", data, a);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 2, "%s", err);
    cr_expect(strstr(err, "--activation") != NULL, "%s", err);
    remove_dir();
}

/* Differential attention from the command line: --attn-diff trains and its checkpoint records it with lambda's
 * vectors; with --attn-variant it is refused naming both flags. */
Test(train, differential_attention_trains_and_refuses_a_variant) {
    QKV_TEST_DEADLINE(300);
    make_dir();
    char data[300], args[1024], out[4096], err[4096], a[300];
    snprintf(data, sizeof data, "%s/sums.txt", dir);
    snprintf(a, sizeof a, "%s/diff.safetensors", dir);
    write_sums(data, 1000, 3);
    snprintf(args, sizeof args, "--data %s --steps 10 --n-ctx 16 --d-model 16 --n-head 2 --d-mlp 32 --batch 4 --quiet "
             "--positions rope --attn-diff --save %s", data, a);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_safetensors *st = qkv_safetensors_load(ctx, a);
    cr_assert_not_null(st, "%s", qkv_errmsg(ctx));
    cr_expect_str_eq(qkv_safetensors_metadata(st, "qkv.model.attn_diff"), "true");
    const qkv_tensor *lq = qkv_safetensors_get(st, "blocks.1.attn.lambda_q1");
    cr_expect(lq && lq->shape[0] == 4, "lambda_q1 [d_head / 2 = 4]");
    qkv_safetensors_free(ctx, st);
    qkv_ctx_free(ctx);
    snprintf(args, sizeof args, "--data %s --steps 2 --n-ctx 16 --d-model 16 --n-head 2 --quiet --attn-diff "
             "--attn-variant sigmoid", data);
    cr_expect_eq(run(args, out, sizeof out, err, sizeof err), 1, "%s", err); // the library refused the model
    cr_expect(strstr(err, "--attn-diff with --attn-variant other than softmax") != NULL, "%s", err);
    remove_dir();
}
