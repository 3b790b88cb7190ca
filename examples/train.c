/*
 * train.c — train a small decoder (qkv/model.h) on a user's own tokens, save it, resume it, sample from it.
 *
 *   build/examples/train --data corpus.txt --steps 2000 --save model.safetensors
 *   build/examples/train --load model.safetensors --sample 200 --prompt "Once"
 *
 * Data: a regular file (a FIFO or device is refused before it is opened): a .npy file of integer token ids
 * (any shape, read in C order; i32, or int64 ids that fit), raw little-endian ids with --token-dtype u8|u16|i32
 * (nanoGPT's train.bin is u16; a .bin without it is refused, its width unknown), or any other file, text or
 * not, as raw bytes (a byte-level vocabulary of 256). Ids imply a vocabulary of at most 2^24 unless --vocab
 * says more (an id of 2^31 - 1 is refused, named, not an out-of-memory error). The last --val-frac of the tokens is the
 * validation split. A training batch is --batch windows of n_ctx + 1 tokens at offsets drawn from
 * (seed, step), so a run is a function of its flags, and --load resumes it to the same bits: the model, the
 * AdamW moments, the step count and the training recipe (--lr, --warmup, --lr-steps, --weight-decay, --clip,
 * --batch, --val-frac) travel in the checkpoint, the batches and dropout masks are re-derived from the step.
 * --steps is the total number of steps, counted from 0 (a resumed run trains the rest; with --load and no
 * --steps, none: to sample).
 * Learning rate: linear warm-up over --warmup steps (default 5% of --lr-steps), then cosine decay to lr/10 at
 * --lr-steps (default --steps; a run meant to be resumed later to N steps is started with --lr-steps N).
 * Stopping: --save-every K saves every K steps; SIGINT/SIGTERM end the step under way, save to --save, and
 * exit 128 + the signal. Numbers in flags are parsed strictly (no blanks); --lr 0 is refused.
 * Validation: the mean next-token loss (nats per token) over --eval-batches fixed batches of the
 * validation split, with recording off (so without dropout).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "atomic_file.h"
#include "plot.h"
#include "qkv.h"

#define PROG "train"

typedef enum token_dtype { TOKENS_AUTO = 0, TOKENS_U8, TOKENS_U16, TOKENS_I32 } token_dtype;

typedef struct train_flags {
    const char *data, *save, *load, *prompt, *save_best, *log_csv, *log_svg;
    int64_t steps, batch, eval_every, eval_batches, log_every, sample, top_k, threads, save_every, num_samples;
    double lr, warmup_frac, weight_decay, clip, val_frac, temperature;
    int64_t warmup, lr_steps;
    uint64_t sample_seed;
    token_dtype token_dtype;
    bool quiet, json, clip_off, steps_given, sample_seed_given;
    const char *first_recipe_flag; /* a training-recipe flag was given (not allowed with --load) */
    qkv_model_config cfg;
    bool cfg_flag_given; /* a model flag was given (not allowed with --load) */
    const char *first_cfg_flag;
} train_flags;

static void usage(FILE *f) {
    fprintf(f,
            "usage: " PROG " --data FILE [flags]      train a decoder on FILE's tokens\n"
            "       " PROG " --load CKPT --sample N  generate N tokens from a checkpoint\n"
            "data and budget:\n"
            "  --data FILE          a regular file: .npy of integer ids; raw token ids with --token-dtype; any\n"
            "                       other file (text or not) as bytes, vocab 256 (a .bin needs --token-dtype)\n"
            "  --token-dtype u8|u16|i32  --data holds raw little-endian ids of that type (nanoGPT's train.bin: u16)\n"
            "  --steps N            total training steps, counted from 0 (default 1000; with --load, the\n"
            "                       checkpoint's step: no training, e.g. to sample)\n"
            "  --batch B            sequences per step (default 16)\n"
            "  --val-frac F         last fraction of the tokens held out for validation (default 0.1)\n"
            "  --eval-every K       validation every K steps and at the end (default 100; 0: end only)\n"
            "  --eval-batches K     validation batches (default 8)\n"
            "optimiser (AdamW, PyTorch's update):\n"
            "  --lr X (3e-3, > 0)  --warmup N (steps, default 5%% of --lr-steps)  --weight-decay X (0.01)\n"
            "  --lr-steps N         length of the cosine schedule (default --steps)\n"
            "  --clip X|off         clip the global gradient norm to X (default 1)\n"
            "model (qkv_model_config; defaults as in qkv/model.h unless said):\n"
            "  --vocab V            (.npy data only; default: the largest id + 1)\n"
            "  --n-ctx N (64)  --d-model D (128)  --n-layer L (2)  --n-head H (4)  --d-mlp M (512; 0: attention-only)\n"
            "  --n-kv-head K (0: one per head; K dividing H: grouped-query attention, 1: multi-query)\n"
            "  --norm none|layer|rms  --qk-norm none|layer|rms  --positions learned|sinusoidal|rope|none\n"
            "  --attn-scale X|default  --attn-softcap X (0: off)  --tied  --dropout P\n"
            "  --activation gelu|gelu_tanh|relu|swiglu|geglu (the last two gated: a third MLP weight W_gate)\n"
            "  --attn-bias (b_Q, b_K, b_V, b_O)\n"
            "  --attn-variant softmax|softmax1|sink|sigmoid|ssmax|softpick  the attention's weights (qkv/attention.h)\n"
            "  --attn-gate none|head|element  a sigmoid gate on each head's output, from W_G (gated attention)\n"
            "  --attn-diff          differential attention: (A1 - lambda A2) v from the halves of q and k\n"
            "  --init-std X (0.02)  --init-embed-std X (0.02)  --init-resid-std X|gpt2 (gpt2: init-std / sqrt(2 L))\n"
            "                       the initial weights' stds by group: matrices, embeddings, W_O and W_out\n"
            "  --norm-eps X  --rope-base X  --dtype f32|f64  --seed S (also the batches' seed)\n"
            "checkpoints and sampling:\n"
            "  --save FILE          write model + optimizer state at the end (atomic), every --save-every K steps,\n"
            "                       and on SIGINT/SIGTERM after the step under way (then exit 130/143)\n"
            "  --save-every K       also save to --save every K steps (default 0: only at the end)\n"
            "  --save-best FILE     save whenever the validation loss is the lowest so far\n"
            "  --load FILE          resume from a checkpoint (its configuration; model flags are refused)\n"
            "  --sample N           generate N tokens after training (from the start of the validation split,\n"
            "                       or --prompt TEXT for byte data)\n"
            "  --temperature T (0.8; 0: greedy)  --top-k K (0: all)  --num-samples K (1; one per line)\n"
            "  --sample-seed S      seed of the sampling (default: the model's seed; allowed with --load)\n"
            "output:\n"
            "  --log-every K (default 50)  --quiet (no progress)  --json (one summary line on stdout)\n"
            "  --log-csv FILE       step, train loss (mean over the interval), val loss, lr, tokens/s, seconds\n"
            "  --log-svg FILE       the train and validation loss curves (written at the end)\n"
            "  --threads N (default 1)\n");
}

