/*
 * test_alloc.h — a counting allocator for the tests: it counts malloc calls and live blocks, and can fail
 * its k-th call, so a test can see that a step makes no heap allocation, that nothing leaks, and that every
 * allocation failure is reported.
 */
#ifndef QKV_TEST_ALLOC_H
#define QKV_TEST_ALLOC_H

#include <stdlib.h>

#include "qkv.h"

typedef struct counting {
    long calls;   /* malloc_fn calls so far            */
    long live;    /* blocks not yet freed              */
    long fail_at; /* 1-based call to fail; 0: never    */
    long failed;  /* calls that returned NULL          */
} counting;

static inline void *count_malloc(size_t size, void *user) {
    counting *c = user;
    c->calls++;
    if (c->fail_at && c->calls == c->fail_at) {
        c->failed++;
        return NULL;
    }
    void *p = malloc(size);
    if (p) c->live++;
    return p;
}

static inline void count_free(void *p, void *user) {
    counting *c = user;
    if (!p) return;
    c->live--;
    free(p);
}

/* The allocator hooks counting into c. */
static inline qkv_allocator counting_allocator(counting *c) { return (qkv_allocator){count_malloc, count_free, c}; }

#endif
