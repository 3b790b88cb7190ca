#include <stdio.h>
#include <string.h>

#include "plot_heatmap.h"
#include "qkv.h"

/* The task: recall the first token. A sequence is [key, f1, ..., f5] and at its last position the model must
 * name the key; the fillers are random and carry no information. The model: two attention-only blocks of two
 * heads, f64 (the same numbers on every machine). */
enum { V = 12, N = 6, BATCH = 32 };

static void make_batch(uint64_t *state, int32_t *ids, int32_t *targets, int rows) {
    for (int i = 0; i < rows * N; i++) {
        *state = *state * 6364136223846793005u + 1442695040888963407u; /* a small LCG: the page's own data */
        ids[i] = (int32_t)((*state >> 33) % V);
        targets[i] = i % N == N - 1 ? ids[i - (N - 1)] : -1; /* only the last position is scored */
    }
}

static qkv_model *train_model(qkv_ctx *ctx) {
    qkv_model_config c = qkv_model_default_config();
    c.vocab = V, c.n_ctx = N, c.d_model = 16, c.n_layer = 2, c.n_head = 2, c.d_mlp = 0;
    c.dtype = QKV_F64, c.seed = 1;
    qkv_model *m = qkv_model_new(ctx, &c);
    qkv_optim_options o = qkv_optim_defaults(QKV_OPTIM_ADAMW);
    o.lr = 1e-2;
    qkv_optimizer *opt = qkv_optim_new(ctx, &o, qkv_model_params(m), qkv_model_param_count(m));
    uint64_t state = 7;
    int32_t ids[BATCH * N], targets[BATCH * N];
    for (int step = 0; step < 400 && !qkv_error(ctx); step++) {
        make_batch(&state, ids, targets, BATCH);
        qkv_tensor *x = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){BATCH, N}, ids);
        qkv_tensor *t = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){BATCH, N}, targets);
        qkv_tensor *loss = qkv_model_loss(ctx, qkv_model_forward(ctx, m, x, QKV_CAUSAL), t);
        qkv_backward(ctx, loss, NULL);
        if (step % 100 == 99) printf("step %d  loss %.4f\n", step + 1, qkv_get_flat(ctx, loss, 0));
        qkv_optim_step(opt);
        qkv_optim_zero_grad(opt);
        qkv_step_end(ctx);
    }
    return m;
}

/* The metric: logit[clean key] - logit[corrupted key] at the last position, averaged over the prompts. */
typedef struct answers {
    int32_t clean[8], corrupted[8];
} answers;

static double logit_diff(qkv_ctx *ctx, const qkv_tensor *logits, void *user) {
    const answers *a = user;
    double sum = 0;
    for (int b = 0; b < 8; b++) {
        int64_t last = (b * N + N - 1) * V;
        sum += qkv_get_flat(ctx, logits, last + a->clean[b]) - qkv_get_flat(ctx, logits, last + a->corrupted[b]);
    }
    return sum / 8;
}

/* Print a sweep's table as the fraction of the clean metric it restores: (x - corrupted) / (clean - corrupted). */
static void print_restored(const char *title, const qkv_tensor *table, int64_t cols, double clean, double corrupted,
                           double *restored) {
    printf("%s\n", title);
    for (int64_t l = 0; l < 2; l++) {
        printf("  layer %lld:", (long long)l);
        for (int64_t j = 0; j < cols; j++) {
            restored[l * cols + j] = (qkv_f64_const(table)[l * cols + j] - corrupted) / (clean - corrupted);
            printf(" %6.3f", restored[l * cols + j]);
        }
        printf("\n");
    }
}

