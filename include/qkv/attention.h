/*
 * qkv/attention.h — attention variants (included by qkv.h): the normaliser of scaled dot-product attention as
 * an option of the one fused kernel (ops/attention.c). f32 and f64; each result is a step tensor; gradients
 * flow to q, k, v and to the variant's trained parameters (the sink logits, the SSMax factors).
 *
 * For one query row with scores x_j = scale * q . k_j over the keys j the row keeps (mask and QKV_CAUSAL as
 * qkv_attention), the weights w_j and out = sum_j w_j v_j are:
 *
 *   QKV_ATTN_SOFTMAX   w_j = e^x_j / sum_k e^x_k                               Vaswani et al. 2017
 *                      qkv_attention itself. A fully masked row gives out 0.
 *   QKV_ATTN_SOFTMAX1  w_j = e^x_j / (1 + sum_k e^x_k)                         Miller 2023, "Attention is off by one"
 *                      the softmax with an extra logit 0 that has no value row: a row may give (almost) no
 *                      weight at all. A fully masked row gives out 0 (the extra logit takes all the weight).
 *   QKV_ATTN_SINK      w_j = e^x_j / (e^b_h + sum_k e^x_k)                     StreamingLLM's sink (Xiao et al. 2023);
 *                      b_h = sink[h], a trained logit per head (the extra logit of   gpt-oss
 *                      SOFTMAX1 made a parameter), compared with the scaled scores x (b is not scaled).
 *                      d b_h = -sum over the rows r of the batches of head h of e^(b_h - L_r) D_r, with
 *                      L_r = log(e^b_h + sum_k e^x_k) and D_r = dO_r . out_r. A fully masked row gives out 0,
 *                      its sink weight is 1 (and its D is 0).
 *   QKV_ATTN_SIGMOID   w_j = sigma(x_j + b)                                    Ramapuram et al. 2024, arXiv 2409.04431
 *                      no normaliser: rows do not sum to 1. b = sigmoid_bias, or when it is NaN (the
 *                      default) b = -log(n_k), n_k the number of keys (the key dimension of k: the paper's
 *                      -log(n) with n the sequence length; the same b for every row, masked or causal).
 *                      A dropped key gets 0; a fully masked row gives out 0.
 *   QKV_ATTN_SSMAX     w_j = softmax_j(c_h log(n_i) x_j)                       Nakanishi 2025, arXiv 2501.19399
 *                      scalable softmax: n_i the number of keys query i keeps (mask and causal counted),
 *                      c_h = ssmax_c[h] a trained factor per head. Computed as the softmax attention of
 *                      q_i' = c_h log(n_i) q_i (one pass over q), so dq and dc_h follow by the chain rule.
 *                      n_i = 1: log 1 = 0, the one key gets weight 1 (as with any softmax). A fully masked
 *                      row (n_i = 0) gives out 0 and no gradient.
 *   QKV_ATTN_SOFTPICK  w_j = relu(e^x_j - 1) / (sum_k |e^x_k - 1| + eps)       Zuhri et al. 2025, arXiv 2504.20966
 *                      eps = softpick_eps (default 1e-6, finite and > 0). Computed online over key tiles in
 *                      the stable form with m = max(0, max_k x_k): w_j = relu(e^(x_j-m) - e^-m) /
 *                      (sum_k |e^(x_k-m) - e^-m| + eps e^-m). A dropped key contributes nothing to the sum
 *                      (as if x = 0); a row whose scores are all <= 0, or that is fully masked, gives out 0.
 *                      Derivatives at x = 0 (relu and |.| kinks) are 0, as PyTorch's.
 *
 * Every variant keeps qkv_attention's guarantees: a dropped key's score is never read (a NaN or inf there does
 * not leak), a key every query drops is not read at all, and 1 and N threads give the same bits. A kept NaN
 * score makes its row NaN (sigmoid: its weight NaN); a NaN or infinite sink logit or SSMax factor makes the
 * rows of its head NaN (as a diverged parameter should show), not an error.
 * f32 runs each CPU's kernel set (SLEEF exp on AVX2 and AVX-512); f64 runs plain C (libm exp) for sigmoid and
 * softpick, and the softmax's f64 kernels for the others.
 *
 * Soft-capping (options.softcap = c > 0; Gemma 2, Team Gemma 2024, caps attention logits at c = 50, and Grok-1
 * at 30): every kept score x = scale * q . k_j becomes x' = c tanh(x / c) inside the fused tiles, and the
 * variant's weights above are then formed from x' in place of x (softmax1's extra logit 0, the sink's b_h and
 * the sigmoid's b are not capped; SSMax caps its own scores, x = c_h log(n_i) scale q . k_j, so that every
 * logit its softmax sees lies within (-c, c)). The backward recomputes t = tanh(x / c) from the scores of its
 * tile (nothing n_q x n_k is stored) and takes dx = dx' (1 - t^2). Edges: x' stays within [-c, c], a kept
 * +-inf score becomes +-c with gradient 0 (where the uncapped variants give NaN), a kept NaN stays NaN; large
 * |x| / c saturates t at +-1 and the gradient at exactly 0. A dropped key is still never read, and the result
 * equals qkv_softcap of the scores followed by the variant (the composed form, to rounding). f32 takes the
 * tanh of the CPU's unary kernels (SLEEF's 3.5-ulp tanhf on AVX2 and AVX-512, libm's otherwise), f64 libm's.
 *
 * Grouped-query attention (options.kv_heads = H_kv, with options.heads = H; Ainslie et al. 2023, H_kv = 1 is
 * Shazeer 2019's multi-query attention): q [B H, n_q, d_k] holds H query heads per batch element (the layout
 * qkv_split_heads makes), k [B H_kv, n_k, d_k] and v [B H_kv, n_k, d_v] hold H_kv key/value heads, and query
 * row b H + h reads key/value row b H_kv + h / (H / H_kv) (row r of q reads row r / (H / H_kv) of k and v).
 * The kernel reads the shared rows in place (nothing is repeated per query head), and the backward adds the
 * contributions of a key/value row's H / H_kv query rows into its dK and dV in one fixed order (query row by
 * row, for any thread count: the same bits). It composes with every variant, the soft-cap, masks (indexed by
 * q's batch, as without grouping) and QKV_CAUSAL; the result is the ungrouped attention of k and v repeated
 * by qkv_index_select (to rounding). kv_heads = 0 or H means no grouping.
 *
 * Not here (at the model level, since they add weights: qkv/model.h's config.attn_gate and config.attn_diff):
 * gated attention output (Qiu et al. 2025, arXiv 2505.06708) and differential attention (Ye et al. 2024,
 * arXiv 2410.05258).
 */
