/*
 * qkv/hooks.h — looking inside a model (included by qkv.h; include qkv.h, not this file): hook points with
 * TransformerLens's names, an activation cache, hooks that read and replace, activation patching, ablation at
 * any hook point, the logit lens and direct logit attribution. docs/patching.md walks through an experiment.
 *
 * One table of hook points: every activation below has a name, and everything on this page (the cache,
 * qkv_model_inspect of model.h, callbacks, patching, ablation) reads or writes the value at a hook point as
 * the forward passes it. A forward with nothing set at any point does one test per point and nothing else;
 * a point nobody asked for costs that test (and nothing is formed for it).
 *
 * The points, in forward order (B batch, n positions, H n_head, K n_kv_head, d d_model, dh d_head; an
 * unbatched forward has B = 1). qkv keeps heads as [B*H, n, dh], head h of batch b at b*H + h; the last
 * column is the TransformerLens shape and how to get it from qkv's (numpy spelling):
 *
 *   hook_embed                  [B, n, d]      W_E[ids]                                 same
 *   hook_pos_embed              [B, n, d]      the position rows added (learned or      TL: [B, n, d] (TL
 *                                              sinusoidal positions only)               broadcasts [n, d])
 *   blocks.L.hook_resid_pre     [B, n, d]      the residual stream into block L         same
 *   blocks.L.ln1.hook_scale     [B, n, 1]      sqrt(mean((x - mean x)^2) + eps) (layer) same
 *                                              or sqrt(mean(x^2) + eps) (rms)
 *   blocks.L.ln1.hook_normalized [B, n, d]     the norm's output, gain and bias applied same for layer norm;
 *                                                                                       TL's RMSNorm hooks it
 *                                                                                       before the gain
 *   blocks.L.attn.hook_q        [B*H, n, dh]   h W_Q + b_Q per head, before qk-norm and  [B, n, H, dh]:
 *                                              rope                                     .reshape(B,H,n,dh)
 *                                                                                       .transpose(0,2,1,3)
 *   blocks.L.attn.hook_k, hook_v [B*K, n, dh]  the same for W_K, W_V (key/value heads,  [B, n, K, dh], as q
 *                                              before any grouping repeat)
 *   blocks.L.attn.hook_rot_q    [B*H, n, dh]   q after qk-norm and rope (rope only;     as hook_q
 *                                              attn_diff: each half rotated on its own)
 *   blocks.L.attn.hook_rot_k    [B*K, n, dh]   k after qk-norm and rope (rope only)     as hook_k
 *   blocks.L.attn.hook_attn_scores [B*H, n, n] the softmax's input: scale q k^T, after  [B, H, n, n]:
 *                                              any soft-cap; -inf where a causal        .reshape(B,H,n,n)
 *                                              forward masks (j > i), as TL             (same memory)
 *   blocks.L.attn.hook_pattern  [B*H, n, n]    the attention weights (a user's           as scores
 *                                              config.attn_weights included; attn_diff:
 *                                              A1 - lambda A2, model.h)
 *   blocks.L.attn.hook_gate     [B*H, n, 1]    attn_gate head: sigmoid(h W_G + b_G), one   not in TL; as q
 *                               [B*H, n, dh]   gate per head; element: one per element of  (last dim 1 or dh)
 *                                              z (h = ln1's output, model.h)
 *   blocks.L.attn.hook_z        [B*H, n, dh]   pattern v, each head's output (times the [B, n, H, dh], as q
 *                                              gate when attn_gate: what W_O reads)
 *   blocks.L.hook_attn_out      [B, n, d]      merge(z) W_O + b_O (after dropout): what  same
 *                                              the attention adds to the residual stream
 *   blocks.L.hook_resid_mid     [B, n, d]      resid_pre + attn_out                     same
 *   blocks.L.ln2.hook_scale, ln2.hook_normalized   as ln1, before the MLP (d_mlp > 0)
 *   blocks.L.mlp.hook_pre       [B, n, d_mlp]  h W_in + b_in before the activation; gated: same
 *                                              h W_gate (the activation's input)
 *   blocks.L.mlp.hook_pre_linear [B, n, d_mlp] h W_in of a gated MLP (swiglu, geglu)    same
 *   blocks.L.mlp.hook_post      [B, n, d_mlp]  act(pre), or act(pre) * pre_linear + b_in same
 *   blocks.L.hook_mlp_out       [B, n, d]      post W_out + b_out (after dropout)        same
 *   blocks.L.hook_resid_post    [B, n, d]      out of block L                           same
 *   ln_final.hook_scale         [B, n, 1]      as ln1, of the last resid_post            same
 *   ln_final.hook_normalized    [B, n, d]      the final norm's output (into W_U)        as ln1
 *
 * A point exists only where the model has its part: no ln*.hook_* for norm "none", no ln2 or mlp points in an
 * attention-only model, no hook_pos_embed for rope or no positions, hook_rot_* only with rope, hook_pre_linear
 * only when gated, hook_gate only with config.attn_gate, no hook_attn_scores with config.attn_diff (two score
 * matrices). qkv_model_hook_count / qkv_model_hook_name list the model's points in the order above.
 *
 * Cost and paths. With no soft-cap and no user's weights attention is one fused kernel that never forms the
 * n x n matrix; asking for hook_pattern or hook_attn_scores forms them beside it (with gradient recording off
 * for the scores), and z stays the fused kernel's, bit for bit. A hook that returns a replacement pattern
 * makes z = pattern v (qkv_matmul), and a replacement of the scores makes pattern = softmax(scores) first:
 * equal to the fused result to rounding, not bit for bit. A hook or patch at ln*.hook_scale computes that
 * norm from its parts (centre, scale, divide, gain, bias) so that a replaced scale acts: equal to the fused
 * norm to rounding (the cache reads the scale computed beside the fused norm, with recording off). Every other
 * point reads or replaces the value in place, so a hook that hands the value back unchanged changes nothing,
 * bit for bit, and the cache (any selection) leaves the logits as they are, bit for bit.
 */
