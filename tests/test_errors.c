/*
 * test_errors.c — misuse, table-driven. Each case does one wrong thing on a fresh context and names the
 * status it must store and fragments its message must contain (the function, the shapes, the problem).
 * None may crash, abort or print; after each, the context must work again once the error is cleared.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qkv.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static qkv_tensor *f64(qkv_ctx *ctx, int ndim, const int64_t *shape) { return qkv_ones(ctx, QKV_F64, ndim, shape); }

static void *failing_malloc(size_t size, void *user) {
    long *budget = user;
    if (*budget <= 0) return NULL;
    (*budget)--;
    return malloc(size);
}

static void plain_free(void *p, void *user) {
    (void)user;
    free(p);
}

/* ---- the misuses --------------------------------------------------------------------------------- */

static void null_shape(qkv_ctx *c) { qkv_zeros(c, QKV_F32, 2, NULL); }
static void too_many_dims(qkv_ctx *c) { qkv_zeros(c, QKV_F32, SHAPE(1, 2, 3, 4, 5)); }
static void negative_dim(qkv_ctx *c) { qkv_zeros(c, QKV_F32, SHAPE(2, -3)); }
static void size_overflow(qkv_ctx *c) { qkv_zeros(c, QKV_F64, SHAPE(1LL << 40, 1LL << 40)); }
static void bad_dtype(qkv_ctx *c) { qkv_zeros(c, (qkv_dtype)9, SHAPE(2)); }
static void empty_negative_dim(qkv_ctx *c) { qkv_empty(c, QKV_F32, SHAPE(4, -1)); }
static void empty_overflow(qkv_ctx *c) { qkv_empty(c, QKV_F32, SHAPE(1LL << 40, 1LL << 40)); }
static void random_int(qkv_ctx *c) { qkv_randn(c, QKV_I32, SHAPE(2), 0, 1); }
static void negative_std(qkv_ctx *c) { qkv_randn(c, QKV_F32, SHAPE(2), 0, -1); }
static void null_data(qkv_ctx *c) { qkv_from_data(c, QKV_F32, SHAPE(2), NULL); }
static void bad_fans(qkv_ctx *c) { qkv_xavier_uniform(c, QKV_F32, 0, 4); }
static void add_null(qkv_ctx *c) { qkv_add(c, NULL, f64(c, SHAPE(2))); }
static void add_shapes(qkv_ctx *c) { qkv_add(c, f64(c, SHAPE(2, 3)), f64(c, SHAPE(4))); }
static void add_dtypes(qkv_ctx *c) { qkv_add(c, f64(c, SHAPE(3)), qkv_ones(c, QKV_F32, SHAPE(3))); }
static void mul_int(qkv_ctx *c) { qkv_mul(c, qkv_ones(c, QKV_I32, SHAPE(3)), qkv_ones(c, QKV_I32, SHAPE(3))); }
static void reshape_count(qkv_ctx *c) { qkv_reshape(c, f64(c, SHAPE(2, 3)), SHAPE(4)); }
static void get_out_of_range(qkv_ctx *c) { qkv_get(c, f64(c, SHAPE(2, 3)), (int64_t[]){1, 3}); }
static void matmul_inner(qkv_ctx *c) { qkv_matmul(c, f64(c, SHAPE(2, 3, 4)), f64(c, SHAPE(2, 5, 6)), 0); }
static void matmul_batch(qkv_ctx *c) { qkv_matmul(c, f64(c, SHAPE(2, 3, 4)), f64(c, SHAPE(3, 4, 6)), 0); }
static void projection_w_rank(qkv_ctx *c) { qkv_projection(c, f64(c, SHAPE(2, 3, 4)), f64(c, SHAPE(1, 4, 5)), NULL); }
static void projection_inner(qkv_ctx *c) { qkv_projection(c, f64(c, SHAPE(2, 3, 4)), f64(c, SHAPE(3, 5)), NULL); }
static void projection_bias(qkv_ctx *c) {
    qkv_projection(c, f64(c, SHAPE(2, 3, 4)), f64(c, SHAPE(4, 5)), f64(c, SHAPE(4)));
}
static void scale_inf(qkv_ctx *c) { qkv_scale(c, f64(c, SHAPE(2)), 1.0 / 0.0); }
static void softmax_mask_dtype(qkv_ctx *c) { qkv_softmax(c, f64(c, SHAPE(2, 3, 3)), f64(c, SHAPE(3, 3)), 0); }
static void softmax_mask_shape(qkv_ctx *c) {
    qkv_softmax(c, f64(c, SHAPE(2, 3, 3)), qkv_ones(c, QKV_U8, SHAPE(3, 4)), 0);
}
static void softmax_flags(qkv_ctx *c) { qkv_softmax(c, f64(c, SHAPE(2, 3, 3)), NULL, 0x40); }
static void split_heads_divisible(qkv_ctx *c) { qkv_split_heads(c, f64(c, SHAPE(2, 3, 10)), 3); }
static void ce_target_range(qkv_ctx *c) {
    qkv_tensor *t = qkv_zeros(c, QKV_I32, SHAPE(2, 3));
    qkv_i32(t)[4] = 7;
    qkv_cross_entropy(c, f64(c, SHAPE(2, 3, 5)), t);
}
static void ce_target_dtype(qkv_ctx *c) { qkv_cross_entropy(c, f64(c, SHAPE(2, 5)), f64(c, SHAPE(2))); }
static void attention_dk(qkv_ctx *c) {
    qkv_attention(c, f64(c, SHAPE(2, 3, 4)), f64(c, SHAPE(2, 5, 3)), f64(c, SHAPE(2, 5, 2)), NULL,
                  QKV_SCALE_DEFAULT, 0, NULL);
}
static void backward_non_scalar(qkv_ctx *c) {
    qkv_tensor *a = f64(c, SHAPE(2, 2));
    qkv_set_requires_grad(c, a, true);
    qkv_backward(c, qkv_mul(c, a, a), NULL);
}
static void backward_twice(qkv_ctx *c) {
    qkv_tensor *a = f64(c, SHAPE(2));
    qkv_set_requires_grad(c, a, true);
    qkv_tensor *l = qkv_sum(c, a);
    qkv_backward(c, l, NULL);
    qkv_backward(c, l, NULL);
}
static void backward_no_grad(qkv_ctx *c) { qkv_backward(c, qkv_sum(c, f64(c, SHAPE(2))), NULL); }
static void stale_tensor(qkv_ctx *c) {
    qkv_step_end(c);
    qkv_tensor *t = f64(c, SHAPE(3));
    qkv_step_end(c);
    qkv_sum(c, t);
}
static void npy_missing(qkv_ctx *c) { qkv_npy_load(c, "/nonexistent/dir/x.npy"); }
static void npy_garbage(qkv_ctx *c) { qkv_npy_load_mem(c, "not a numpy file at all", 23); }
static void gradcheck_no_input(qkv_ctx *c) {
    qkv_gradcheck_result r;
    qkv_tensor *t = qkv_ones(c, QKV_F32, SHAPE(2));
    qkv_gradcheck(c, NULL, &t, 1, NULL, NULL, &r);
}

