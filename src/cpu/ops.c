#include "cpu/ops.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"
#include "util/half.h"

float tern_dot(const float *a, const float *b, int64_t n) {
    /* Eight partial sums: a fixed summation order the compiler can vectorise
     * without -ffast-math. */
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

void tern_mat_row(const tern_mat *W, int64_t r, float *out) {
    int64_t n = W->cols;
    if (W->bits) {
        tern_dequantize_row(W->data, W->scales, W->biases, r, n, W->bits, W->group, out);
    } else if (W->dtype == TERN_DTYPE_F32) {
        memcpy(out, (const float *)W->data + r * n, (size_t)n * sizeof(float));
    } else if (W->dtype == TERN_DTYPE_BF16) {
        const uint16_t *p = (const uint16_t *)W->data + r * n;
        for (int64_t i = 0; i < n; i++) out[i] = tern_bf16_to_f32(p[i]);
    } else {
        const uint16_t *p = (const uint16_t *)W->data + r * n;
        for (int64_t i = 0; i < n; i++) out[i] = tern_f16_to_f32(p[i]);
    }
}

typedef struct {
    float *y;
    const float *x;
    int64_t T;
    const tern_mat *W;
} matmul_job;

static void matmul_range(void *ctx, int64_t begin, int64_t end) {
    const matmul_job *j = ctx;
    int64_t K = j->W->cols, N = j->W->rows;
    float *row = malloc((size_t)K * sizeof(float));
    if (!row) abort();
    for (int64_t n = begin; n < end; n++) {
        const float *w = row;
        if (!j->W->bits && j->W->dtype == TERN_DTYPE_F32) w = (const float *)j->W->data + n * K;
        else tern_mat_row(j->W, n, row);
        for (int64_t t = 0; t < j->T; t++) j->y[t * N + n] = tern_dot(j->x + t * K, w, K);
    }
    free(row);
}

void tern_matmul(tern_pool *pool, float *y, const float *x, int64_t T, const tern_mat *W) {
    matmul_job j = {y, x, T, W};
    /* Tiny products are not worth waking the workers. */
    if (W->rows * W->cols * T < (1 << 15)) matmul_range(&j, 0, W->rows);
    else tern_pool_for(pool, W->rows, matmul_range, &j);
}

static float inv_rms(const float *x, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)n + eps);
}

void tern_rmsnorm_1p(float *y, const float *x, const float *w, int n, float eps) {
    float r = inv_rms(x, n, eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * (1.0f + w[i]);
}

void tern_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float r = inv_rms(x, n, eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

void tern_softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - mx); sum += x[i]; }
    for (int i = 0; i < n; i++) x[i] /= sum;
}