#ifndef QKV_HOOKS_H
#define QKV_HOOKS_H

#include "../qkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the points ------------------------------------------------------------------------------------- */

/* The number of hook points of m, and the name of point i (0 <= i < count; NULL outside), in forward order.
 * The names belong to the model. */
QKV_API int qkv_model_hook_count(const qkv_model *m);
QKV_API const char *qkv_model_hook_name(const qkv_model *m, int i);
/* The index of a hook point by name, or -1 with QKV_ERR_ARG naming it and the valid names near it. */
QKV_API int qkv_model_hook_find(qkv_ctx *ctx, const qkv_model *m, const char *name);

/* ---- hooks that read and replace ---------------------------------------------------------------------- */

/* A user's hook, called by every forward when it passes the point, with the activation (a step tensor; on the
 * tape when recording). Return NULL to leave it unchanged (read it, copy it, count it), or a replacement of
 * the same shape and dtype, built from qkv operators so that the gradient flows through it (a user-defined
 * operator, qkv/custom.h, counts). A replacement of another shape or dtype is QKV_ERR_SHAPE naming the point
 * and both shapes. To fail, store an error (a failing qkv call does, or qkv_set_error) and return NULL: the
 * forward returns NULL with the message prefixed by the point's name. */
typedef qkv_tensor *(*qkv_hook_fn)(qkv_ctx *ctx, const char *name, qkv_tensor *value, void *user);
/* Call fn at the named point in every later forward until cleared (one hook per point: a second on a point that
 * has one is QKV_ERR_STATE). An unknown name is QKV_ERR_ARG naming it and hinting the valid ones. */
QKV_API qkv_status qkv_model_add_hook(qkv_ctx *ctx, qkv_model *m, const char *name, qkv_hook_fn fn, void *user);
/* Remove every hook, patch and ablation set on this page (the cache, inspection and qkv_model_ablate_head's
 * switches stay: qkv_model_clear_ablations clears those). */
QKV_API void qkv_model_clear_hooks(qkv_model *m);

/* ---- the cache (TransformerLens's run_with_cache) ------------------------------------------------------- */

/* Keep, in every later forward, the value of each point whose name matches glob: '*' matches any run of
 * characters (dots included), '?' one character, anything else itself, so an exact name selects one point,
 * "blocks.*.hook_resid_post" one per layer, "*hook_pattern" every pattern and "*" everything. Selections add
 * up until qkv_model_cache_clear. A glob that matches no point is QKV_ERR_ARG (a typo never caches nothing
 * silently). The value kept is the one the forward carried on (a hook's replacement where there is one).
 * Points not selected cost nothing. qkv_model_sample's forwards keep nothing (their steps are rewound) and leave
 * no values behind. */