/* ---- data ---------------------------------------------------------------------------------------- */

typedef struct tokens {
    int32_t *ids;
    int64_t n;
    int64_t vocab; /* largest id + 1 (256 for bytes) */
    bool bytes;
} tokens;

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The most tokens --data may hold (ids are int32 in memory: 8 GiB), and the largest vocabulary the data alone
 * may imply (an id of 2^31 - 1 would ask for an embedding of 2^31 rows: refused with the id named, rather than
 * an out-of-memory error far from its cause; --vocab sets a larger one deliberately). */
#define MAX_TOKENS (INT64_C(1) << 31)
#define MAX_DATA_VOCAB (INT64_C(1) << 24)

/* ids and the vocabulary they imply; false (message printed) on an id that is negative or too large. */
static bool check_ids(const char *path, tokens *t) {
    int64_t largest = -1, at = 0;
    for (int64_t i = 0; i < t->n; i++) {
        if (t->ids[i] < 0)
            return fprintf(stderr, PROG ": --data %s: id %" PRId32 " at position %" PRId64 " is negative\n", path,
                           t->ids[i], i), false;
        if (t->ids[i] > largest) largest = t->ids[i], at = i;
    }
    t->vocab = largest + 1; /* in int64: id 2147483647 implies 2^31 */
    if (t->vocab > MAX_DATA_VOCAB)
        return fprintf(stderr, PROG ": --data %s: id %" PRId64 " at position %" PRId64 " implies a vocabulary of %" PRId64
                       " tokens, more than the %" PRId64 " this program accepts from data (are these token ids? give "
                       "--vocab to insist)\n", path, largest, at, t->vocab, MAX_DATA_VOCAB), false;
    return true;
}

/* --data: a regular file (a FIFO, device or directory is refused before it is opened, so nothing blocks or
 * reads without end), at most MAX_TOKENS tokens, read in one pass of its known size. */
static bool load_tokens(qkv_ctx *ctx, const char *path, token_dtype dtype, tokens *t) {
    memset(t, 0, sizeof *t);
    struct stat st;
    if (stat(path, &st) != 0) return fprintf(stderr, PROG ": --data %s: %s\n", path, strerror(errno)), false;
    if (!S_ISREG(st.st_mode))
        return fprintf(stderr, PROG ": --data %s: not a regular file (a %s); give a file of tokens\n", path,
                       S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode) ? "FIFO" : "device or socket"), false;
    if (dtype == TOKENS_AUTO && ends_with(path, ".npy")) {
        qkv_tensor *x = qkv_npy_load(ctx, path);
        if (!x) return fprintf(stderr, PROG ": --data %s: %s\n", path, qkv_errmsg(ctx)), false;
        if (x->dtype != QKV_I32)
            return fprintf(stderr, PROG ": --data %s: the ids are %s; token ids must be integers (numpy: "
                           "ids.astype(np.int32))\n", path, qkv_dtype_name(x->dtype)), false;
        t->n = x->numel;
        t->ids = malloc((size_t)(t->n ? t->n : 1) * sizeof *t->ids);
        if (!t->ids) return fprintf(stderr, PROG ": out of memory\n"), false;
        memcpy(t->ids, x->data, (size_t)t->n * sizeof *t->ids);
        qkv_step_end(ctx);
        return check_ids(path, t);
    }
    if (dtype == TOKENS_AUTO && ends_with(path, ".bin"))
        return fprintf(stderr, PROG ": --data %s: a .bin file holds raw token ids of some width: say which with "
                       "--token-dtype u16 (nanoGPT's train.bin), i32 or u8 (bytes)\n", path), false;
    static const int widths[] = {1, 1, 2, 4};
    int width = widths[dtype];
    if (st.st_size % width)
        return fprintf(stderr, PROG ": --data %s: %lld bytes is not a whole number of %d-byte ids (--token-dtype %s)\n",
                       path, (long long)st.st_size, width, dtype == TOKENS_U16 ? "u16" : "i32"), false;
    int64_t n = (int64_t)st.st_size / width;
    if (n > MAX_TOKENS)
        return fprintf(stderr, PROG ": --data %s: %" PRId64 " tokens, more than the %" PRId64 " this program reads\n",
                       path, n, MAX_TOKENS), false;
    FILE *f = fopen(path, "rb");
    if (!f) return fprintf(stderr, PROG ": --data %s: %s\n", path, strerror(errno)), false;
    unsigned char *buf = malloc((size_t)(n ? n : 1) * (size_t)width);
    t->ids = malloc((size_t)(n ? n : 1) * sizeof *t->ids);
    size_t got = buf && t->ids ? fread(buf, (size_t)width, (size_t)n, f) : 0;
    bool stream_error = ferror(f) != 0, read_error = stream_error || got != (size_t)n;
    int saved_errno = errno;
    fclose(f);
    if (!buf || !t->ids) return free(buf), fprintf(stderr, PROG ": out of memory reading --data %s\n", path), false;
    if (read_error)
        return free(buf), fprintf(stderr, PROG ": --data %s: read %zu of %" PRId64 " ids (%s; did the file change?)\n",
                                  path, got, n, stream_error ? strerror(saved_errno) : "short read"), false;
    for (int64_t i = 0; i < n; i++) { // little-endian ids of the given width
        const unsigned char *b = buf + i * width;
        t->ids[i] = width == 1 ? b[0] : width == 2 ? (int32_t)(b[0] | b[1] << 8)
                                                 : (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 |
                                                             (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
    }
    free(buf);
    t->n = n;
    if (dtype == TOKENS_AUTO) { // bytes: a byte-level vocabulary, whatever the bytes are
        t->vocab = 256;
        t->bytes = true;
        return true;
    }
    return check_ids(path, t);
}

/* splitmix64 of (seed, step, row): the batch offsets are a function of the step. */
static uint64_t mix(uint64_t seed, uint64_t step, uint64_t row) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + step * 0xbf58476d1ce4e5b9ull + row * 0x94d049bb133111ebull + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ids [B, n] and targets [B, n] (the next token of each) from windows of n + 1 tokens of span[0 .. len-1]. */
static bool fill_batch(qkv_ctx *ctx, const int32_t *span, int64_t len, int64_t B, int64_t n, uint64_t seed,
                       int64_t step, int64_t fixed_rows, qkv_tensor **ids, qkv_tensor **targets) {
    *ids = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){B, n});
    *targets = qkv_empty(ctx, QKV_I32, 2, (int64_t[]){B, n});
    if (!*ids || !*targets) return false;
    int64_t starts = len - n; /* offsets 0 .. len - n - 1 leave room for the last target */
    for (int64_t b = 0; b < B; b++) {
        // training: a hashed offset; validation (fixed_rows > 0): row r of fixed_rows evenly spaced
        int64_t row = step * B + b;
        int64_t at = fixed_rows ? (int64_t)((double)row / (double)fixed_rows * (double)starts)
                                : (int64_t)(mix(seed, (uint64_t)step, (uint64_t)b) % (uint64_t)starts);
        memcpy(qkv_i32(*ids) + b * n, span + at, (size_t)n * sizeof(int32_t));
        memcpy(qkv_i32(*targets) + b * n, span + at + 1, (size_t)n * sizeof(int32_t));
    }
    return true;
}

