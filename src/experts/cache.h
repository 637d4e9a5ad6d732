/* The routed-expert slot cache: a bounded number of expert blobs per layer
 * held in RAM, filled on demand from the packed expert files with pread on
 * O_DIRECT descriptors (so the page cache does not quietly hold the rest and
 * the budget is the real footprint). All misses of a step are read in
 * parallel by a small I/O thread pool; the caller computes with hits while
 * the misses load.
 *
 * Use per layer step:
 *     tern_expert_batch b;
 *     tern_expert_cache_begin(c, layer, ids, n, &b, err);   // plan + start reads
 *     for i: const void *blob = tern_expert_batch_wait(&b, i, err);  // ready blob of ids[i]
 *     tern_expert_batch_end(&b);                             // unpin
 */
#ifndef TERN_EXPERTS_CACHE_H
#define TERN_EXPERTS_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

enum tern_expert_policy { TERN_EXPERT_LFU = 0, TERN_EXPERT_LRU = 1 };

typedef struct tern_expert_cache_params {
    int n_layers;                 /* expert files (decoder layers, + 1 for the MTP layer) */
    const char *const *paths;     /* [n_layers] absolute or cwd-relative paths (copied) */
    int n_experts;                /* blobs per file */
    uint64_t stride;              /* bytes per blob, multiple of 4096 */
    int slots;                    /* per layer, top_k <= slots <= n_experts */
    int policy;                   /* enum tern_expert_policy */
    int io_threads;               /* parallel readers; 0 = 4 */
} tern_expert_cache_params;

typedef struct tern_expert_stats {
    uint64_t hits, misses, bytes_read;
    double read_s;                /* summed time inside pread (all threads) */
    double wait_s;                /* time the compute thread waited for reads */
    int direct_io;                /* 1 if O_DIRECT was accepted by the file system */
} tern_expert_stats;

typedef struct tern_expert_cache tern_expert_cache;

#define TERN_EXPERT_BATCH_MAX 512

typedef struct tern_expert_batch {
    tern_expert_cache *c;
    int layer, n;
    int slot[TERN_EXPERT_BATCH_MAX];
    int expert[TERN_EXPERT_BATCH_MAX];
    int pending[TERN_EXPERT_BATCH_MAX];   /* 1 while its read is in flight */
} tern_expert_batch;

tern_expert_cache *tern_expert_cache_create(const tern_expert_cache_params *p, tern_error *err);
void tern_expert_cache_destroy(tern_expert_cache *c);

/* Pins slots for experts ids[0..n) of one layer (distinct ids, n <= slots)
 * and queues the reads of the ones not resident. */
int tern_expert_cache_begin(tern_expert_cache *c, int layer, const int *ids, int n, tern_expert_batch *b,
                            tern_error *err);
/* The blob of ids[i], waiting for its read if needed; NULL + err on an I/O
 * error (the slot returns to empty). */
const uint8_t *tern_expert_batch_wait(tern_expert_batch *b, int i, tern_error *err);
/* 1 if ids[i] was already resident at begin (a hit): compute those first. */
int tern_expert_batch_is_hit(const tern_expert_batch *b, int i);
void tern_expert_batch_end(tern_expert_batch *b);

void tern_expert_cache_stats(const tern_expert_cache *c, tern_expert_stats *out);
int tern_expert_cache_slots(const tern_expert_cache *c);

#endif