/* relu, softcap, rope, dropout, sinusoidal positions */
static void relu_null(qkv_ctx *c) { qkv_relu(c, NULL); }
static void relu_i32(qkv_ctx *c) { qkv_relu(c, qkv_ones(c, QKV_I32, SHAPE(3))); }
static void softcap_zero(qkv_ctx *c) { qkv_softcap(c, f64(c, SHAPE(2, 3)), 0.0); }
static void softcap_negative(qkv_ctx *c) { qkv_softcap(c, f64(c, SHAPE(2, 3)), -2.0); }
static void softcap_nan(qkv_ctx *c) { qkv_softcap(c, f64(c, SHAPE(4)), NAN); }
static void softcap_inf(qkv_ctx *c) { qkv_softcap(c, f64(c, SHAPE(4)), INFINITY); }
static void softcap_u8(qkv_ctx *c) { qkv_softcap(c, qkv_ones(c, QKV_U8, SHAPE(3)), 1.0); }
static void rope_null(qkv_ctx *c) { qkv_rope(c, NULL, 10000.0, 0); }
static void rope_i32(qkv_ctx *c) { qkv_rope(c, qkv_ones(c, QKV_I32, SHAPE(3, 4)), 10000.0, 0); }
static void rope_rank1(qkv_ctx *c) { qkv_rope(c, f64(c, SHAPE(6)), 10000.0, 0); }
static void rope_rank4(qkv_ctx *c) { qkv_rope(c, f64(c, SHAPE(1, 2, 3, 4)), 10000.0, 0); }
static void rope_odd_d(qkv_ctx *c) { qkv_rope(c, f64(c, SHAPE(2, 3, 5)), 10000.0, 0); }
static void rope_base_one(qkv_ctx *c) { qkv_rope(c, f64(c, SHAPE(3, 4)), 1.0, 0); }
static void rope_base_inf(qkv_ctx *c) { qkv_rope(c, f64(c, SHAPE(3, 4)), INFINITY, 0); }
static void rope_base_nan(qkv_ctx *c) { qkv_rope(c, f64(c, SHAPE(3, 4)), NAN, 0); }
static void rope_offset_negative(qkv_ctx *c) { qkv_rope(c, f64(c, SHAPE(3, 4)), 10000.0, -1); }
static void rope_offset_overflow(qkv_ctx *c) { qkv_rope(c, f64(c, SHAPE(3, 4)), 10000.0, INT64_MAX - 1); }
static void dropout_null(qkv_ctx *c) { qkv_dropout(c, NULL, 0.5); }
static void dropout_i32(qkv_ctx *c) { qkv_dropout(c, qkv_ones(c, QKV_I32, SHAPE(3)), 0.5); }
static void dropout_one(qkv_ctx *c) { qkv_dropout(c, f64(c, SHAPE(2, 3)), 1.0); }
static void dropout_negative(qkv_ctx *c) { qkv_dropout(c, f64(c, SHAPE(2, 3)), -0.1); }
static void dropout_nan(qkv_ctx *c) { qkv_dropout(c, f64(c, SHAPE(2, 3)), NAN); }
static void dropout_eval_bad_p(qkv_ctx *c) {
    qkv_set_grad_enabled(c, false); /* checked even when x would be returned unchanged */
    qkv_dropout(c, f64(c, SHAPE(5)), 1.5);
    qkv_set_grad_enabled(c, true);
}
static void sinusoidal_n0(qkv_ctx *c) { qkv_sinusoidal_positions(c, 0, 8, QKV_F32); }
static void sinusoidal_d_negative(qkv_ctx *c) { qkv_sinusoidal_positions(c, 4, -2, QKV_F64); }
static void sinusoidal_i32(qkv_ctx *c) { qkv_sinusoidal_positions(c, 4, 8, QKV_I32); }
static void sinusoidal_overflow(qkv_ctx *c) { qkv_sinusoidal_positions(c, 1LL << 40, 1LL << 40, QKV_F32); }