/* ---- training ------------------------------------------------------------------------------------ */

static double lr_at(const train_flags *f, int64_t step) {
    if (step < f->warmup) return f->lr * (double)(step + 1) / (double)f->warmup; // linear warm-up
    double span = (double)(f->lr_steps - f->warmup), progress = span > 0 ? (double)(step - f->warmup) / span : 1.0;
    if (progress > 1) progress = 1; // lr = lr (0.1 + 0.9 (1 + cos(pi progress)) / 2)
    return f->lr * (0.1 + 0.9 * 0.5 * (1.0 + cos(3.14159265358979323846 * progress)));
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The mean validation loss over f->eval_batches fixed batches (recording off). NaN on error. */
static double validation_loss(qkv_ctx *ctx, qkv_model *m, const train_flags *f, const int32_t *val, int64_t n_val) {
    int64_t n = qkv_model_get_config(m)->n_ctx;
    bool was = qkv_set_grad_enabled(ctx, false);
    double sum = 0;
    for (int64_t k = 0; k < f->eval_batches; k++) {
        qkv_tensor *ids, *targets;
        fill_batch(ctx, val, n_val, f->batch, n, 0, k, f->batch * f->eval_batches, &ids, &targets);
        qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), targets);
        sum += loss ? qkv_get_flat(ctx, loss, 0) : NAN;
        qkv_step_end(ctx);
    }
    qkv_set_grad_enabled(ctx, was);
    return qkv_error(ctx) ? NAN : sum / (double)f->eval_batches;
}

/* ---- flags --------------------------------------------------------------------------------------- */

/* The enums' names as the library spells them (filled by fill_kind_names), indexed by value. */
static const char *norm_names[QKV_NORM_KIND_COUNT], *pos_names[QKV_POS_KIND_COUNT], *act_names[QKV_ACT_KIND_COUNT];
static const char *variant_names[QKV_ATTN_VARIANT_COUNT], *gate_names[QKV_GATE_KIND_COUNT];

static void fill_kind_names(void) {
    for (int k = 0; k < QKV_NORM_KIND_COUNT; k++) norm_names[k] = qkv_norm_kind_name((qkv_norm_kind)k);
    for (int k = 0; k < QKV_POS_KIND_COUNT; k++) pos_names[k] = qkv_positions_kind_name((qkv_positions_kind)k);
    for (int k = 0; k < QKV_ACT_KIND_COUNT; k++) act_names[k] = qkv_activation_kind_name((qkv_activation_kind)k);
    for (int k = 0; k < QKV_ATTN_VARIANT_COUNT; k++) variant_names[k] = qkv_attn_variant_name((qkv_attn_variant)k);
    for (int k = 0; k < QKV_GATE_KIND_COUNT; k++) gate_names[k] = qkv_attn_gate_kind_name((qkv_attn_gate_kind)k);
}
static const char *const dtype_names[] = {"f32", "f64"};

