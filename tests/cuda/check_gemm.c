/* tern_cuda_gemm (cuBLAS, bf16 operands, fp32 accumulation) against
 * tern_matmul in fp32.
 * Tolerance 1e-2 of max |y|: both operands are rounded to bf16 (relative
 * error up to 2^-9 = 2e-3 each) before an fp32-accumulated product; over K
 * terms of random sign those errors add like a random walk, so the error
 * of an output is about 3e-3 of the typical output, and the largest of
 * millions stays under 1e-2 of the largest output. */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "cpu/ops.h"

typedef struct {
    tern_cuda_ctx *c;
    const tern_mat *W;
    const float *x;
    int64_t T;
    float *y;
    tern_stream s;
} gemm_run;

static void run_gemm(void *arg, int rep) {
    gemm_run *r = arg;
    tern_error err;
    (void)rep;
    if (tern_cuda_gemm(r->c, r->W, r->x, r->T, r->y, r->s, &err)) die_err("gemm", &err);
}

static void gemm_case(checker *ck, tern_cuda_ctx *c, int64_t rows, int64_t cols, int bits, int dtype, int group,
                      int64_t T, int timed) {
    test_mat m;
    make_mat(ck, &m, rows, cols, bits, dtype, group);
    size_t nx = (size_t)T * cols, ny = (size_t)T * rows;
    float *x = xmalloc(nx * 4), *ref = xmalloc(ny * 4), *got = xmalloc(ny * 4);
    rnd_floats(ck, x, nx, 1.0f);
    tern_matmul(ck->pool, ref, x, T, &m.h);
    float *dx = dev_upload(x, nx * 4), *dy = dev_poison(ny);
    tern_error err;
    if (tern_cuda_gemm(c, &m.d, dx, T, dy, ck->stream, &err)) die_err("gemm", &err);
    dev_sync(ck, "gemm");
    dev_download(got, dy, ny * 4);
    char shape[96];
    snprintf(shape, sizeof shape, "%s %lldx%lld T=%lld", bits == 4 ? "q4" : bits == 8 ? "q8" : "bf16",
             (long long)rows, (long long)cols, (long long)T);
    report(ck, "gemm (cuBLAS)", shape, got, ref, ny, 1e-2);
    if (timed && ck->time) {
        /* eager calls (cuBLAS is not captured here): median of 9 */
        gemm_run r = {c, &m.d, dx, T, dy, ck->stream};
        double t[9];
        run_gemm(&r, 0);
        for (int i = 0; i < 9; i++) {
            timer_start(ck);
            run_gemm(&r, i);
            t[i] = timer_stop(ck);
        }
        for (int i = 1; i < 9; i++)
            for (int j = i; j > 0 && t[j] < t[j - 1]; j--) { double sw = t[j]; t[j] = t[j - 1]; t[j - 1] = sw; }
        double ms = t[4];
        printf("| time gemm      | %-40s | %8.1f us | %6.1f TFLOP/s (bf16 cuBLAS + dequantization) |\n", shape,
               ms * 1e3, 2.0 * rows * cols * T / (ms * 1e-3) / 1e12);
        if (ck->times) fprintf(ck->times, "gemm\t%s\t%.2f\t-\t-\n", shape, ms * 1e3);
    }
    tern_cuda_free(dx);
    tern_cuda_free(dy);
    free(x);
    free(ref);
    free(got);
    free_mat(&m);
}

void check_gemm(checker *ck) {
    tern_error err;
    tern_cuda_ctx *c = tern_cuda_ctx_create(0, &err);
    if (!c) die_err("ctx", &err);
    gemm_case(ck, c, 8192, 2048, 8, 0, 64, 512, 1);
    gemm_case(ck, c, 512, 2048, 4, 0, 64, 64, 0);
    gemm_case(ck, c, 2048, 4096, 0, TERN_DTYPE_BF16, 0, 100, 0);
    gemm_case(ck, c, 40000, 2048, 8, 0, 32, 7, 0);    /* three dequantization tiles */
    tern_cuda_ctx_destroy(c);
}
