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