/* A model flag: parse it into cfg. 1 parsed, 0 not a model flag, -1 bad value. */
static int model_flag(train_flags *fl, int argc, char **argv, int *i) {
    const char *f = argv[*i];
    qkv_model_config *c = &fl->cfg;
    int64_t v;
    double x;
    int k;
    const char *s;
#define INT_FIELD(flag, field, lo, hi)                                                                               \
    if (!strcmp(f, flag)) {                                                                                          \
        if (!args_int_flag(PROG, argc, argv, i, lo, hi, &v)) return -1;                                              \
        c->field = v;                                                                                                \
        goto given;                                                                                                  \
    }
#define CHOICE_FIELD(flag, field, type, names)                                                                       \
    if (!strcmp(f, flag)) {                                                                                          \
        if (!(s = args_value(PROG, argc, argv, i)) ||                                                                \
            (k = args_choice(PROG, flag, s, names, (int)(sizeof names / sizeof names[0]))) < 0)                      \
            return -1;                                                                                               \
        c->field = (type)k;                                                                                          \
        goto given;                                                                                                  \
    }
    INT_FIELD("--vocab", vocab, 1, INT32_MAX)
    INT_FIELD("--n-ctx", n_ctx, 1, 1 << 16)
    INT_FIELD("--d-model", d_model, 1, 1 << 16)
    INT_FIELD("--n-layer", n_layer, 1, 256)
    INT_FIELD("--n-head", n_head, 1, 1 << 16)
    INT_FIELD("--n-kv-head", n_kv_head, 0, 1 << 16)
    INT_FIELD("--d-mlp", d_mlp, 0, 1 << 20)
    CHOICE_FIELD("--norm", norm, qkv_norm_kind, norm_names)
    CHOICE_FIELD("--qk-norm", qk_norm, qkv_norm_kind, norm_names)
    CHOICE_FIELD("--positions", positions, qkv_positions_kind, pos_names)
    CHOICE_FIELD("--activation", activation, qkv_activation_kind, act_names)
    CHOICE_FIELD("--attn-variant", attn_variant, qkv_attn_variant, variant_names)
    CHOICE_FIELD("--attn-gate", attn_gate, qkv_attn_gate_kind, gate_names)
    CHOICE_FIELD("--dtype", dtype, qkv_dtype, dtype_names)
#undef INT_FIELD
#undef CHOICE_FIELD
    if (!strcmp(f, "--attn-scale")) {
        if (!(s = args_value(PROG, argc, argv, i))) return -1;
        if (!strcmp(s, "default")) c->attn_scale = QKV_SCALE_DEFAULT;
        else if (args_double(PROG, "--attn-scale", s, -1e6, 1e6, &x)) c->attn_scale = x;
        else return -1;
        goto given;
    }
    if (!strcmp(f, "--attn-softcap")) {
        if (!args_double_flag(PROG, argc, argv, i, 0, 1e6, &c->attn_softcap)) return -1;
        goto given;
    }
    if (!strcmp(f, "--dropout")) {
        if (!args_double_flag(PROG, argc, argv, i, 0, 0.99, &c->dropout)) return -1;
        goto given;
    }
    if (!strcmp(f, "--norm-eps")) {
        if (!args_double_flag(PROG, argc, argv, i, 1e-30, 1, &c->norm_eps)) return -1;
        goto given;
    }
    if (!strcmp(f, "--rope-base")) {
        if (!args_double_flag(PROG, argc, argv, i, 1.0000001, 1e12, &c->rope_base)) return -1;
        goto given;
    }
    if (!strcmp(f, "--init-std")) {
        if (!args_double_flag(PROG, argc, argv, i, 0, 1e3, &c->init_std)) return -1;
        goto given;
    }
    if (!strcmp(f, "--init-embed-std")) {
        if (!args_double_flag(PROG, argc, argv, i, 0, 1e3, &c->init_embed_std)) return -1;
        goto given;
    }
    if (!strcmp(f, "--init-resid-std")) {
        const char *s = args_value(PROG, argc, argv, i);
        if (!s) return -1;
        if (!strcmp(s, "gpt2")) c->init_resid_std = -1.0;
        else if (!args_double(PROG, "--init-resid-std", s, 0, 1e3, &c->init_resid_std)) return -1;
        goto given;
    }
    if (!strcmp(f, "--tied")) {
        c->tied_embeddings = true;
        goto given;
    }
    if (!strcmp(f, "--attn-bias")) {
        c->attn_bias = true;
        goto given;
    }
    if (!strcmp(f, "--attn-diff")) {
        c->attn_diff = true;
        goto given;
    }
    return 0;
given:
    if (!fl->cfg_flag_given) fl->first_cfg_flag = f;
    fl->cfg_flag_given = true;
    return 1;
}

