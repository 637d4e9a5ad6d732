/* The routed-expert slot cache against synthetic expert files whose every
 * byte says which (layer, expert) it belongs to. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/cache.h"
#include "testutil.h"

#define STRIDE 8192
#define N_EXPERTS 16

static char *dir;
static char paths[2][1100];
static const char *path_ptrs[2];

static uint8_t tag(int layer, int expert, size_t i) { return (uint8_t)(layer * 64 + expert * 3 + i % 7); }

static void write_layer(int layer, size_t experts) {
    FILE *f = fopen(paths[layer], "wb");
    cr_assert(f);
    uint8_t *blob = malloc(STRIDE);
    for (size_t e = 0; e < experts; e++) {
        for (size_t i = 0; i < STRIDE; i++) blob[i] = tag(layer, (int)e, i);
        fwrite(blob, 1, STRIDE, f);
    }
    free(blob);
    fclose(f);
}

static void setup(void) {
    dir = make_temp_dir();
    for (int l = 0; l < 2; l++) {
        snprintf(paths[l], sizeof paths[l], "%s/layer_%03d.bin", dir, l);
        path_ptrs[l] = paths[l];
        write_layer(l, N_EXPERTS);
    }
}
static void teardown(void) { rm_rf(dir); free(dir); }

TestSuite(experts, .init = setup, .fini = teardown);

static tern_expert_cache *make(int slots, int policy) {
    tern_expert_cache_params p = {2, path_ptrs, N_EXPERTS, STRIDE, slots, policy, 3};
    tern_error err;
    tern_expert_cache *c = tern_expert_cache_create(&p, &err);
    cr_assert_not_null(c, "%s", err.msg);
    return c;
}

/* Fetches ids for a layer and checks every returned blob's bytes. */
static void fetch(tern_expert_cache *c, int layer, const int *ids, int n) {
    tern_expert_batch b;
    tern_error err;
    cr_assert_eq(tern_expert_cache_begin(c, layer, ids, n, &b, &err), 0, "%s", err.msg);
    for (int i = n - 1; i >= 0; i--) {   /* out of order on purpose */
        const uint8_t *blob = tern_expert_batch_wait(&b, i, &err);
        cr_assert_not_null(blob, "%s", err.msg);
        for (size_t k = 0; k < STRIDE; k += 509)
            cr_assert_eq(blob[k], tag(layer, ids[i], k), "layer %d expert %d byte %zu", layer, ids[i], k);
    }
    tern_expert_batch_end(&b);
}

Test(experts, returns_the_right_bytes_under_pressure) {
    tern_expert_cache *c = make(4, TERN_EXPERT_LFU);
    srand(7);
    for (int step = 0; step < 300; step++) {
        int ids[4], n = 1 + rand() % 4;
        for (int i = 0; i < n; i++) {
            int dup;
            do {
                ids[i] = rand() % N_EXPERTS;
                dup = 0;
                for (int j = 0; j < i; j++) dup |= ids[j] == ids[i];
            } while (dup);
        }
        fetch(c, step % 2, ids, n);
    }
    tern_expert_stats st;
    tern_expert_cache_stats(c, &st);
    cr_assert_gt(st.hits, 0);
    cr_assert_gt(st.misses, 0);
    cr_assert_eq(st.bytes_read, st.misses * STRIDE);
    tern_expert_cache_destroy(c);
}

Test(experts, lru_evicts_least_recent) {
    tern_expert_cache *c = make(2, TERN_EXPERT_LRU);
    fetch(c, 0, (int[]){1}, 1);   /* miss */
    fetch(c, 0, (int[]){2}, 1);   /* miss */
    fetch(c, 0, (int[]){1}, 1);   /* hit; 2 is now least recent */
    fetch(c, 0, (int[]){3}, 1);   /* miss, evicts 2 */
    fetch(c, 0, (int[]){1}, 1);   /* hit */
    fetch(c, 0, (int[]){2}, 1);   /* miss */
    tern_expert_stats st;
    tern_expert_cache_stats(c, &st);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(st.misses, 4);
    tern_expert_cache_destroy(c);
}

Test(experts, lfu_keeps_the_frequent_one) {
    tern_expert_cache *c = make(2, TERN_EXPERT_LFU);
    for (int i = 0; i < 3; i++) fetch(c, 0, (int[]){5}, 1);   /* 5 requested 3 times */
    fetch(c, 0, (int[]){6}, 1);
    fetch(c, 0, (int[]){7}, 1);   /* evicts 6 (1 request), not 5 */
    fetch(c, 0, (int[]){5}, 1);   /* hit */
    tern_expert_stats st;
    tern_expert_cache_stats(c, &st);
    cr_assert_eq(st.hits, 3);
    cr_assert_eq(st.misses, 3);
    tern_expert_cache_destroy(c);
}

Test(experts, too_many_at_once_is_an_error) {
    tern_expert_cache *c = make(2, TERN_EXPERT_LFU);
    tern_expert_batch b;
    tern_error err;
    cr_assert_eq(tern_expert_cache_begin(c, 0, (int[]){1, 2, 3}, 3, &b, &err), -1);
    cr_assert(strstr(err.msg, "slots"), "%s", err.msg);
    tern_expert_cache_destroy(c);
}

Test(experts, truncated_file_is_an_error) {
    cr_assert_eq(truncate(paths[1], STRIDE * N_EXPERTS - 100), 0);
    tern_expert_cache_params p = {2, path_ptrs, N_EXPERTS, STRIDE, 4, TERN_EXPERT_LFU, 2};
    tern_error err;
    cr_assert_null(tern_expert_cache_create(&p, &err));
    cr_assert(strstr(err.msg, "layer_001.bin"), "%s", err.msg);
}
