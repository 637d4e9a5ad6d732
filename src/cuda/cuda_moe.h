/* The CUDA ops of the MoE block at decode: the routed experts and the
 * shared expert, their fixed-point sums, and the router's top k
 * (conventions: cuda_ops.h; the kernels: moe.cuh). */
#ifndef TERN_CUDA_MOE_H
#define TERN_CUDA_MOE_H

#include "cuda/cuda_device.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- decode: the routed experts and the shared expert ------------------ */

/* One part (gate, up or down) of an expert blob: byte offsets of q, scales
 * and biases inside the blob (docs/FORMAT.md, experts/layer_NNN.bin). */
typedef struct tern_cuda_expert_part {
    size_t q_off, s_off, b_off;
    int64_t rows, cols;
    int bits, group;                 /* 4 or 8; group 32/64/128 */
} tern_cuda_expert_part;

/* The routed experts of one layer. Expert e's blob is blobs[e] when blobs
 * (a device array of n_experts pointers, e.g. the slots of an expert
 * cache) is set, else base + e * stride. */
typedef struct tern_cuda_experts {
    const uint8_t *const *blobs;
    const uint8_t *base;
    size_t stride;
    tern_cuda_expert_part gate, up, down;   /* [I, H], [I, H], [H, I] */
    /* 1: tern_cuda_moe may run one token's gate/up and down as one grid
     * whose blocks wait for each other (docs/CUDA.md, "the experts in one
     * launch"). Only when no other such grid can run beside it on the
     * device: two grids sharing the SMs could each wait for blocks the
     * other keeps from starting. 0: the two launches. */
    int one_launch;
    /* The one launch's output as 64-bit fixed-point sums instead of out
     * (docs/CUDA.md, "the experts' sums in fixed point"): fx is a slot of
     * tern_cuda_moe_fx_bytes(hidden), zero before the launch; every block
     * adds its rows' shares into tern_cuda_moe_fx_sums(fx) with integer
     * atomics (the order the blocks finish in does not change the sums),
     * so no block sums a chunk over the experts after the others. The
     * launch also zeroes fx_zero (another slot, or NULL): the slot of the
     * launch before it, whose sums the kernels between the two have read.
     * NULL: out as floats. Only where the one launch applies (else an
     * error). */
    void *fx, *fx_zero;
} tern_cuda_experts;

/* A fixed-point slot: the launch's segment counters (at most 64
 * segments), then hidden sums, each value * 2^TERN_CUDA_DFX_SHIFT (an
 * expert's share saturates at +-2^24, so the sums cannot overflow).
 * tern_cuda_dfx_float converts them. */
#define TERN_CUDA_DFX_SHIFT 32
size_t tern_cuda_moe_fx_bytes(int64_t hidden);
const long long *tern_cuda_moe_fx_sums(const void *fx);
int tern_cuda_dfx_float(float *y, const long long *fx, int n, tern_stream s, tern_error *err);

/* One MoE block for T tokens (T small: decode, MTP verification):
 *   out[t] = sum_k wts[t,k] * E_{ids[t,k]}(x_t) + sigmoid(x_t . w_sg) * S(x_t)
 *   E(x) = (silu(x G^T) * (x U^T)) D^T
 * ids/wts: device [T, top_k] (tern_cuda_route's output). shared and
 * shared_gate (tern_mat with device pointers, gemv-supported encodings) may
 * be NULL for no shared expert. Two launches: gate/up of every (token,
 * expert) pair with SiLU(gate) * up, then down of all of them with the
 * routing weights applied and summed in expert order (no atomics: the sum
 * is deterministic). The workspace is sized with inter = the larger of the
 * routed and the shared intermediate size. */
size_t tern_cuda_moe_workspace(int T, int top_k, int64_t inter, int64_t hidden);   /* zero it once after allocating */
int tern_cuda_moe(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                  const float *x, int T, int top_k, const int32_t *ids, const float *wts, void *work,
                  float *out, tern_stream s, tern_error *err);
/* One token routed inside the experts' launch: the router's logits
 * [n_experts] (tern_cuda_gemv1, without tern_cuda_gemv1_route's top-k)
 * instead of ids and weights; every routed block takes the top k with
 * tern_cuda_route's code, and the ids and weights are also written to
 * ids/wts, the same bit for bit. Only where tern_cuda_moe_routes_itself
 * says so (the one-launch MoE applies, n_experts <= 256), else an error. */
int tern_cuda_moe_routes_itself(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                                int top_k, int n_experts);
int tern_cuda_moe_route(const tern_cuda_experts *ex, const tern_expert_w *shared, const tern_mat *shared_gate,
                        const float *x, int top_k, const float *logits, int n_experts, int renorm, int32_t *ids,
                        float *wts, void *work, float *out, tern_stream s, tern_error *err);

/* The same block for a prefill of T tokens, grouped by expert: the
 * tokens that chose an expert are gathered and multiplied together (bf16
 * tensor-core products with fp32 accumulation; the expert's q4/q8 rows are
 * dequantized to bf16 on the way into shared memory), so each expert's
 * weights are read once per 64 of its tokens. Routed outputs are summed per
 * token in ascending expert id, then the shared expert times its sigmoid
 * gate, as moe_layer does; no float atomics, so the result does not depend
 * on timing. Expert parts share one encoding and group; H and I multiples
 * of 32; n_experts <= 4096, top_k <= 32; the shared expert (may be NULL)
 * q4/q8/bf16/f16 with an intermediate that is a multiple of 32. Seven
 * launches, none waiting for the host. work:
 * tern_cuda_moe_grouped_workspace bytes (T = 4096, top 8, Qwen3.6: 380 MB). */
size_t tern_cuda_moe_grouped_workspace(int T, int top_k, int n_experts, int64_t hidden, int64_t inter,
                                       int64_t shared_inter);
int tern_cuda_moe_grouped(const tern_cuda_experts *ex, int n_experts, const tern_expert_w *shared,
                          const tern_mat *shared_gate, const float *x, int T, int top_k, const int32_t *ids,
                          const float *wts, void *work, size_t work_bytes, float *out, tern_stream s,
                          tern_error *err);

/* counts[e] += the times e occurs in ids[0..n) (ids outside [0,
 * n_experts) skipped): the experts a step chose, for the slot cache of a
 * GPU expert budget. */
int tern_cuda_count_experts(const int32_t *ids, int n, int n_experts, unsigned *counts, tern_stream s,
                            tern_error *err);

/* Router: softmax over n_experts logits [T, n_experts], the top_k largest
 * (descending, ties to the lower index), renormalised over the k when
 * renorm. ids/wts [T, top_k]. n_experts <= 4096, top_k <= 32. */
int tern_cuda_route(const float *logits, int T, int n_experts, int top_k, int renorm, int32_t *ids, float *wts,
                    tern_stream s, tern_error *err);

#ifdef __cplusplus
}
#endif

#endif