int patching_tutorial(const char *out_dir) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_model *m = train_model(ctx);

    /* Eight clean prompts, and the same prompts with another key: the corrupted run. */
    int32_t clean[8 * N], corrupted[8 * N], targets[8 * N];
    uint64_t state = 99;
    make_batch(&state, clean, targets, 8);
    memcpy(corrupted, clean, sizeof clean);
    answers a;
    for (int b = 0; b < 8; b++) {
        corrupted[b * N] = (clean[b * N] + 1 + b % (V - 1)) % V;
        a.clean[b] = clean[b * N], a.corrupted[b] = corrupted[b * N];
    }
    qkv_tensor *clean_ids = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){8, N}, clean);
    qkv_tensor *corrupted_ids = qkv_from_data(ctx, QKV_I32, 2, (int64_t[]){8, N}, corrupted);

    /* The two ends of the scale: the clean run and the corrupted one. */
    double clean_metric = logit_diff(ctx, qkv_model_forward(ctx, m, clean_ids, QKV_CAUSAL), &a);
    double corrupted_metric = logit_diff(ctx, qkv_model_forward(ctx, m, corrupted_ids, QKV_CAUSAL), &a);
    printf("logit difference: clean %.3f, corrupted %.3f\n", clean_metric, corrupted_metric);

    /* Patch the residual stream into each block, one position at a time, from the clean run into the corrupted. */
    qkv_tensor *resid = qkv_model_patch_sweep(ctx, m, "hook_resid_pre", clean_ids, corrupted_ids, QKV_CAUSAL,
                                              QKV_PATCH_BY_POS, logit_diff, &a);
    double resid_restored[2 * N];
    if (resid) print_restored("resid_pre patched, by position:", resid, N, clean_metric, corrupted_metric, resid_restored);

    /* Then each head's output z, at every position. */
    qkv_tensor *heads = qkv_model_patch_sweep(ctx, m, "attn.hook_z", clean_ids, corrupted_ids, QKV_CAUSAL,
                                              QKV_PATCH_BY_HEAD, logit_diff, &a);
    double head_restored[2 * 2];
    if (heads) print_restored("z patched, by head:", heads, 2, clean_metric, corrupted_metric, head_restored);

    /* Direct logit attribution on the first clean prompt: what each head writes towards its key. */
    qkv_tensor *parts = qkv_model_logit_attribution(ctx, m, clean_ids, QKV_CAUSAL, N - 1, a.clean[0], a.corrupted[0]);
    int n_parts = qkv_model_attribution_count(m);
    double sum = 0;
    printf("direct logit attribution (prompt 0):");
    for (int i = 0; parts && i < n_parts; i++) {
        char label[64];
        qkv_model_attribution_label(m, i, label, sizeof label);
        printf(" %s %.3f", label, qkv_f64_const(parts)[i]);
        sum += qkv_f64_const(parts)[i];
    }
    if (parts) printf("\n  parts sum to %.6f, the logit difference is %.6f\n", sum, qkv_f64_const(parts)[n_parts]);

    /* The logit lens: where in depth the key becomes the prediction (its rank at the last position, 1 = top,
     * averaged over the eight prompts). */
    qkv_tensor *lens = qkv_model_logit_lens(ctx, m, clean_ids, QKV_CAUSAL);
    for (int64_t l = 0; lens && l < 3; l++) {
        double rank = 0;
        for (int b = 0; b < 8; b++) {
            const double *row = qkv_f64_const(lens) + ((l * 8 + b) * N + N - 1) * V;
            for (int v = 0; v < V; v++) rank += (row[v] > row[a.clean[b]]) / 8.0;
        }
        printf("logit lens after %-13s: the key's mean rank %.2f of %d\n",
               l == 0 ? "the embedding" : l == 1 ? "block 0" : "block 1", rank + 1, V);
    }

    if (out_dir && resid && heads) { /* the two tables as heat maps, one SVG */
        char path[512];
        snprintf(path, sizeof path, "%s/patching.svg", out_dir);
        plot_panel panels[2] = {{"resid_pre by position (rows: layers)", resid_restored},
                                {"z by head (rows: layers)", head_restored}};
        plot_heatmap_grid_svg(path, "fraction of the clean logit difference restored", "position", "layer", panels, 1,
                              1, 2, N, NULL, 0);
        snprintf(path, sizeof path, "%s/patching_heads.svg", out_dir);
        plot_heatmap_grid_svg(path, "fraction restored by each head", "head", "layer", panels + 1, 1, 1, 2, 2, NULL, 0);
    }
    int status = qkv_error(ctx) != QKV_OK;
    if (status) fprintf(stderr, "%s\n", qkv_errmsg(ctx));
    qkv_ctx_free(ctx);
    return status;
}