/* 0 ok, 1 --help printed, 2 bad command line. */
static int parse_flags(train_flags *fl, int argc, char **argv) {
    fill_kind_names();
    memset(fl, 0, sizeof *fl);
    fl->cfg = qkv_model_default_config();
    fl->cfg.n_ctx = 64;
    fl->cfg.vocab = 0; /* from the data unless --vocab */
    fl->steps = 1000;
    fl->batch = 16;
    fl->eval_every = 100;
    fl->eval_batches = 8;
    fl->log_every = 50;
    fl->threads = 1;
    fl->lr = 3e-3;
    fl->warmup = -1;
    fl->lr_steps = -1;
    fl->weight_decay = 0.01;
    fl->clip = 1.0;
    fl->val_frac = 0.1;
    fl->temperature = 0.8;
    int64_t seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int r = model_flag(fl, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (args_is_help(f)) return usage(stdout), 1;
        static const char *const recipe[] = {"--lr", "--warmup", "--lr-steps", "--weight-decay", "--clip", "--batch",
                                             "--val-frac"};
        for (size_t k = 0; k < sizeof recipe / sizeof recipe[0]; k++)
            if (!strcmp(f, recipe[k]) && !fl->first_recipe_flag) fl->first_recipe_flag = f;
        if (!strcmp(f, "--lr-steps")) { if (!args_int_flag(PROG, argc, argv, &i, 1, INT64_C(1) << 40, &fl->lr_steps)) return 2; }
        else if (!strcmp(f, "--data")) { if (!(fl->data = args_value(PROG, argc, argv, &i))) return 2; }
        else if (!strcmp(f, "--save")) { if (!(fl->save = args_value(PROG, argc, argv, &i))) return 2; }
        else if (!strcmp(f, "--load")) { if (!(fl->load = args_value(PROG, argc, argv, &i))) return 2; }
        else if (!strcmp(f, "--prompt")) { if (!(fl->prompt = args_value(PROG, argc, argv, &i))) return 2; }
        else if (!strcmp(f, "--steps")) {
            if (!args_int_flag(PROG, argc, argv, &i, 0, INT64_C(1) << 40, &fl->steps)) return 2;
            fl->steps_given = true;
        }
        else if (!strcmp(f, "--save-every")) { if (!args_int_flag(PROG, argc, argv, &i, 0, INT64_C(1) << 40, &fl->save_every)) return 2; }
        else if (!strcmp(f, "--save-best")) { if (!(fl->save_best = args_value(PROG, argc, argv, &i))) return 2; }
        else if (!strcmp(f, "--log-csv")) { if (!(fl->log_csv = args_value(PROG, argc, argv, &i))) return 2; }
        else if (!strcmp(f, "--log-svg")) { if (!(fl->log_svg = args_value(PROG, argc, argv, &i))) return 2; }
        else if (!strcmp(f, "--num-samples")) { if (!args_int_flag(PROG, argc, argv, &i, 1, 1 << 16, &fl->num_samples)) return 2; }
        else if (!strcmp(f, "--sample-seed")) {
            int64_t v;
            if (!args_int_flag(PROG, argc, argv, &i, 0, INT64_MAX, &v)) return 2;
            fl->sample_seed = (uint64_t)v, fl->sample_seed_given = true;
        }
        else if (!strcmp(f, "--token-dtype")) {
            static const char *const names[] = {"u8", "u16", "i32"};
            const char *v = args_value(PROG, argc, argv, &i);
            int k = v ? args_choice(PROG, "--token-dtype", v, names, 3) : -1;
            if (k < 0) return 2;
            fl->token_dtype = (token_dtype)(k + 1);
        }
        else if (!strcmp(f, "--batch")) { if (!args_int_flag(PROG, argc, argv, &i, 1, 1 << 20, &fl->batch)) return 2; }
        else if (!strcmp(f, "--eval-every")) { if (!args_int_flag(PROG, argc, argv, &i, 0, INT64_C(1) << 40, &fl->eval_every)) return 2; }
        else if (!strcmp(f, "--eval-batches")) { if (!args_int_flag(PROG, argc, argv, &i, 1, 1 << 20, &fl->eval_batches)) return 2; }
        else if (!strcmp(f, "--log-every")) { if (!args_int_flag(PROG, argc, argv, &i, 1, INT64_C(1) << 40, &fl->log_every)) return 2; }
        else if (!strcmp(f, "--sample")) { if (!args_int_flag(PROG, argc, argv, &i, 0, 1 << 24, &fl->sample)) return 2; }
        else if (!strcmp(f, "--top-k")) { if (!args_int_flag(PROG, argc, argv, &i, 0, INT32_MAX, &fl->top_k)) return 2; }
        else if (!strcmp(f, "--threads")) { if (!args_int_flag(PROG, argc, argv, &i, 1, QKV_MAX_THREADS, &fl->threads)) return 2; }
        else if (!strcmp(f, "--warmup")) { if (!args_int_flag(PROG, argc, argv, &i, 0, INT64_C(1) << 40, &fl->warmup)) return 2; }
        else if (!strcmp(f, "--seed")) {
            if (!args_int_flag(PROG, argc, argv, &i, 0, INT64_MAX, &seed)) return 2;
            fl->cfg.seed = (uint64_t)seed;
            if (!fl->cfg_flag_given) fl->first_cfg_flag = f;
            fl->cfg_flag_given = true;
        }
        else if (!strcmp(f, "--lr")) {
            if (!args_double_flag(PROG, argc, argv, &i, 0, 10, &fl->lr)) return 2;
            if (fl->lr == 0) // refused, not run: a run that cannot move its weights is always a mistake
                return fprintf(stderr, PROG ": --lr 0 would train nothing (every update is zero); give a rate > 0\n"), 2;
        }
        else if (!strcmp(f, "--weight-decay")) { if (!args_double_flag(PROG, argc, argv, &i, 0, 10, &fl->weight_decay)) return 2; }
        else if (!strcmp(f, "--val-frac")) { if (!args_double_flag(PROG, argc, argv, &i, 1e-6, 0.9, &fl->val_frac)) return 2; }
        else if (!strcmp(f, "--temperature")) { if (!args_double_flag(PROG, argc, argv, &i, 0, 100, &fl->temperature)) return 2; }
        else if (!strcmp(f, "--clip")) {
            const char *v = args_value(PROG, argc, argv, &i);
            if (!v) return 2;
            if (!strcmp(v, "off")) fl->clip_off = true;
            else if (!args_double(PROG, "--clip", v, 1e-12, 1e12, &fl->clip)) return 2;
        }
        else if (!strcmp(f, "--quiet")) fl->quiet = true;
        else if (!strcmp(f, "--json")) fl->json = true;
        else return args_unknown(PROG, f);
    }
    if (!fl->data && !fl->load) return fprintf(stderr, PROG ": --data FILE (or --load CKPT) is needed (see --help)\n"), 2;
    if (fl->load && fl->cfg_flag_given)
        return fprintf(stderr, PROG ": %s: with --load the model's configuration (and seed) come from the checkpoint\n",
                       fl->first_cfg_flag), 2;
    if (fl->load && fl->first_recipe_flag)
        return fprintf(stderr, PROG ": %s: with --load the training recipe comes from the checkpoint\n",
                       fl->first_recipe_flag), 2;
    if (fl->load && !fl->steps_given) fl->steps = -1; /* the checkpoint's step, once it is read */
    if (fl->lr_steps < 0) fl->lr_steps = fl->steps;
    /* 5% of the schedule, not of --steps: a run of 300 steps with --lr-steps 600, resumed to 600, then has the
     * same warm-up as an unbroken 600-step run, and ends with the same bits */
    if (fl->warmup < 0) fl->warmup = fl->lr_steps / 20;
    if (fl->num_samples == 0) fl->num_samples = 1;
    if (fl->num_samples > 1 && fl->sample == 0)
        return fprintf(stderr, PROG ": --num-samples needs --sample N (the tokens of each)\n"), 2;
    if ((fl->save_every || fl->save_best) && !fl->data)
        return fprintf(stderr, PROG ": --save-every and --save-best need --data (they save during training)\n"), 2;
    if (fl->save_every && !fl->save)
        return fprintf(stderr, PROG ": --save-every K needs --save FILE (where to save)\n"), 2;
    return 0;
}

/* ---- the training recipe in a checkpoint's metadata ----------------------------------------------- */

enum { RECIPE_KEYS = 8 };

/* key/value pairs "train.step", "train.lr", ... into text (RECIPE_KEYS pairs of 48-byte strings). */
static void recipe_metadata(const train_flags *f, int64_t step, char text[2 * RECIPE_KEYS][48], const char **meta) {
    snprintf(text[1], 48, "%" PRId64, step);
    snprintf(text[3], 48, "%.17g", f->lr);
    snprintf(text[5], 48, "%" PRId64, f->warmup);
    snprintf(text[7], 48, "%" PRId64, f->lr_steps);
    snprintf(text[9], 48, "%.17g", f->weight_decay);
    if (f->clip_off) snprintf(text[11], 48, "off");
    else snprintf(text[11], 48, "%.17g", f->clip);
    snprintf(text[13], 48, "%" PRId64, f->batch);
    snprintf(text[15], 48, "%.17g", f->val_frac);
    static const char *const keys[RECIPE_KEYS] = {"train.step",         "train.lr",   "train.warmup", "train.lr_steps",
                                                  "train.weight_decay", "train.clip", "train.batch",  "train.val_frac"};
    for (int k = 0; k < RECIPE_KEYS; k++) {
        meta[2 * k] = keys[k];
        meta[2 * k + 1] = text[2 * k + 1];
    }
}

