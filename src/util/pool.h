/* A fixed set of worker threads for data-parallel loops (the large matrix
 * products). Owned by the model; one parallel loop runs at a time. */
#ifndef TERN_UTIL_POOL_H
#define TERN_UTIL_POOL_H

#include <stdint.h>

typedef struct tern_pool tern_pool;

/* fn is called on disjoint ranges [begin, end) that cover [0, n). */
typedef void (*tern_range_fn)(void *ctx, int64_t begin, int64_t end);

tern_pool *tern_pool_create(int n_threads);   /* n_threads <= 0: all cores */
void tern_pool_destroy(tern_pool *p);
int tern_pool_size(const tern_pool *p);

/* Splits [0, n) into one contiguous range per thread (the caller's thread
 * takes the first) and returns when all ranges are done. Small n runs on
 * the calling thread alone. */
void tern_pool_for(tern_pool *p, int64_t n, tern_range_fn fn, void *ctx);

#endif