/* embedding, layer norm, RMS norm, GELU */
static qkv_tensor *ids_of(qkv_ctx *c, int32_t id) {
    qkv_tensor *t = qkv_zeros(c, QKV_I32, SHAPE(2, 3));
    if (t) qkv_i32(t)[4] = id;
    return t;
}
static void emb_table_null(qkv_ctx *c) { qkv_embedding(c, NULL, ids_of(c, 0)); }
static void emb_ids_null(qkv_ctx *c) { qkv_embedding(c, f64(c, SHAPE(5, 3)), NULL); }
static void emb_table_i32(qkv_ctx *c) { qkv_embedding(c, qkv_zeros(c, QKV_I32, SHAPE(5, 3)), ids_of(c, 0)); }
static void emb_table_rank(qkv_ctx *c) { qkv_embedding(c, f64(c, SHAPE(2, 5, 3)), ids_of(c, 0)); }
static void emb_ids_f64(qkv_ctx *c) { qkv_embedding(c, f64(c, SHAPE(5, 3)), f64(c, SHAPE(4))); }
static void emb_ids_rank(qkv_ctx *c) { qkv_embedding(c, f64(c, SHAPE(5, 3)), qkv_zeros(c, QKV_I32, SHAPE(2, 2, 2))); }
static void emb_id_too_big(qkv_ctx *c) { qkv_embedding(c, f64(c, SHAPE(5, 3)), ids_of(c, 5)); }
static void emb_id_negative(qkv_ctx *c) { qkv_embedding(c, f64(c, SHAPE(5, 3)), ids_of(c, -2)); }
static void ln_x_null(qkv_ctx *c) { qkv_layer_norm(c, NULL, NULL, NULL, 1e-5); }
static void ln_x_i32(qkv_ctx *c) { qkv_layer_norm(c, qkv_zeros(c, QKV_I32, SHAPE(2, 4)), NULL, NULL, 1e-5); }
static void ln_x_scalar(qkv_ctx *c) { qkv_layer_norm(c, qkv_scalar(c, QKV_F64, 1.0), NULL, NULL, 1e-5); }
static void ln_gamma_shape(qkv_ctx *c) { qkv_layer_norm(c, f64(c, SHAPE(2, 4)), f64(c, SHAPE(3)), NULL, 1e-5); }
static void ln_beta_rank(qkv_ctx *c) { qkv_layer_norm(c, f64(c, SHAPE(2, 4)), NULL, f64(c, SHAPE(1, 4)), 1e-5); }
static void ln_beta_dtype(qkv_ctx *c) {
    qkv_layer_norm(c, f64(c, SHAPE(2, 4)), f64(c, SHAPE(4)), qkv_ones(c, QKV_F32, SHAPE(4)), 1e-5);
}
static void ln_eps_zero(qkv_ctx *c) { qkv_layer_norm(c, f64(c, SHAPE(2, 4)), NULL, NULL, 0.0); }
static void ln_eps_nan(qkv_ctx *c) { qkv_layer_norm(c, f64(c, SHAPE(2, 4)), NULL, NULL, 0.0 / 0.0); }
static void ln_eps_negative(qkv_ctx *c) { qkv_layer_norm(c, f64(c, SHAPE(2, 4)), NULL, NULL, -1e-5); }
static void ln_eps_inf(qkv_ctx *c) { qkv_layer_norm(c, f64(c, SHAPE(2, 4)), NULL, NULL, 1.0 / 0.0); }
static void rms_x_null(qkv_ctx *c) { qkv_rms_norm(c, NULL, NULL, 1e-5); }
static void rms_x_u8(qkv_ctx *c) { qkv_rms_norm(c, qkv_zeros(c, QKV_U8, SHAPE(2, 4)), NULL, 1e-5); }
static void rms_gamma_shape(qkv_ctx *c) { qkv_rms_norm(c, f64(c, SHAPE(2, 3, 4)), f64(c, SHAPE(3, 4)), 1e-5); }
static void rms_gamma_dtype(qkv_ctx *c) { qkv_rms_norm(c, f64(c, SHAPE(2, 4)), qkv_ones(c, QKV_F32, SHAPE(4)), 1e-5); }
static void rms_eps_zero(qkv_ctx *c) { qkv_rms_norm(c, f64(c, SHAPE(2, 4)), NULL, 0.0); }
static void rms_eps_nan(qkv_ctx *c) { qkv_rms_norm(c, f64(c, SHAPE(2, 4)), NULL, 0.0 / 0.0); }
static void gelu_x_null(qkv_ctx *c) { qkv_gelu(c, NULL, QKV_GELU_ERF); }
static void gelu_x_i32(qkv_ctx *c) { qkv_gelu(c, qkv_zeros(c, QKV_I32, SHAPE(3)), QKV_GELU_TANH); }
static void gelu_approx(qkv_ctx *c) { qkv_gelu(c, f64(c, SHAPE(2, 3)), (qkv_gelu_approx)2); }
static void gelu_approx_negative(qkv_ctx *c) { qkv_gelu(c, f64(c, SHAPE(2, 3)), (qkv_gelu_approx)-1); }