/* The recipe and step back from a checkpoint written by this program; false (message printed) if absent. */
static bool read_recipe(const qkv_safetensors *ck, const char *path, train_flags *f, int64_t *step) {
    char text[2 * RECIPE_KEYS][48];
    const char *meta[2 * RECIPE_KEYS];
    recipe_metadata(f, 0, text, meta);
    for (int k = 0; k < RECIPE_KEYS; k++) {
        const char *key = meta[2 * k], *v = qkv_safetensors_metadata(ck, key);
        bool ok = v != NULL;
        int64_t n = 0;
        double x = 0;
        char *end = NULL;
        if (ok && k == 5 && !strcmp(v, "off")) {
            f->clip_off = true;
            continue;
        }
        errno = 0;
        if (ok && (k == 0 || k == 2 || k == 3 || k == 6)) n = strtoll(v, &end, 10), ok = !errno && *end == 0 && n >= 0;
        else if (ok) x = strtod(v, &end), ok = *end == 0 && isfinite(x) && x >= 0;
        if (!ok) {
            fprintf(stderr, PROG ": --load %s: the metadata's %s is %s (was it written by " PROG "?)\n", path, key,
                    v ? v : "missing");
            return false;
        }
        switch (k) {
        case 0: *step = n; break;
        case 1: f->lr = x; break;
        case 2: f->warmup = n; break;
        case 3: f->lr_steps = n; break;
        case 4: f->weight_decay = x; break;
        case 5: f->clip = x, f->clip_off = false; break;
        case 6: f->batch = n; break;
        default: f->val_frac = x; break;
        }
    }
    return true;
}

/* ---- stopping, saving and logging during a run ------------------------------------------------ */

/* SIGINT or SIGTERM, once caught: the run finishes the step under way, saves (--save) and exits 128 + signal.
 * The handler only records the signal; a second one while saving is ignored (the save is atomic anyway). */
static volatile sig_atomic_t stop_signal = 0;

static void on_stop_signal(int sig) { stop_signal = sig; }

static void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* "1h02m", "3m07s", "12.3s" */
typedef struct duration_text {
    char text[24];
} duration_text;

static duration_text duration(double seconds) {
    duration_text d;
    if (!isfinite(seconds) || seconds < 0) snprintf(d.text, sizeof d.text, "-");
    else if (seconds < 60) snprintf(d.text, sizeof d.text, "%.1fs", seconds);
    else if (seconds < 3600) snprintf(d.text, sizeof d.text, "%dm%02ds", (int)seconds / 60, (int)seconds % 60);
    else snprintf(d.text, sizeof d.text, "%dh%02dm", (int)(seconds / 3600), (int)seconds / 60 % 60);
    return d;
}

/* The loss curves of --log-svg: every step's train loss, and the validation loss where it was measured. */
typedef struct curve {
    double *step, *train, *val;
    int64_t n, capacity;
} curve;

static bool curve_init(curve *c, int64_t capacity) {
    if (capacity < 1) capacity = 1;
    c->step = malloc((size_t)capacity * sizeof(double));
    c->train = malloc((size_t)capacity * sizeof(double));
    c->val = malloc((size_t)capacity * sizeof(double));
    c->n = 0, c->capacity = capacity;
    return c->step && c->train && c->val;
}

static void curve_add(curve *c, int64_t step, double train, double val) {
    if (c->n >= c->capacity) return;
    c->step[c->n] = (double)step, c->train[c->n] = train, c->val[c->n] = val;
    c->n++;
}

static bool curve_write(const curve *c, const char *path) {
    int64_t n_val = 0;
    double *vx = malloc((size_t)c->n * sizeof(double)), *vy = malloc((size_t)c->n * sizeof(double));
    if (!vx || !vy) return free(vx), free(vy), errno = ENOMEM, false;
    for (int64_t i = 0; i < c->n; i++) // the validation points alone, joined by a line
        if (!isnan(c->val[i])) vx[n_val] = c->step[i], vy[n_val++] = c->val[i];
    plot_series series[2] = {{"train (each step)", c->step, c->train, (int)c->n}, {"validation", vx, vy, (int)n_val}};
    plot_style styles[2] = {{NULL, NULL, PLOT_MARKER_NONE}, {NULL, NULL, PLOT_MARKER_CIRCLE}};
    bool ok = plot_lines_styled_svg(path, "loss", "step", "loss (nats per token)", series, 2, false, false, styles);
    free(vx), free(vy);
    return ok;
}

static void curve_free(curve *c) {
    free(c->step), free(c->train), free(c->val);
    memset(c, 0, sizeof *c);
}

/* Save the model, the optimizer and the recipe at step (atomic: a failure leaves any old file as it was). */
static bool save_checkpoint(qkv_ctx *ctx, qkv_model *m, qkv_optimizer *opt, const train_flags *fl, const char *path,
                            int64_t step) {
    char text[2 * RECIPE_KEYS][48];
    const char *extra[2 * RECIPE_KEYS];
    recipe_metadata(fl, step, text, extra);
    if (qkv_model_save(ctx, m, path, opt, extra, RECIPE_KEYS) == QKV_OK) return true;
    fprintf(stderr, PROG ": saving %s at step %" PRId64 ": %s\n", path, step, qkv_errmsg(ctx));
    return false;
}

/* A library message about the configuration, with each "config.<field>" written as the flag that sets it
 * ("config.d_model 30 is not divisible by config.n_head 4" -> "--d-model 30 is not divisible by --n-head 4"),
 * and an out-of-memory one with the size of the vocabulary (a large id in the data makes a large embedding). */
static void print_with_flag_names(const char *msg, int64_t vocab) {
    fputs(PROG ": ", stderr);
    for (const char *p = msg; *p;) {
        if (!strncmp(p, "config.", 7)) {
            p += 7;
            size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
            if (len == 15 && !strncmp(p, "tied_embeddings", 15)) fputs("--tied", stderr);
            else {
                fputs("--", stderr);
                for (size_t i = 0; i < len; i++) fputc(p[i] == '_' ? '-' : p[i], stderr);
            }
            p += len;
        } else {
            fputc(*p++, stderr);
        }
    }
    if (strstr(msg, "out of memory"))
        fprintf(stderr, " (the model's vocabulary is %" PRId64 " tokens; see --vocab and the data's largest id)", vocab);
    fputc('\n', stderr);
}

/* ---- main ---------------------------------------------------------------------------------------- */

