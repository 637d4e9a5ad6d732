/* The CUDA ops of the attention block: the pre-attention step (norms,
 * RoPE, the KV rows into the cache), the decode's split-K attention and the
 * prefill's (conventions: cuda_ops.h). */
#ifndef TERN_CUDA_ATTENTION_H
#define TERN_CUDA_ATTENTION_H

#include "cpu/kvquant.h"
#include "cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The attention block's pre-attention step for T tokens at positions
 * pos0..pos0+T-1:
 *   qg [T, n_heads, 2, head_dim] (query | gate per head): each query
 *     RMSNorm(1 + q_norm) and RoPE'd in place, gates untouched;
 *   k  [T, n_kv, head_dim]: RMSNorm(1 + k_norm) and RoPE'd in place;
 *   the rows k and v (raw) quantized into the caches (cpu/kvquant.h layout
 *   L, bit for bit what tern_kv_quantize_row writes for the same floats) at
 *   rows pos0 + t.
 * RoPE: rotate-half on the first rope_dim dims, angle pos * inv_freq[i]
 * (rope_dim / 2 device floats), cos and sin times rope_scale (YaRN's
 * attention factor; 1 for plain RoPE). */
typedef struct tern_cuda_attn_dims {
    int n_heads, n_kv, head_dim, rope_dim;
    float eps;
    float rope_scale;
} tern_cuda_attn_dims;
int tern_cuda_attn_prep(const tern_cuda_attn_dims *d, const tern_kvq *L, float *qg, float *k, const float *v,
                        const float *q_norm, const float *k_norm, const float *inv_freq, int T, int pos0,
                        uint8_t *kcache, uint8_t *vcache, tern_stream s, tern_error *err);
/* The same with pos0 read on the device from *pos_dev when the kernel runs,
 * so a captured decode step serves every position. */
int tern_cuda_attn_prep_at(const tern_cuda_attn_dims *d, const tern_kvq *L, float *qg, float *k, const float *v,
                           const float *q_norm, const float *k_norm, const float *inv_freq, int T, const int *pos_dev,
                           uint8_t *kcache, uint8_t *vcache, tern_stream s, tern_error *err);

/* ---- attention over the quantized KV cache ----------------------------- */

/* o[t, h * head_dim ..] = softmax_j(scale q_{t,h} . K_j) V_j * sigmoid(gate_{t,h})
 * over j < pos0 + t + 1 (causal), q/gate from qg as above, K/V rows of
 * layout L (16/8/4 bits) in kcache/vcache. Split-K (flash-decoding): the
 * positions are cut into splits, each block scores one split for the query
 * heads sharing a KV head, and a second kernel combines the splits'
 * partial softmax sums (one token with at most 16 splits, 16-bit KV: the
 * splits of a KV head form a thread-block cluster and merge there, one
 * launch). Rows before pos0 are read from the moment the launch starts
 * (under the previous op, programmatic dependent launch), the rows of this
 * call's tokens after it. n_ctx_max >= pos0 + T sizes the workspace. */
size_t tern_cuda_attention_workspace(const tern_cuda_attn_dims *d, int T, int n_ctx_max);
int tern_cuda_attention(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg, const uint8_t *kcache,
                        const uint8_t *vcache, int T, int pos0, float scale, void *work, size_t work_bytes,
                        float *o, tern_stream s, tern_error *err);
/* The same with pos0 read on the device from *pos_dev; the splits are
 * planned for a context of n_plan >= pos0 + T (positions past pos0 + T
 * leave their splits empty), so one captured step serves every position
 * up to n_plan. *pos_dev is read at the launch's start, so it must be
 * written before the op enqueued just before this one (the engine copies
 * it in before the step). */
int tern_cuda_attention_at(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg, const uint8_t *kcache,
                           const uint8_t *vcache, int T, const int *pos_dev, int n_plan, float scale, void *work,
                           size_t work_bytes, float *o, tern_stream s, tern_error *err);

/* The same attention for a prefill of T tokens (flash-attention style): a
 * block takes 64 query rows (tokens x the query heads of one KV head)
 * through the cache in tiles of 64 positions, K and V dequantized to f16
 * in shared memory, f16 tensor-core products with fp32 accumulation and an
 * fp32 online softmax; each K/V row is read once per 64 query rows instead
 * of once per token. head_dim 32/64/128/256. When the blocks would not
 * fill the GPU (few tokens after a long context), the context is also cut
 * into splits, merged as tern_cuda_attention merges its own; the
 * workspace (tern_cuda_attention_prefill_workspace's bytes for contexts up
 * to n_ctx_max; fewer splits when smaller, none when NULL) holds their
 * records. */
int tern_cuda_attention_prefill(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg,
                                const uint8_t *kcache, const uint8_t *vcache, int T, int pos0, float scale,
                                void *work, size_t work_bytes, float *o, tern_stream s, tern_error *err);
size_t tern_cuda_attention_prefill_workspace(const tern_cuda_attn_dims *d, int n_ctx_max);

#ifdef __cplusplus
}
#endif

#endif
