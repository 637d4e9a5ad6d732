/* tern_cuda_embed against tern_mat_row (cpu/ops.c): rows of q4 / q8 (groups
 * 32, 64, 128), bf16, f16 and f32 matrices for ids read on the device,
 * every float bit for bit (the kernel rounds as the CPU does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/ops.h"

static void embed_case(checker *ck, int64_t rows, int64_t cols, int bits, int dtype, int group, const char *name) {
    test_mat m;
    make_mat(ck, &m, rows, cols, bits, dtype, group);
    enum { T = 9 };
    int32_t ids[T] = {0, (int32_t)rows - 1, 1, 0};   /* the first and last rows, a repeat */
    for (int t = 4; t < T; t++) ids[t] = (int32_t)(rnd_u64(ck) % (uint64_t)rows);
    int32_t *did = dev_upload(ids, sizeof ids);
    float *dx = dev_poison((size_t)T * cols);
    float *got = xmalloc((size_t)T * cols * sizeof(float)), *ref = xmalloc((size_t)cols * sizeof(float));
    tern_error err;
    if (tern_cuda_embed(&m.d, did, T, dx, ck->stream, &err)) die_err("embed", &err);
    dev_sync(ck, "embed");
    dev_download(got, dx, (size_t)T * cols * sizeof(float));
    long bad = 0;
    for (int t = 0; t < T; t++) {
        tern_mat_row(&m.h, ids[t], ref);
        bad += memcmp(got + (size_t)t * cols, ref, (size_t)cols * sizeof(float)) != 0;
    }
    char shape[96];
    snprintf(shape, sizeof shape, "%s %lld x %lld, %d rows", name, (long long)rows, (long long)cols, T);
    report_exact(ck, "embed", shape, bad, T);
    free(got);
    free(ref);
    tern_cuda_free(did);
    tern_cuda_free(dx);
    free_mat(&m);
}

/* f32 has no make_mat encoding: random floats, uploaded as they are. */
static void embed_f32(checker *ck, int64_t rows, int64_t cols) {
    float *w = xmalloc((size_t)rows * cols * sizeof(float));
    rnd_floats(ck, w, (size_t)rows * cols, 0.05f);
    tern_mat h = {.data = w, .dtype = TERN_DTYPE_F32, .rows = rows, .cols = cols};
    tern_mat d = h;
    d.data = dev_upload(w, (size_t)rows * cols * sizeof(float));
    int32_t ids[3] = {(int32_t)rows - 1, 0, 5};
    int32_t *did = dev_upload(ids, sizeof ids);
    float *dx = dev_poison((size_t)3 * cols), *got = xmalloc((size_t)3 * cols * sizeof(float));
    tern_error err;
    if (tern_cuda_embed(&d, did, 3, dx, ck->stream, &err)) die_err("embed", &err);
    dev_sync(ck, "embed");
    dev_download(got, dx, (size_t)3 * cols * sizeof(float));
    long bad = 0;
    for (int t = 0; t < 3; t++) bad += memcmp(got + (size_t)t * cols, w + (size_t)ids[t] * cols, (size_t)cols * 4) != 0;
    report_exact(ck, "embed", "f32 64 x 2048, 3 rows", bad, 3);
    free(w);
    free(got);
    tern_cuda_free((void *)d.data);
    tern_cuda_free(did);
    tern_cuda_free(dx);
}

/* tern_cuda_embed_prev: an id of -1 takes the row of *prev (device
 * memory); without prev it is a bad id and yields zeros, as any other. */
static void embed_prev_case(checker *ck) {
    test_mat m;
    enum { ROWS = 1000, COLS = 2048, T = 4 };
    make_mat(ck, &m, ROWS, COLS, 4, 0, 64);
    int32_t ids[T] = {-1, 7, -1, ROWS - 1}, prev = 123;
    int32_t *did = dev_upload(ids, sizeof ids), *dprev = dev_upload(&prev, sizeof prev);
    float *dx = dev_poison((size_t)T * COLS);
    float *got = xmalloc((size_t)T * COLS * sizeof(float)), *ref = xmalloc((size_t)COLS * sizeof(float));
    tern_error err;
    long bad = 0;
    for (int with = 1; with >= 0; with--) {
        if (tern_cuda_embed_prev(&m.d, did, with ? dprev : NULL, T, dx, ck->stream, &err)) die_err("embed_prev", &err);
        dev_sync(ck, "embed_prev");
        dev_download(got, dx, (size_t)T * COLS * sizeof(float));
        for (int t = 0; t < T; t++) {
            if (ids[t] >= 0 || with) tern_mat_row(&m.h, ids[t] >= 0 ? ids[t] : prev, ref);
            else memset(ref, 0, (size_t)COLS * sizeof(float));
            bad += memcmp(got + (size_t)t * COLS, ref, (size_t)COLS * sizeof(float)) != 0;
        }
    }
    report_exact(ck, "embed", "q4 g64 1000 x 2048, -1 ids: *prev, then zeros without it", bad, 2 * T);
    free(got);
    free(ref);
    tern_cuda_free(did);
    tern_cuda_free(dprev);
    tern_cuda_free(dx);
    free_mat(&m);
}

void check_embed(checker *ck) {
    embed_prev_case(ck);
    embed_case(ck, 4096, 2048, 4, 0, 64, "q4 g64");
    embed_case(ck, 1000, 2048, 4, 0, 32, "q4 g32");
    embed_case(ck, 1000, 1536, 8, 0, 128, "q8 g128");
    embed_case(ck, 1000, 2048, 8, 0, 64, "q8 g64");
    embed_case(ck, 500, 1024, 0, TERN_DTYPE_BF16, 0, "bf16");
    embed_case(ck, 500, 1024, 0, TERN_DTYPE_F16, 0, "f16");
    embed_f32(ck, 64, 2048);
}
