/* The CUDA sampler: argmax and the draw with temperature, top-k, top-p
 * and min-p (conventions: cuda_ops.h). */
#ifndef TERN_CUDA_SAMPLE_H
#define TERN_CUDA_SAMPLE_H

#include "cuda/cuda_device.h"
#include "cuda/sample_limits.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- sampling ---------------------------------------------------------- */

/* The id of the largest of logits[0 .. n_valid) (lowest id on ties; NaN
 * counts as -inf, as does an id that mask, when not NULL, leaves out: a
 * grammar's allowed ids, bit i of word i / 32, in device or mapped host
 * memory, read when the kernel runs), written to *id (device or mapped host memory) and, when
 * id2 is not NULL, to *id2 too. work: tern_cuda_sample_workspace
 * bytes, zero before their first use (a count the call leaves zero). One
 * launch that may start before the logits' kernel ends (programmatic
 * dependent launch). */
size_t tern_cuda_sample_workspace(int n_valid);
int tern_cuda_argmax(const float *logits, const uint32_t *mask, int n_valid, void *work, int32_t *id, int32_t *id2,
                     tern_stream s, tern_error *err);

/* Temperature, top-k (1 <= top_k <= TERN_CUDA_SAMPLE_MAX_K), top-p over what
 * top-k kept, min-p, then the draw at *u in [0, 1) (the caller's random
 * number, read on the device when the kernel runs, so a captured step
 * takes a new one each replay): the order and rules of engine/sampler.h,
 * on the GPU; only the id comes back (into *id and *id2 as argmax's). Penalties are the caller's (applied
 * to the logits); mask as argmax's. */
#define TERN_CUDA_SAMPLE_MAX_K TERN_GPU_SAMPLE_MAX_K
int tern_cuda_sample(const float *logits, const uint32_t *mask, int n_valid, float temperature, int top_k, float top_p,
                     float min_p, const double *u, void *work, int32_t *id, int32_t *id2, tern_stream s,
                     tern_error *err);
/* Whether tern_cuda_sample takes n_valid ids at top_k: its merge holds
 * ceil(n_valid / 4096) x top_k candidates, at most 4096 (top-k 64 up to
 * 262,144 ids). */
int tern_cuda_sample_fits(int n_valid, int top_k);

#ifdef __cplusplus
}
#endif

#endif