QKV_API qkv_status qkv_model_cache_select(qkv_ctx *ctx, qkv_model *m, const char *glob);
/* The same with a predicate: keep every point for which keep(name, user) is true (asked once per point now,
 * not in the forward). Selecting none is allowed here. */
typedef bool (*qkv_hook_filter_fn)(const char *name, void *user);
QKV_API qkv_status qkv_model_cache_select_fn(qkv_ctx *ctx, qkv_model *m, qkv_hook_filter_fn keep, void *user);
/* Select nothing (qkv_model_set_inspect of model.h is separate and stays as it is). */
QKV_API void qkv_model_cache_clear(qkv_model *m);
/* Clear the selection, select glob, and run qkv_model_forward: the logits, with the cache filled. */
QKV_API qkv_tensor *qkv_model_run_with_cache(qkv_ctx *ctx, qkv_model *m, const qkv_tensor *ids, int flags,
                                             const char *glob);
/* The cached value at name from the last forward (a step tensor, valid until qkv_step_end). NULL with
 * QKV_ERR_ARG for an unknown name, QKV_ERR_STATE when the point is not selected or no forward has run in this
 * step. */
QKV_API qkv_tensor *qkv_model_cached(qkv_ctx *ctx, const qkv_model *m, const char *name);
/* Write every cached value of the last forward to dir/<name>.npy (e.g. dir/blocks.0.hook_resid_post.npy, in
 * qkv's layout above; each file atomically, with qkv_npy_save). dir must exist. The number of files written
 * goes to *written when not NULL. */
QKV_API qkv_status qkv_model_cache_save_npy(qkv_ctx *ctx, const qkv_model *m, const char *dir, int *written);

/* ---- patching and ablation ---------------------------------------------------------------------------- */

/* Replace, in every later forward until qkv_model_clear_hooks, the value at the named point by source's at
 * position pos (-1: every position) and head (-1: every head; only for the per-head points q, k, v, rot_q,
 * rot_k, attn_scores, pattern and z, whose heads are K for k, v, rot_k and H otherwise), for every batch
 * element. source has the point's shape and dtype in that forward (a cached value of the same point from
 * another run, usually the clean one) and must stay valid while forwards use it. For the points [B*H, n, n]
 * the position is the query's; for [B, n, 1] and [B, n, d] the row's. The replacement is qkv_where(mask,
 * source, value): source's values exactly where patched, the forward's elsewhere, the gradient to each
 * through its part. It occupies the point's hook (QKV_ERR_STATE if the point has one). */
QKV_API qkv_status qkv_model_patch(qkv_ctx *ctx, qkv_model *m, const char *name, int64_t pos, int64_t head,
                                   const qkv_tensor *source);

/* Ablate at any point, as qkv_model_patch places it (name, pos, head), in every later forward until
 * qkv_model_clear_hooks:
 *   QKV_ABLATE_ZERO      the value is 0 there (source NULL)
 *   QKV_ABLATE_MEAN      the value there is its mean over the batch (over every batch element of that forward,
 *                        position by position and head by head; no gradient through the mean; source NULL)
 *   QKV_ABLATE_RESAMPLE  the value there is source's (the same point's value on another batch, cached): the
 *                        same as qkv_model_patch (model.h's qkv_ablation_kind names all three). */
QKV_API qkv_status qkv_model_ablate(qkv_ctx *ctx, qkv_model *m, const char *name, int64_t pos, int64_t head,
                                    qkv_ablation_kind kind, const qkv_tensor *source);

/* A number computed from a forward's logits (e.g. the logit difference of the right and a wrong answer, or a
 * loss), for qkv_model_patch_sweep. Store an error and return NaN to fail. */
typedef double (*qkv_metric_fn)(qkv_ctx *ctx, const qkv_tensor *logits, void *user);
/* What a sweep patches one at a time: the whole point of each layer, or each position, each head, or each
 * position of each head. */
