/* The CPU reference kernels: plain fp32 loops a reader can check against
 * docs (../shared/docs/qwen36-model.md §2). Activations are fp32 row-major
 * [T, n]; weights are tern_mat views in their stored dtype. */
#ifndef TERN_CPU_OPS_H
#define TERN_CPU_OPS_H

#include <math.h>
#include <stdint.h>

#include "model/weights.h"
#include "util/pool.h"

/* y[T, W.rows] = x[T, W.cols] @ W^T. Parallel over the rows of W, so each
 * weight row is read once for all T tokens. */
void tern_matmul(tern_pool *pool, float *y, const float *x, int64_t T, const tern_mat *W);

/* Row r of W widened to fp32 (W.cols floats). */
void tern_mat_row(const tern_mat *W, int64_t r, float *out);

/* Zero-centred RMSNorm of the Qwen3.5 family: y = x / rms(x) * (1 + w). */
void tern_rmsnorm_1p(float *y, const float *x, const float *w, int n, float eps);
/* Plain RMSNorm: y = x / rms(x) * w (the GDN output norm). */
void tern_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

float tern_dot(const float *a, const float *b, int64_t n);

static inline float tern_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float tern_silu(float x) { return x / (1.0f + expf(-x)); }
/* torch.nn.functional.softplus (beta 1, threshold 20). */
static inline float tern_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* In-place softmax over n values. */
void tern_softmax(float *x, int n);

#endif
