/*
 * seed_example — the textbook's worked example of self-attention, step by step, then its gradients.
 *
 * Three tokens with d_k = d_v = 2 (../shared/seed/README.md):
 *   1. scores  S  = Q K^T
 *   2. scale   S' = S / sqrt(d_k)
 *   3. weights A  = softmax(S') by rows
 *   4. output  O  = A V
 * Then the loss L = 1/2 ||O - V||^2 (each token should fetch its own value) is differentiated with
 * respect to Q, K and V by qkv's backward.
 */
#include <math.h>
#include <stdio.h>

#include "args.h"
#include "qkv.h"

static void show(qkv_ctx *ctx, const char *title, const qkv_tensor *t) {
    printf("%s\n", title);
    for (int64_t i = 0; i < t->shape[0]; i++) {
        printf("  [");
        for (int64_t j = 0; j < t->shape[1]; j++)
            printf(j ? "  %9.6f" : "%9.6f", qkv_get(ctx, t, (int64_t[]){i, j}));
        printf(" ]\n");
    }
}

static qkv_tensor *matrix(qkv_ctx *ctx, const double *values) {
    qkv_tensor *t = qkv_from_data(ctx, QKV_F64, 2, (int64_t[]){3, 2}, values);
    qkv_set_requires_grad(ctx, t, true);
    return t;
}

int main(int argc, char **argv) {
    int status = args_none("seed_example", argc, argv,
                           "The textbook's self-attention example on three tokens, step by step, then its\n"
                           "gradients and one gradient step. It takes no flags but --help.\n");
    if (status >= 0) return status;
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    if (!ctx) {
        fprintf(stderr, "seed_example: out of memory\n");
        return 1;
    }
    qkv_tensor *q = matrix(ctx, (const double[]){1, 0, 0, 1, 1, 1});
    qkv_tensor *k = matrix(ctx, (const double[]){1, 0, 0, 1, 1, 0});
    qkv_tensor *v = matrix(ctx, (const double[]){10, 0, 0, 10, 5, 5});

    printf("Self-attention on three tokens, d_k = d_v = 2\n\n");
    show(ctx, "Q (what each token looks for)", q);
    show(ctx, "K (what each token holds)", k);
    show(ctx, "V (what each token gives)", v);

    qkv_tensor *scores = qkv_matmul(ctx, q, k, QKV_TRANS_B);
    qkv_tensor *scaled = qkv_scale(ctx, scores, 1.0 / sqrt(2.0));
    qkv_tensor *weights = qkv_softmax(ctx, scaled, NULL, 0);
    qkv_tensor *out = qkv_matmul(ctx, weights, v, 0);
    if (qkv_error(ctx)) {
        fprintf(stderr, "seed_example: %s\n", qkv_errmsg(ctx));
        return 1;
    }
    printf("\n");
    show(ctx, "1. scores S = Q K^T (dot product of every query with every key)", scores);
    show(ctx, "2. scaled S / sqrt(d_k) = S / 1.4142 (keeps the variance of the scores near 1)", scaled);
    show(ctx, "3. weights A = softmax by rows (each row sums to 1)", weights);
    show(ctx, "4. output A V (each row a weighted mix of the values)", out);
    printf("\nRow 3: query [1, 1] is equally similar to every key (score 1 each), so its weights are\n"
           "1/3 each and its output is the mean of the values, (10 + 0 + 5)/3 = 5.\n");

    /* L = 1/2 sum((O - V)^2): each token should fetch its own value */
    qkv_tensor *diff = qkv_sub(ctx, out, v);
    qkv_tensor *loss = qkv_mul(ctx, qkv_sum(ctx, qkv_mul(ctx, diff, diff)), qkv_scalar(ctx, QKV_F64, 0.5));
    if (qkv_backward(ctx, loss, NULL) != QKV_OK) {
        fprintf(stderr, "seed_example: %s\n", qkv_errmsg(ctx));
        return 1;
    }
    printf("\nLoss L = 1/2 ||O - V||^2 = %.6f (each token should fetch its own value)\n",
           qkv_get(ctx, loss, NULL));
    show(ctx, "dL/dQ", q->grad);
    show(ctx, "dL/dK", k->grad);
    show(ctx, "dL/dV", v->grad);
    printf("Row 3 of dL/dQ is zero: the third token's output (5, 5) already equals its own value.\n");

    /* One gradient step on Q and K (V fixed): does each token attend more to itself? */
    qkv_set_grad_enabled(ctx, false);
    const double lr = 0.05;
    qkv_tensor *q1 = qkv_sub(ctx, q, qkv_scale(ctx, q->grad, lr));
    qkv_tensor *k1 = qkv_sub(ctx, k, qkv_scale(ctx, k->grad, lr));
    qkv_tensor *weights1 = NULL;
    qkv_attention(ctx, q1, k1, v, NULL, QKV_SCALE_DEFAULT, 0, &weights1);
    if (qkv_error(ctx)) {
        fprintf(stderr, "seed_example: %s\n", qkv_errmsg(ctx));
        return 1;
    }
    printf("\nAfter one step Q -= %.2f dL/dQ, K -= %.2f dL/dK, each token's weight on itself:\n", lr, lr);
    for (int64_t i = 0; i < 3; i++)
        printf("  token %lld: %.6f -> %.6f\n", (long long)i + 1, qkv_get(ctx, weights, (int64_t[]){i, i}),
               qkv_get(ctx, weights1, (int64_t[]){i, i}));
    qkv_ctx_free(ctx);
    return 0;
}