enum { QKV_PATCH_BY_POS = 1, QKV_PATCH_BY_HEAD = 2 };
/* Activation patching (TransformerLens's patching.py): run clean_ids caching the point `hook` of every layer
 * (hook is the part after "blocks.L.", e.g. "hook_resid_pre" or "attn.hook_z"), then run corrupted_ids (the
 * same shape) once per layer L [x position] [x head] with blocks.L.<hook> patched from the clean run there
 * (qkv_model_patch), and evaluate metric on each run's logits. Returns f64 [n_layer], [n_layer, n],
 * [n_layer, heads] or [n_layer, n, heads] (by = 0, BY_POS, BY_HEAD, BY_POS | BY_HEAD): entry [L, i, h] is
 * metric of the corrupted run patched at layer L, position i, head h. Runs with recording off; the hooks,
 * patches, ablations (qkv_model_ablate_head's too), inspection and cache set before are suspended during the
 * sweep and restored after (values cached before are not kept); the step arena is returned
 * to where it was except for the table. Patching clean_ids with its own values gives metric(clean) in every
 * entry, bit for bit, at every point but those noted under "Cost and paths" above. */
QKV_API qkv_tensor *qkv_model_patch_sweep(qkv_ctx *ctx, qkv_model *m, const char *hook, const qkv_tensor *clean_ids,
                                          const qkv_tensor *corrupted_ids, int flags, int by, qkv_metric_fn metric,
                                          void *user);

/* ---- the logit lens and direct logit attribution -------------------------------------------------------- */

/* The model's last two steps on any residual stream: logits = ln_final(resid) W_U (or W_E^T when tied), resid
 * [.., d_model] of the model's dtype (a cached hook_resid_post, or a sum of parts). Recorded when recording is
 * on. On a forward's last hook_resid_post it gives that forward's logits, bit for bit. */
QKV_API qkv_tensor *qkv_model_unembed(qkv_ctx *ctx, qkv_model *m, qkv_tensor *resid);

/* The logit lens (nostalgebraist 2020): run ids (as qkv_model_forward) and read every layer's residual stream
 * through ln_final and the unembedding, each with its own ln_final statistics. Returns [n_layer + 1, B, n,
 * vocab] in the model's dtype (B = 1 for ids [n]): row 0 from blocks.0.hook_resid_pre (the embedding), row
 * L + 1 from blocks.L.hook_resid_post; the last row is the model's logits, bit for bit. Runs with recording
 * off and the hooks, patches and cache set before suspended (restored after; values cached before are not
 * kept). */
QKV_API qkv_tensor *qkv_model_logit_lens(qkv_ctx *ctx, qkv_model *m, const qkv_tensor *ids, int flags);

/* Direct logit attribution of the logit difference logit[token_a] - logit[token_b] at position pos: run ids
 * (recording off, no dropout; what was set before suspended as for the logit lens) and split the final residual
 * stream into what each part wrote to it, each part pushed through ln_final with the scale frozen at this
 * run's ln_final.hook_scale (TransformerLens's cache.apply_ln_to_stack: centred for layer norm, divided by the
 * scale, times the gain) and dotted with W_U[:, a] - W_U[:, b]. Returns f64 [B, parts + 1]: the parts in the
 * order of qkv_model_attribution_label, then the model's own logit difference. The parts add up to it (the
 * decomposition is exact; in f64 to rounding, tests/test_hooks.c checks 1e-10). A head's part is
 * z_h[pos] W_O[h rows]; an MLP's is its hook_mlp_out. */
QKV_API qkv_tensor *qkv_model_logit_attribution(qkv_ctx *ctx, qkv_model *m, const qkv_tensor *ids, int flags,
                                                int64_t pos, int32_t token_a, int32_t token_b);
/* The number of parts, and part i's label into buf: "embed", "pos_embed" (learned or sinusoidal positions),
 * per block "L<l>H<h>" for each head, "blocks.<l>.attn.b_O" (attn_bias), "blocks.<l>.mlp" (d_mlp > 0), and
 * "ln_final.b" (layer norm). false for i out of range. */
QKV_API int qkv_model_attribution_count(const qkv_model *m);
QKV_API bool qkv_model_attribution_label(const qkv_model *m, int i, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* QKV_HOOKS_H */
