// The public header compiles as C++ and its functions link from C++.
#include <criterion/criterion.h>

#include "qkv.h"

Test(cxx, header_compiles_and_links) {
    qkv_ctx *ctx = qkv_ctx_new(nullptr);
    cr_assert(ctx != nullptr);
    const int64_t shape[2] = {2, 3};
    qkv_tensor *t = qkv_ones(ctx, QKV_F64, 2, shape);
    cr_assert(t != nullptr);
    qkv_tensor *s = qkv_sum(ctx, t);
    cr_assert(s != nullptr);
    cr_expect_eq(qkv_f64(s)[0], 6.0);
    cr_expect_eq(qkv_error(ctx), QKV_OK);
    qkv_ctx_free(ctx);
}

#include <type_traits>

// qkv_f32 and the others give a pointer as writable as the tensor they are called on.
Test(cxx, typed_pointers_follow_the_tensors_constness) {
    qkv_ctx *ctx = qkv_ctx_new(nullptr);
    const int64_t shape[1] = {3};
    qkv_tensor *t = qkv_full(ctx, QKV_F32, 1, shape, 2.0);
    const qkv_tensor *ct = t;
    static_assert(std::is_same<decltype(qkv_f32(t)), float *>::value, "mutable tensor, mutable pointer");
    static_assert(std::is_same<decltype(qkv_f32(ct)), const float *>::value, "const tensor, const pointer");
    static_assert(std::is_same<decltype(qkv_f64(ct)), const double *>::value, "f64");
    static_assert(std::is_same<decltype(qkv_i32(ct)), const int32_t *>::value, "i32");
    static_assert(std::is_same<decltype(qkv_u8(ct)), const uint8_t *>::value, "u8");
    qkv_f32(t)[1] = 5.0f;
    cr_expect_eq(qkv_f32(ct)[1], 5.0f);
    cr_expect(qkv_f64(ct) == nullptr, "a dtype that differs gives NULL");
    qkv_ctx_free(ctx);
}
