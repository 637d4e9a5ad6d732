/* The CUDA ops of the Gated DeltaNet block: the recurrent step and the
 * chunked prefill (conventions: cuda_ops.h). */
#ifndef TERN_CUDA_GDN_H
#define TERN_CUDA_GDN_H

#include "cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Gated DeltaNet ---------------------------------------------------- */

typedef struct tern_cuda_gdn_w {
    int nk, nv, dk, dv, conv_kernel;
    const float *conv;            /* [conv_dim, conv_kernel], conv_dim = 2 nk dk + nv dv */
    const float *A_log, *dt_bias; /* [nv] */
    const float *norm;            /* [dv], plain weight */
    float eps;
} tern_cuda_gdn_w;

/* The recurrent (token by token) Gated DeltaNet step for T tokens, from the
 * projections to the gated norm, in one kernel (a block per value head and
 * 32 of its columns; the blocks of a key head form a thread-block cluster
 * that shares the conv state and the norm's sums; gdn.cu says more):
 *   conv1d (state: conv_state [conv_kernel - 1, conv_dim]) + SiLU,
 *   l2norm of q and k (q also * dk^-0.5), g = -exp(A_log) softplus(a +
 *   dt_bias), beta = sigmoid(b), the delta rule on S [nv, dk, dv] (fp32,
 *   updated in place), o = S^T q, then y = rmsnorm(o) * norm * silu(z).
 * qkv [T, conv_dim], z [T, nv dv], a, b [T, nv]; out [T, nv dv]. */
/* 1 if the step kernel takes these head counts and dims (Qwen3.6's do). */
int tern_cuda_gdn_supported(const tern_cuda_gdn_w *w);
int tern_cuda_gdn_step(const tern_cuda_gdn_w *w, const float *qkv, const float *z, const float *b,
                       const float *a, int T, float *conv_state, float *S, float *out, tern_stream s,
                       tern_error *err);

/* The same block for a prefill of T tokens in chunks of 64 (the twin of
 * cpu/gdn.c's tern_gdn_chunked with forward.c's steps around it): the same
 * arguments and state updates as tern_cuda_gdn_step, so a step may follow
 * it; within a chunk a unit-lower-triangular solve replaces the sequential
 * updates, so only the pass over the chunks is sequential, and it runs per
 * (value head, 32 value columns). Five launches. dk a multiple of 8 up to
 * 128; dv a multiple of 32 or below 32. work: tern_cuda_gdn_chunked_workspace
 * bytes (T = 4096 at Qwen3.6's shape: 290 MiB). */
size_t tern_cuda_gdn_chunked_workspace(const tern_cuda_gdn_w *w, int T);
int tern_cuda_gdn_chunked(const tern_cuda_gdn_w *w, const float *qkv, const float *z, const float *b,
                          const float *a, int T, float *conv_state, float *S, void *work, size_t work_bytes,
                          float *out, tern_stream s, tern_error *err);

#ifdef __cplusplus
}
#endif

#endif