typedef struct misuse {
    const char *name;
    void (*run)(qkv_ctx *);
    qkv_status status;
    const char *fragments[3];
} misuse;

static const misuse CASES[] = {
    {"NULL shape", null_shape, QKV_ERR_NULL, {"qkv_zeros", "shape is NULL"}},
    {"5 dimensions", too_many_dims, QKV_ERR_RANK, {"qkv_zeros", "5 dimensions", "0 to 4"}},
    {"negative dimension", negative_dim, QKV_ERR_SHAPE, {"qkv_zeros", "dimension 1 is -3"}},
    {"size overflow", size_overflow, QKV_ERR_OVERFLOW, {"qkv_zeros", "overflow"}},
    {"unknown dtype", bad_dtype, QKV_ERR_DTYPE, {"qkv_zeros", "unknown dtype 9"}},
    {"qkv_empty: negative dimension", empty_negative_dim, QKV_ERR_SHAPE, {"qkv_empty", "dimension 1 is -1"}},
    {"qkv_empty: size overflow", empty_overflow, QKV_ERR_OVERFLOW, {"qkv_empty", "overflow"}},
    {"random i32", random_int, QKV_ERR_DTYPE, {"qkv_randn", "i32"}},
    {"negative std", negative_std, QKV_ERR_ARG, {"qkv_randn", "std"}},
    {"NULL data", null_data, QKV_ERR_NULL, {"qkv_from_data", "data is NULL"}},
    {"zero fan_in", bad_fans, QKV_ERR_ARG, {"qkv_xavier_uniform", "fan_in 0"}},
    {"NULL operand", add_null, QKV_ERR_NULL, {"qkv_add", "a is NULL"}},
    {"add shapes", add_shapes, QKV_ERR_SHAPE, {"qkv_add", "a is [2,3]", "b is [4]"}},
    {"add dtypes", add_dtypes, QKV_ERR_DTYPE, {"qkv_add", "f64", "f32"}},
    {"mul of i32", mul_int, QKV_ERR_DTYPE, {"qkv_mul", "i32", "f32 or f64"}},
    {"reshape count", reshape_count, QKV_ERR_SHAPE, {"qkv_reshape", "[2,3]", "[4]"}},
    {"index out of range", get_out_of_range, QKV_ERR_ARG, {"qkv_get", "index 3", "[2,3]"}},
    {"matmul inner", matmul_inner, QKV_ERR_SHAPE, {"qkv_matmul", "[2,3,4]", "[2,5,6]"}},
    {"matmul batch", matmul_batch, QKV_ERR_SHAPE, {"qkv_matmul", "[2,3,4]", "[3,4,6]"}},
    {"projection W rank", projection_w_rank, QKV_ERR_RANK, {"qkv_projection", "[1,4,5]"}},
    {"projection inner", projection_inner, QKV_ERR_SHAPE, {"qkv_projection", "[2,3,4]", "[3,5]"}},
    {"projection bias", projection_bias, QKV_ERR_SHAPE, {"qkv_projection", "[4,5]", "[4]"}},
    {"scale inf", scale_inf, QKV_ERR_ARG, {"qkv_scale", "inf"}},
    {"softmax mask dtype", softmax_mask_dtype, QKV_ERR_DTYPE, {"qkv_softmax", "mask", "u8"}},
    {"softmax mask shape", softmax_mask_shape, QKV_ERR_SHAPE, {"qkv_softmax", "[2,3,3]", "[3,4]"}},
    {"softmax flags", softmax_flags, QKV_ERR_ARG, {"qkv_softmax", "flags"}},
    {"split heads", split_heads_divisible, QKV_ERR_SHAPE, {"qkv_split_heads", "[2,3,10]", "3"}},
    {"target >= V", ce_target_range, QKV_ERR_ARG, {"qkv_cross_entropy", "7", "5"}},
    {"targets f64", ce_target_dtype, QKV_ERR_DTYPE, {"qkv_cross_entropy", "i32"}},
    {"attention d_k", attention_dk, QKV_ERR_SHAPE, {"qkv_attention", "[2,3,4]", "[2,5,3]"}},
    {"non-scalar backward", backward_non_scalar, QKV_ERR_SHAPE, {"qkv_backward", "[2,2]", "dloss"}},
    {"second backward", backward_twice, QKV_ERR_STATE, {"qkv_backward", "already walked"}},
    {"backward without grad", backward_no_grad, QKV_ERR_STATE, {"qkv_backward", "does not require grad"}},
    {"use after step_end", stale_tensor, QKV_ERR_STALE, {"qkv_sum", "step 2", "step 3"}},
    {"npy missing file", npy_missing, QKV_ERR_IO, {"qkv_npy_load", "/nonexistent/dir/x.npy"}},
    {"npy garbage", npy_garbage, QKV_ERR_FORMAT, {"qkv_npy_load", "magic"}},
    {"gradcheck NULL fn", gradcheck_no_input, QKV_ERR_NULL, {"qkv_gradcheck", "fn is NULL"}},
    {"relu NULL", relu_null, QKV_ERR_NULL, {"qkv_relu", "x is NULL"}},
    {"relu i32", relu_i32, QKV_ERR_DTYPE, {"qkv_relu", "[3]", "i32"}},
    {"softcap cap 0", softcap_zero, QKV_ERR_ARG, {"qkv_softcap", "[2,3]", "cap is 0"}},
    {"softcap cap -2", softcap_negative, QKV_ERR_ARG, {"qkv_softcap", "[2,3]", "cap is -2"}},
    {"softcap cap NaN", softcap_nan, QKV_ERR_ARG, {"qkv_softcap", "[4]", "cap is nan"}},
    {"softcap cap inf", softcap_inf, QKV_ERR_ARG, {"qkv_softcap", "[4]", "cap is inf"}},
    {"softcap u8", softcap_u8, QKV_ERR_DTYPE, {"qkv_softcap", "[3]", "u8"}},
    {"rope NULL", rope_null, QKV_ERR_NULL, {"qkv_rope", "x is NULL"}},
    {"rope i32", rope_i32, QKV_ERR_DTYPE, {"qkv_rope", "[3,4]", "i32"}},
    {"rope rank 1", rope_rank1, QKV_ERR_RANK, {"qkv_rope", "[6]", "[n, d] or [B, n, d]"}},
    {"rope rank 4", rope_rank4, QKV_ERR_RANK, {"qkv_rope", "[1,2,3,4]", "4-dimensional"}},
    {"rope odd d", rope_odd_d, QKV_ERR_SHAPE, {"qkv_rope", "[2,3,5]", "d = 5 must be even"}},
    {"rope base 1", rope_base_one, QKV_ERR_ARG, {"qkv_rope", "[3,4]", "base is 1:"}},
    {"rope base inf", rope_base_inf, QKV_ERR_ARG, {"qkv_rope", "[3,4]", "base is inf"}},
    {"rope base NaN", rope_base_nan, QKV_ERR_ARG, {"qkv_rope", "[3,4]", "base is nan"}},
    {"rope offset -1", rope_offset_negative, QKV_ERR_ARG, {"qkv_rope", "[3,4]", "offset is -1"}},
    {"rope offset + n overflows", rope_offset_overflow, QKV_ERR_ARG, {"qkv_rope", "offset is 9223372036854775806", "int64"}},
    {"dropout NULL", dropout_null, QKV_ERR_NULL, {"qkv_dropout", "x is NULL"}},
    {"dropout i32", dropout_i32, QKV_ERR_DTYPE, {"qkv_dropout", "[3]", "i32"}},
    {"dropout p 1", dropout_one, QKV_ERR_ARG, {"qkv_dropout", "[2,3]", "p is 1:"}},
    {"dropout p -0.1", dropout_negative, QKV_ERR_ARG, {"qkv_dropout", "[2,3]", "p is -0.1"}},
    {"dropout p NaN", dropout_nan, QKV_ERR_ARG, {"qkv_dropout", "[2,3]", "p is nan"}},
    {"dropout p 1.5 in evaluation", dropout_eval_bad_p, QKV_ERR_ARG, {"qkv_dropout", "[5]", "p is 1.5"}},
    {"sinusoidal n 0", sinusoidal_n0, QKV_ERR_ARG, {"qkv_sinusoidal_positions", "n is 0", "d is 8"}},
    {"sinusoidal d -2", sinusoidal_d_negative, QKV_ERR_ARG, {"qkv_sinusoidal_positions", "n is 4", "d is -2"}},
    {"sinusoidal i32", sinusoidal_i32, QKV_ERR_DTYPE, {"qkv_sinusoidal_positions", "[4,8]", "i32"}},
    {"sinusoidal overflow", sinusoidal_overflow, QKV_ERR_OVERFLOW, {"qkv_sinusoidal_positions", "overflow"}},
    {"embedding table NULL", emb_table_null, QKV_ERR_NULL, {"qkv_embedding", "table is NULL"}},
    {"embedding ids NULL", emb_ids_null, QKV_ERR_NULL, {"qkv_embedding", "ids is NULL"}},
    {"embedding table i32", emb_table_i32, QKV_ERR_DTYPE, {"qkv_embedding", "table", "i32"}},
    {"embedding table rank", emb_table_rank, QKV_ERR_RANK, {"qkv_embedding", "[2,5,3]", "[V, d]"}},
    {"embedding ids f64", emb_ids_f64, QKV_ERR_DTYPE, {"qkv_embedding", "ids [4] is f64", "i32"}},
    {"embedding ids rank", emb_ids_rank, QKV_ERR_RANK, {"qkv_embedding", "[2,2,2]", "[B, n]"}},
    {"embedding id >= V", emb_id_too_big, QKV_ERR_ARG, {"qkv_embedding", "id 5 at position [1, 1]", "V = 5"}},
    {"embedding id < 0", emb_id_negative, QKV_ERR_ARG, {"qkv_embedding", "id -2 at position [1, 1]", "[5,3]"}},
    {"layer_norm x NULL", ln_x_null, QKV_ERR_NULL, {"qkv_layer_norm", "x is NULL"}},
    {"layer_norm x i32", ln_x_i32, QKV_ERR_DTYPE, {"qkv_layer_norm", "i32"}},
    {"layer_norm x scalar", ln_x_scalar, QKV_ERR_RANK, {"qkv_layer_norm", "x is []", "[..., d]"}},
    {"layer_norm gamma shape", ln_gamma_shape, QKV_ERR_SHAPE, {"qkv_layer_norm", "gamma is [3]", "[d] = [4]"}},
    {"layer_norm beta rank", ln_beta_rank, QKV_ERR_SHAPE, {"qkv_layer_norm", "x is [2,4]", "beta is [1,4]"}},
    {"layer_norm beta dtype", ln_beta_dtype, QKV_ERR_DTYPE, {"qkv_layer_norm", "f64", "f32"}},
    {"layer_norm eps 0", ln_eps_zero, QKV_ERR_ARG, {"qkv_layer_norm", "eps is 0", "finite and > 0"}},
    {"layer_norm eps NaN", ln_eps_nan, QKV_ERR_ARG, {"qkv_layer_norm", "nan", "[2,4]"}},
    {"layer_norm eps < 0", ln_eps_negative, QKV_ERR_ARG, {"qkv_layer_norm", "eps is -1e-05"}},
    {"layer_norm eps inf", ln_eps_inf, QKV_ERR_ARG, {"qkv_layer_norm", "eps is inf"}},
    {"rms_norm x NULL", rms_x_null, QKV_ERR_NULL, {"qkv_rms_norm", "x is NULL"}},
    {"rms_norm x u8", rms_x_u8, QKV_ERR_DTYPE, {"qkv_rms_norm", "u8"}},
    {"rms_norm gamma shape", rms_gamma_shape, QKV_ERR_SHAPE, {"qkv_rms_norm", "[2,3,4]", "gamma is [3,4]"}},
    {"rms_norm gamma dtype", rms_gamma_dtype, QKV_ERR_DTYPE, {"qkv_rms_norm", "f64", "f32"}},
    {"rms_norm eps 0", rms_eps_zero, QKV_ERR_ARG, {"qkv_rms_norm", "eps is 0", "[2,4]"}},
    {"rms_norm eps NaN", rms_eps_nan, QKV_ERR_ARG, {"qkv_rms_norm", "nan"}},
    {"gelu x NULL", gelu_x_null, QKV_ERR_NULL, {"qkv_gelu", "x is NULL"}},
    {"gelu x i32", gelu_x_i32, QKV_ERR_DTYPE, {"qkv_gelu", "i32"}},
    {"gelu approx 2", gelu_approx, QKV_ERR_ARG, {"qkv_gelu", "approx is 2", "[2,3]"}},
    {"gelu approx -1", gelu_approx_negative, QKV_ERR_ARG, {"qkv_gelu", "approx is -1"}},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

Test(errors, every_misuse_gives_its_status_and_a_message_naming_what_is_wrong) {
    cr_assert_geq(N_CASES, 25);
    int bad = 0;
    for (int i = 0; i < N_CASES; i++) {
        const misuse *m = &CASES[i];
        qkv_ctx *ctx = qkv_ctx_new(NULL);
        m->run(ctx);
        const char *msg = qkv_errmsg(ctx);
        bool ok = qkv_error(ctx) == m->status;
        for (int f = 0; f < 3 && m->fragments[f]; f++) ok = ok && strstr(msg, m->fragments[f]) != NULL;
        if (!ok) {
            bad++;
            cr_log_error("case '%s': got %s \"%s\", want %s with \"%s\" \"%s\" \"%s\"", m->name,
                         qkv_status_name(qkv_error(ctx)), msg, qkv_status_name(m->status), m->fragments[0],
                         m->fragments[1] ? m->fragments[1] : "", m->fragments[2] ? m->fragments[2] : "");
        }
        /* the context works again after clearing */
        qkv_clear_error(ctx);
        qkv_tensor *s = qkv_sum(ctx, qkv_ones(ctx, QKV_F64, SHAPE(4)));
        if (!s || qkv_f64(s)[0] != 4.0) {
            bad++;
            cr_log_error("case '%s': the context did not recover: %s", m->name, qkv_errmsg(ctx));
        }
        qkv_ctx_free(ctx);
    }
    cr_expect_eq(bad, 0, "%d of %d misuse cases wrong", bad, N_CASES);
}

Test(errors, the_first_error_sticks_and_later_calls_return_null_at_once) {
    qkv_ctx *ctx = qkv_ctx_new(NULL);
    qkv_tensor *a = qkv_ones(ctx, QKV_F64, SHAPE(2, 3));
    cr_expect_null(qkv_matmul(ctx, a, a, 0)); /* [2,3] x [2,3]: inner 3 vs 2 */
    char first[512];
    snprintf(first, sizeof first, "%s", qkv_errmsg(ctx));
    cr_expect(strstr(first, "qkv_matmul") != NULL, "%s", first);
    /* a whole graph built on the errored context: every call returns NULL, the first message stays */
    cr_expect_null(qkv_ones(ctx, QKV_F64, SHAPE(2, 3)));
    cr_expect_null(qkv_add(ctx, a, a));
    cr_expect_null(qkv_softmax(ctx, a, NULL, 0));
    cr_expect_eq(qkv_backward(ctx, a, NULL), QKV_ERR_SHAPE);
    cr_expect_str_eq(qkv_errmsg(ctx), first);
    cr_expect_eq(qkv_error(NULL), QKV_ERR_NULL);
    cr_expect_str_eq(qkv_errmsg(NULL), "no context");
    cr_expect_str_eq(qkv_status_name(QKV_ERR_STALE), "QKV_ERR_STALE");
    cr_expect_str_eq(qkv_status_name((qkv_status)99), "QKV_ERR_UNKNOWN");
    qkv_ctx_free(ctx);
}

Test(errors, a_failing_allocator_is_reported_at_every_point_of_a_forward_and_backward) {
    int reported = 0;
    for (long budget = 1; budget < 40; budget++) {
        long left = budget;
        qkv_options o = qkv_default_options();
        o.allocator.malloc_fn = failing_malloc;
        o.allocator.free_fn = plain_free;
        o.allocator.user = &left;
        o.arena_chunk = 512; /* small chunks: many allocation points */
        qkv_ctx *ctx = qkv_ctx_new(&o);
        if (!ctx) continue;
        qkv_tensor *x = qkv_randn(ctx, QKV_F64, SHAPE(2, 4, 3), 0, 1);
        qkv_tensor *w = qkv_param(ctx, qkv_randn(ctx, QKV_F64, SHAPE(3, 3), 0, 1));
        qkv_tensor *out = qkv_self_attention(ctx, x, w, w, w, NULL, QKV_SCALE_DEFAULT, 0, NULL);
        qkv_backward(ctx, qkv_sum(ctx, out), NULL);
        if (qkv_error(ctx)) {
            cr_expect_eq(qkv_error(ctx), QKV_ERR_NOMEM, "budget %ld: %s", budget, qkv_errmsg(ctx));
            cr_expect(strstr(qkv_errmsg(ctx), "out of memory") != NULL, "%s", qkv_errmsg(ctx));
            reported++;
        }
        qkv_ctx_free(ctx);
    }
    cr_expect_gt(reported, 5, "allocation failures were injected and reported (%d)", reported);
}
