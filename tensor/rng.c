/*
 * rng.c — the context RNG: xoshiro256** seeded through splitmix64, uniform doubles from the top 53 bits,
 * normals by Box-Muller. The same seed gives the same numbers on every machine and thread count.
 */
#include "qkv_internal.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void qkv_rng_seed_(uint64_t state[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) state[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t qkv_rng_next_(qkv_ctx *ctx) {
    uint64_t *s = ctx->rng;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double qkv_rng_uniform_(qkv_ctx *ctx) { return (double)(qkv_rng_next_(ctx) >> 11) * 0x1.0p-53; }

/* One normal per call (the pair's second value is not cached, so the stream depends only on the calls). */
double qkv_rng_normal_(qkv_ctx *ctx) {
    double u1 = 1.0 - qkv_rng_uniform_(ctx); /* (0, 1]: log is finite */
    double u2 = qkv_rng_uniform_(ctx);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
