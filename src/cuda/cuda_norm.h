/* The CUDA RMSNorm with the residual add (conventions: cuda_ops.h). */
#ifndef TERN_CUDA_NORM_H
#define TERN_CUDA_NORM_H

#include "cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- norms and the residual ------------------------------------------ */

/* Per token: x += delta (when delta is set, written back to x), then
 * y = x / rms(x) * (one_plus ? 1 + w : w). y may be x (in place) only
 * without delta: with delta, x keeps the residual sum. */
int tern_cuda_rmsnorm(float *y, float *x, const float *delta, const float *w, int one_plus, int n, int T,
                      float eps, tern_stream s, tern_error *err);

#ifdef __cplusplus
}
#endif

#endif