#ifndef QKV_ATTENTION_H
#define QKV_ATTENTION_H

#include "../qkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The attention variants (the table above). */
typedef enum qkv_attn_variant {
    QKV_ATTN_SOFTMAX = 0,
    QKV_ATTN_SOFTMAX1,
    QKV_ATTN_SINK,
    QKV_ATTN_SIGMOID,
    QKV_ATTN_SSMAX,
    QKV_ATTN_SOFTPICK,
    QKV_ATTN_VARIANT_COUNT
} qkv_attn_variant;

/* Options of qkv_attention_ex; qkv_attention_default_options() gives the defaults shown. */
typedef struct qkv_attention_options {
    qkv_attn_variant variant; /* QKV_ATTN_SOFTMAX                                                         */
    double scale;             /* QKV_SCALE_DEFAULT (1/sqrt(d_k)); any finite value, as qkv_attention        */
    int flags;                /* 0, or QKV_CAUSAL                                                        */
    const qkv_tensor *mask;   /* NULL, or a u8 mask as qkv_attention's                                   */
    int heads;                /* 1: batch element b uses the per-head parameters of head b % heads (the
                               * layout qkv_split_heads makes); must divide the batch                    */
    qkv_tensor *sink;         /* QKV_ATTN_SINK: the logits b [heads], q's dtype; gradient flows to it     */
    double sigmoid_bias;      /* QKV_ATTN_SIGMOID: b; NaN (the default) means -log(n_k); else finite       */
    qkv_tensor *ssmax_c;      /* QKV_ATTN_SSMAX: the factors c [heads], q's dtype; gradient flows to it   */
    double softpick_eps;      /* QKV_ATTN_SOFTPICK: eps, 1e-6; finite and > 0                            */
    double softcap;           /* 0: off; else the cap c (finite, > 0): each score x becomes c tanh(x / c)
                               * before the variant's weights (the soft-capping paragraph above)          */
    int kv_heads;             /* 0: no grouping; else grouped-query attention (the paragraph above) with
                               * kv_heads key/value heads shared by the `heads` query heads; must divide heads
                               * (heads itself or 0: every query head its own)                          */
} qkv_attention_options;

/* The defaults: softmax, QKV_SCALE_DEFAULT, no flags, no mask, 1 head, sigmoid_bias NaN, softpick_eps 1e-6,
 * softcap 0 (off), kv_heads 0 (no grouping), no tensors. */
QKV_API qkv_attention_options qkv_attention_default_options(void);

/* Attention with a variant's weights (the table above): q [B, n_q, d_k], k [B, n_k, d_k], v [B, n_k, d_v] ->
 * out [B, n_q, d_v] (2-D operands: B = 1; with kv_heads, k and v [B / heads * kv_heads, n_k, .]), on the fused path (one tape node, "qkv_attention_ex"; SSMax adds
 * one node before it that scales q). options NULL means the defaults (then, as with QKV_ATTN_SOFTMAX, this
 * is qkv_attention). attn, when not NULL, receives the weights w [B, n_q, n_k] formed beside out by the
 * public operators (as qkv_attention's attn: a gradient of w flows through them; out is the fused one).
 * Errors (QKV_ERR_ARG unless said), naming qkv_attention_ex and the shapes: an unknown variant; heads < 1 or
 * not dividing B (QKV_ERR_SHAPE); a sink or ssmax_c that the variant needs missing, not of q's dtype
 * (QKV_ERR_DTYPE) or not [heads] (QKV_ERR_SHAPE); a NaN or infinite softpick_eps, or eps <= 0; an infinite
 * sigmoid_bias; a softcap that is NaN, infinite or negative; kv_heads negative or not dividing heads
 * (QKV_ERR_SHAPE), or k and v of another batch than B / heads * kv_heads (QKV_ERR_SHAPE); and qkv_attention's
 * errors. A tensor the variant does not use is ignored. */
QKV_API qkv_tensor *qkv_attention_ex(qkv_ctx *ctx, qkv_tensor *q, qkv_tensor *k, qkv_tensor *v,
                                     const qkv_attention_options *options, qkv_tensor **attn);

/* The variant's name: "softmax", "softmax1", "sink", "sigmoid", "ssmax", "softpick"; NULL for a value
 * outside the enum. */
QKV_API const char *qkv_attn_variant_name(qkv_attn_variant variant);

/* The variant named name (exactly one of the names above, as written), into *variant; false (and *variant
 * unchanged) for any other string or NULL. */
QKV_API bool qkv_attn_variant_from_name(const char *name, qkv_attn_variant *variant);

#ifdef __cplusplus
}
#endif

#endif /* QKV_ATTENTION_H */