static int run(train_flags *fl) {
    qkv_options o = qkv_default_options();
    o.threads = (int)fl->threads;
    o.release_grads = true; /* only the parameters' gradients are read: the intermediates' go back during the backward */
    qkv_ctx *ctx = qkv_ctx_new(&o);
    if (!ctx) return fprintf(stderr, PROG ": cannot make a context\n"), 1;
    int rc = 1;
    tokens data = {0};
    qkv_model *m = NULL;
    qkv_optimizer *opt = NULL;
    qkv_safetensors *ck = NULL;
    int64_t start = 0;
    uint64_t seed = fl->cfg.seed;
    FILE *csv = NULL;
    curve curves = {0};

    if (fl->load) {
        ck = qkv_safetensors_load(ctx, fl->load);
        qkv_model_config cfg;
        if (!ck || qkv_model_config_from_checkpoint(ctx, ck, &cfg)) {
            fprintf(stderr, PROG ": --load %s: %s\n", fl->load, qkv_errmsg(ctx));
            goto done;
        }
        fl->cfg = cfg;
        seed = cfg.seed;
        if (!read_recipe(ck, fl->load, fl, &start)) goto done;
        if (fl->steps < 0) fl->steps = start; /* no --steps: nothing to train, e.g. only to sample */
    }
    if (fl->data) {
        if (!load_tokens(ctx, fl->data, fl->token_dtype, &data)) goto done;
        if (!fl->load && fl->cfg.vocab == 0) fl->cfg.vocab = data.vocab;
        if (data.vocab > fl->cfg.vocab) {
            fprintf(stderr, PROG ": --data %s holds id %" PRId64 " but the model's vocabulary is %" PRId64 "\n",
                    fl->data, data.vocab - 1, fl->cfg.vocab);
            goto done;
        }
    }
    m = qkv_model_new(ctx, &fl->cfg);
    if (!m) {
        if (fl->load) fprintf(stderr, PROG ": --load %s: %s\n", fl->load, qkv_errmsg(ctx));
        else print_with_flag_names(qkv_errmsg(ctx), fl->cfg.vocab);
        goto done;
    }
    qkv_optim_options oo = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    oo.lr = fl->lr;
    oo.weight_decay = fl->weight_decay;
    oo.param_names = qkv_model_param_names(m);
    opt = qkv_optim_new(ctx, &oo, qkv_model_params(m), qkv_model_param_count(m));
    if (!opt || (ck && qkv_model_restore(ctx, m, ck, opt))) {
        fprintf(stderr, PROG ": %s%s%s\n", fl->load ? "--load " : "", fl->load ? fl->load : "", qkv_errmsg(ctx));
        goto done;
    }
    if (ck) qkv_safetensors_free(ctx, ck), ck = NULL;
    if (start > fl->steps) {
        fprintf(stderr, PROG ": --load %s is at step %" PRId64 ", past --steps %" PRId64 " (the total, counted from 0)\n",
                fl->load, start, fl->steps);
        goto done;
    }

    int64_t n = fl->cfg.n_ctx;
    int64_t n_val = data.n ? (int64_t)((double)data.n * fl->val_frac) : 0, n_train = data.n - n_val;
    const int32_t *train = data.ids, *val = data.ids ? data.ids + n_train : NULL;
    bool training = start < fl->steps;
    if ((training || data.n) && (n_train < n + 1 || n_val < n + 1)) {
        fprintf(stderr, PROG ": --data %s has %" PRId64 " tokens: the training (%" PRId64 ") and validation (%" PRId64
                ") splits each need at least n_ctx + 1 = %" PRId64 "\n", fl->data ? fl->data : "(none)", data.n,
                n_train, n_val, n + 1);
        goto done;
    }
    if (!fl->quiet && training)
        fprintf(stderr, PROG ": %" PRId64 " parameters, %" PRId64 " training and %" PRId64
                " validation tokens, steps %" PRId64 " to %" PRId64 "\n", qkv_model_param_elements(m), n_train, n_val,
                start, fl->steps);

    if (fl->log_csv) { // a log, appended as it goes (not atomic: what a killed run leaves is what it logged)
        if (!(csv = fopen(fl->log_csv, start > 0 ? "a" : "w"))) {
            fprintf(stderr, PROG ": --log-csv %s: %s\n", fl->log_csv, strerror(errno));
            goto done;
        }
        if (start == 0) fprintf(csv, "step,train_loss,val_loss,lr,tokens_per_s,seconds\n");
    }
    if (fl->log_svg && !curve_init(&curves, fl->steps - start)) {
        fprintf(stderr, PROG ": out of memory\n");
        goto done;
    }
    catch_stop_signals();
    double t0 = now_seconds(), last_loss = NAN, val_loss = NAN, best_val = INFINITY, interval_sum = 0;
    int64_t tokens_done = 0, interval_steps = 0, stopped_at = -1;
    for (int64_t step = start; step < fl->steps; step++) {
        qkv_seed(ctx, seed ^ ((uint64_t)step * 0x9e3779b97f4a7c15ull)); // dropout masks from the step
        qkv_optim_set_lr(opt, lr_at(fl, step));
        qkv_tensor *ids, *targets;
        fill_batch(ctx, train, n_train, fl->batch, n, seed, step, 0, &ids, &targets);
        qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, ids, QKV_CAUSAL), targets);
        double lv = loss ? qkv_get_flat(ctx, loss, 0) : NAN;
        if (qkv_backward(ctx, loss, NULL) == QKV_OK && !fl->clip_off)
            qkv_clip_grad_norm(ctx, qkv_model_params(m), qkv_model_param_count(m), fl->clip);
        if (!qkv_error(ctx)) qkv_optim_step(opt);
        qkv_optim_zero_grad(opt);
        qkv_step_end(ctx);
        if (qkv_error(ctx)) {
            fprintf(stderr, PROG ": step %" PRId64 ": %s\n", step, qkv_errmsg(ctx));
            goto done;
        }
        last_loss = lv;
        interval_sum += lv, interval_steps++;
        tokens_done += fl->batch * n;
        bool last = step + 1 == fl->steps, stop = stop_signal != 0;
        bool eval = last || (fl->eval_every && (step + 1) % fl->eval_every == 0);
        if (eval) val_loss = validation_loss(ctx, m, fl, val, n_val);
        if (fl->log_svg) curve_add(&curves, step + 1, lv, eval ? val_loss : NAN);
        if (eval && fl->save_best && val_loss < best_val) {
            best_val = val_loss;
            if (!save_checkpoint(ctx, m, opt, fl, fl->save_best, step + 1)) goto done;
        }
        bool logged = last || eval || (step + 1) % fl->log_every == 0 || stop;
        if (logged) {
            double dt = now_seconds() - t0, rate = dt > 0 ? (double)tokens_done / dt : 0.0;
            double mean_loss = interval_sum / (double)interval_steps; // the train loss over the interval
            double eta = (double)(fl->steps - step - 1) * dt / (double)(step + 1 - start);
            if (!fl->quiet) {
                char val_text[32]; // this step's validation loss, the last one (marked), or none yet
                if (isnan(val_loss)) snprintf(val_text, sizeof val_text, "-");
                else snprintf(val_text, sizeof val_text, "%s%.4f", eval ? "" : "(last) ", val_loss);
                fprintf(stderr, "step %6" PRId64 "  loss %.4f  val %s  lr %.2e  %.0f tokens/s  %s elapsed  ETA %s\n",
                        step + 1, mean_loss, val_text, lr_at(fl, step), rate, duration(dt).text, duration(eta).text);
            }
            if (csv) {
                fprintf(csv, "%" PRId64 ",%.9g,", step + 1, mean_loss);
                if (eval) fprintf(csv, "%.9g", val_loss);
                fprintf(csv, ",%.9g,%.1f,%.3f\n", lr_at(fl, step), rate, dt);
                fflush(csv);
            }
            interval_sum = 0, interval_steps = 0;
        }
        bool periodic = fl->save_every && (step + 1) % fl->save_every == 0 && !last;
        if ((periodic || stop) && fl->save && !save_checkpoint(ctx, m, opt, fl, fl->save, step + 1)) goto done;
        if (stop) {
            stopped_at = step + 1;
            break;
        }
    }
    double seconds = now_seconds() - t0;
    if (csv && fclose(csv) != 0) {
        csv = NULL;
        fprintf(stderr, PROG ": --log-csv %s: %s\n", fl->log_csv, strerror(errno));
        goto done;
    }
    csv = NULL;
    if (fl->log_svg && curves.n && !curve_write(&curves, fl->log_svg)) {
        fprintf(stderr, PROG ": --log-svg %s: %s\n", fl->log_svg, strerror(errno));
        goto done;
    }
    if (stopped_at >= 0) {
        int sig = stop_signal;
        fprintf(stderr, PROG ": %s at step %" PRId64 "; %s%s\n", sig == SIGINT ? "SIGINT" : "SIGTERM", stopped_at,
                fl->save ? "saved the run to " : "nothing saved (no --save)", fl->save ? fl->save : "");
        rc = 128 + sig;
        goto done;
    }
    if (!training && data.n) val_loss = validation_loss(ctx, m, fl, val, n_val);
    if (fl->save && !save_checkpoint(ctx, m, opt, fl, fl->save, fl->steps > start ? fl->steps : start)) goto done;
    if (fl->sample > 0) {
        int32_t *out = malloc((size_t)fl->sample * sizeof *out);
        int64_t n_prompt = 0;
        int32_t *prompt = NULL;
        if (fl->prompt && fl->cfg.vocab >= 256) {
            n_prompt = (int64_t)strlen(fl->prompt);
            prompt = malloc((size_t)(n_prompt ? n_prompt : 1) * sizeof *prompt);
            for (int64_t i = 0; prompt && i < n_prompt; i++) prompt[i] = (unsigned char)fl->prompt[i];
        } else if (val) {
            n_prompt = n < n_val ? n / 2 + 1 : 1;
            prompt = malloc((size_t)n_prompt * sizeof *prompt);
            if (prompt) memcpy(prompt, val, (size_t)n_prompt * sizeof *prompt);
        } else {
            n_prompt = 1;
            prompt = calloc(1, sizeof *prompt);
        }
        if (fl->prompt && fl->cfg.vocab < 256) {
            fprintf(stderr, PROG ": --prompt TEXT needs a byte-level model (vocab 256); this one has %" PRId64 "\n",
                    fl->cfg.vocab);
            free(out), free(prompt);
            goto done;
        }
        qkv_sample_options so = {fl->temperature, fl->top_k};
        FILE *dst = fl->json ? stderr : stdout;
        bool text = fl->cfg.vocab == 256 && (!data.ids || data.bytes);
        // sample k is drawn from (sampling seed, k): the first is what this program always drew for a seed
        uint64_t sample_seed = fl->sample_seed_given ? fl->sample_seed : seed;
        for (int64_t k = 0; k < fl->num_samples; k++) {
            qkv_seed(ctx, sample_seed ^ 0x5a3b1e ^ ((uint64_t)k * 0x9e3779b97f4a7c15ull));
            if (!out || !prompt || n_prompt < 1 || qkv_model_sample(ctx, m, prompt, n_prompt, fl->sample, &so, out)) {
                fprintf(stderr, PROG ": --sample: %s\n", n_prompt < 1 ? "the prompt is empty" : qkv_errmsg(ctx));
                free(out), free(prompt);
                goto done;
            }
            for (int64_t i = 0; i < n_prompt && text; i++) fputc(prompt[i], dst);
            for (int64_t i = 0; i < fl->sample; i++) {
                if (text) fputc(out[i], dst);
                else fprintf(dst, "%s%" PRId32, i ? " " : "", out[i]);
            }
            fputc('\n', dst);
        }
        free(out), free(prompt);
    }
    if (fl->json) {
        char vl[32], tl[32];
        if (isfinite(val_loss)) snprintf(vl, sizeof vl, "%.6f", val_loss);
        else snprintf(vl, sizeof vl, "null");
        if (isfinite(last_loss)) snprintf(tl, sizeof tl, "%.6f", last_loss);
        else snprintf(tl, sizeof tl, "null");
        printf("{\"steps\":%" PRId64 ",\"trained_steps\":%" PRId64 ",\"train_loss\":%s,\"val_loss\":%s,"
               "\"tokens_per_s\":%.1f,\"seconds\":%.3f,\"params\":%" PRId64 ",\"vocab\":%" PRId64 "}\n",
               fl->steps > start ? fl->steps : start, fl->steps > start ? fl->steps - start : 0, tl, vl,
               seconds > 0 ? (double)tokens_done / seconds : 0.0, seconds, qkv_model_param_elements(m),
               fl->cfg.vocab);
    }
    rc = 0;
done:
    if (csv) fclose(csv);
    curve_free(&curves);
    if (ck) qkv_safetensors_free(ctx, ck);
    qkv_optim_free(opt);
    qkv_model_free(m);
    qkv_ctx_free(ctx);
    free(data.ids);
    return rc;
}

int main(int argc, char **argv) {
    train_flags fl;
    int r = parse_flags(&fl, argc, argv);
    if (r) return r == 1 ? 0 : r;
    return run(&fl);
}
