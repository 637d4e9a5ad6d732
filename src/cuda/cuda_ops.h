/* The CUDA op library: the GPU kernels of tern's forward pass behind a C
 * API. Every op takes device pointers and a stream, enqueues its kernels
 * and returns at once (0, or -1 with err set if the arguments are outside
 * what the kernels handle or the launch failed); nothing synchronises, so a
 * sequence of ops can be captured in a CUDA graph. Each op has a CPU twin
 * in src/cpu/ (or, where tern has none, a reference in tests/cuda/) and is
 * checked against it by `make test-cuda`; docs/CUDA.md lists the ops, the
 * layouts, the checker's results and the timings.
 *
 * Layouts are the CPU engine's (src/engine/forward.c): activations fp32
 * row-major [T, n]; weights tern_mat (model/weights.h) with device
 * pointers in data/scales/biases; the KV cache rows of cpu/kvquant.h.
 *
 * Ops that need scratch take a caller-owned device workspace whose size a
 * *_workspace() function gives, so the same buffers serve every step of a
 * captured graph. */
#ifndef TERN_CUDA_OPS_H
#define TERN_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/kvquant.h"
#include "cuda/sample_limits.h"
#include "model/weights.h"
#include "tern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t is `struct CUstream_st *`: the same type, without the CUDA
 * headers. NULL is the legacy default stream. */
typedef struct CUstream_st *tern_stream;

/* ---- device, memory, streams, timing ----------------------------------- */

/* Selects the device for the calling thread and reports its name. */
int tern_cuda_init(int device, char *name, size_t name_len, tern_error *err);

void *tern_cuda_alloc(size_t bytes, tern_error *err);           /* cudaMalloc; NULL on failure */
void tern_cuda_free(void *p);
/* Blocking copies on the legacy stream, complete on return; they do not
 * wait for work on other (non-blocking) streams: sync those first. */
int tern_cuda_upload(void *dst, const void *src, size_t bytes, tern_error *err);
int tern_cuda_download(void *dst, const void *src, size_t bytes, tern_error *err);
int tern_cuda_copy(void *dst, const void *src, size_t bytes, tern_stream s, tern_error *err);
int tern_cuda_fill(void *dst, int byte, size_t bytes, tern_stream s, tern_error *err);
/* Page-locked host memory (cudaMallocHost): copies to and from it run
 * asynchronously on a stream (tern_cuda_copy_host), so a decode step's
 * few bytes in and out ride in the stream without a blocking copy. */
void *tern_cuda_host_alloc(size_t bytes, tern_error *err);
void tern_cuda_host_free(void *p);
/* Enqueues a copy between page-locked host memory and the device on s
 * (to_host picks the way); the host buffer must stay untouched until s
 * has passed it. */
int tern_cuda_copy_host(void *dst, const void *src, size_t bytes, int to_host, tern_stream s, tern_error *err);
int tern_cuda_sync(tern_stream s, tern_error *err);             /* waits; reports kernel faults */
/* A measurement build's phase trace (src/cuda/trace.cuh) into a CSV file;
 * in other builds an error saying so. */
int tern_cuda_trace_dump(const char *path, tern_error *err);

tern_stream tern_cuda_stream_create(tern_error *err);
void tern_cuda_stream_destroy(tern_stream s);

/* CUDA graphs: ops enqueued on s between begin and end are recorded, not
 * run; the graph replays them with one launch. (cudaGraphExec_t is `struct
 * CUgraphExec_st *`.) */
typedef struct CUgraphExec_st *tern_graph;
int tern_cuda_capture_begin(tern_stream s, tern_error *err);
tern_graph tern_cuda_capture_end(tern_stream s, tern_error *err);
/* Ends a capture into *exec: when *exec holds a graph of the same shape
 * (a decode step differs from the previous one only in kernel arguments:
 * the position, the number of attention splits) its nodes are updated in
 * place (cudaGraphExecUpdate), else a new executable replaces it. */
int tern_cuda_capture_end_into(tern_stream s, tern_graph *exec, tern_error *err);
/* Ends a capture that failed midway, leaving the stream usable. */
void tern_cuda_capture_abort(tern_stream s);
int tern_cuda_graph_launch(tern_graph g, tern_stream s, tern_error *err);
void tern_cuda_graph_destroy(tern_graph g);

/* An event to wait for one point of a stream (no timing): a decode step
 * launched ahead of the host's reading of the one before waits on its own. */
typedef struct CUevent_st *tern_event;
tern_event tern_cuda_event_create(tern_error *err);
void tern_cuda_event_destroy(tern_event e);
int tern_cuda_event_record(tern_event e, tern_stream s, tern_error *err);
int tern_cuda_event_sync(tern_event e, tern_error *err);   /* waits; reports kernel faults */

/* Marks: n events recorded on a stream without waiting, read after the
 * stream is synchronised (per-op GPU time for the kernel statistics,
 * tern_load_params.debug.kernel_stats; the op checker's timings). */
typedef struct tern_cuda_marks tern_cuda_marks;
tern_cuda_marks *tern_cuda_marks_create(int n, tern_error *err);
void tern_cuda_marks_destroy(tern_cuda_marks *m);
int tern_cuda_mark(tern_cuda_marks *m, int i, tern_stream s);
/* Milliseconds from mark i to mark j (both recorded and reached); < 0 on error. */
float tern_cuda_marks_ms(const tern_cuda_marks *m, int i, int j);

/* ---- the context: cuBLAS handle and the dequantization tile ------------ */

typedef struct tern_cuda_ctx tern_cuda_ctx;
/* tile_bytes: the bf16 scratch that tern_cuda_gemm dequantizes weights
 * into (0: 64 MiB). */
tern_cuda_ctx *tern_cuda_ctx_create(size_t tile_bytes, tern_error *err);
void tern_cuda_ctx_destroy(tern_cuda_ctx *c);

/* ---- embedding --------------------------------------------------------- */

/* x[t] = row ids[t] of W (ids on the device), t < T, dequantized as
 * tern_mat_row does (q * scale + bias rounded twice, no fused multiply-add),
 * so the rows equal the CPU's bit for bit. Any encoding
 * tern_cuda_gemv_supported takes, and F32. */
int tern_cuda_embed(const tern_mat *W, const int32_t *ids, int T, float *x, tern_stream s, tern_error *err);
/* The same, where an id of -1 stands for *prev (device memory, read when
 * the kernel runs): a decode step launched before the host has read the
 * step before's draw takes its token from the sampler's device copy. */
int tern_cuda_embed_prev(const tern_mat *W, const int32_t *ids, const int32_t *prev, int T, float *x, tern_stream s,
                         tern_error *err);

/* ---- decode: matrix-vector products ------------------------------------ */

/* Most tokens one tern_cuda_gemv call takes (one accumulator per token and
 * row in registers). */
#define TERN_CUDA_GEMV_MAX_T 8

/* 1 if tern_cuda_gemv handles W: bits 4 or 8 with group 32/64/128 dividing
 * cols and cols * bits / 8 a multiple of 16 bytes; or bits 0 with dtype
 * BF16 or F16 and cols a multiple of 8. Rows must start 16-byte aligned
 * (cudaMalloc'd, and the row rule above). */
int tern_cuda_gemv_supported(const tern_mat *W);

/* y[T, W.rows] = x[T, W.cols] W^T, 1 <= T <= TERN_CUDA_GEMV_MAX_T, fp32 x
 * and y; each weight row is read once for all T tokens, dequantized in
 * registers (w = q * scale + bias, dotted per group as scale * sum(q x) +
 * bias * sum(x)). */
int tern_cuda_gemv(const tern_mat *W, const float *x, int T, float *y, tern_stream s, tern_error *err);

/* How a one-token GEMV makes its input in its prologue (gemv_fused.cu):
 * xin = x (+ delta: the residual; the sum goes to x_out, which must be
 * neither input), then, with norm_w, RMSNorm'd: xin * r * (one_plus ? 1 + w
 * : w), r = 1 / sqrt(mean(xin^2) + eps); xn_out (optional) keeps that
 * normalised vector for other consumers. */
typedef struct tern_cuda_vec_in {
    const float *x, *delta;
    float *x_out;
    const float *norm_w;
    int one_plus;
    float eps;
    float *xn_out;
    /* delta as the experts' fixed-point sums (tern_cuda_experts.fx;
     * instead of delta, then NULL): each entry d * 2^TERN_CUDA_DFX_SHIFT,
     * read as the float nearest d */
    const long long *delta_fx;
} tern_cuda_vec_in;

/* 1 if tern_cuda_gemv1 handles W: q4/q8 (group 32/64/128 dividing cols)
 * or bf16/f16, rows of whole 16-byte chunks (q4: cols % 32 == 0, q8: % 16,
 * 16-bit: % 8), cols <= 8192. */
int tern_cuda_gemv1_supported(const tern_mat *W);

/* y[W.rows] = W xin for one token, xin made from `in` as above: one launch
 * for a norm (and residual add) and the GEMV that consumes it. Launched
 * with programmatic dependent launch: its weight loads start before the
 * previous kernel ends. */
int tern_cuda_gemv1(const tern_mat *W, const tern_cuda_vec_in *in, float *y, tern_stream s, tern_error *err);

/* The router of the one-token path: logits = W xin as tern_cuda_gemv1,
 * then, in the kernel's last block, tern_cuda_route's softmax / top-k /
 * renormalisation of them into ids and wts (one launch instead of two).
 * counter: a device unsigned int, zero before the first call (the kernel
 * leaves it zero); n_experts = W.rows <= 256, top_k <= 32. */
typedef struct tern_cuda_route_out {
    int n_experts, top_k, renorm;
    int32_t *ids;
    float *wts;
    unsigned *counter;
} tern_cuda_route_out;
int tern_cuda_gemv1_route(const tern_mat *W, const tern_cuda_vec_in *in, float *logits,
                          const tern_cuda_route_out *route, tern_stream s, tern_error *err);

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

/* Router: softmax over n_experts logits [T, n_experts], the top_k largest
 * (descending, ties to the lower index), renormalised over the k when
 * renorm. ids/wts [T, top_k]. n_experts <= 4096, top_k <= 32. */
int tern_cuda_route(const float *logits, int T, int n_experts, int top_k, int renorm, int32_t *ids, float *wts,
                    tern_stream s, tern_error *err);

/* ---- norms, residual, RoPE --------------------------------------------- */

/* Per token: x += delta (when delta is set, written back to x), then
 * y = x / rms(x) * (one_plus ? 1 + w : w). y may be x (in place) only
 * without delta: with delta, x keeps the residual sum. */
int tern_cuda_rmsnorm(float *y, float *x, const float *delta, const float *w, int one_plus, int n, int T,
                      float eps, tern_stream s, tern_error *err);

/* The attention block's pre-attention step for T tokens at positions
 * pos0..pos0+T-1:
 *   qg [T, n_heads, 2, head_dim] (query | gate per head): each query
 *     RMSNorm(1 + q_norm) and RoPE'd in place, gates untouched;
 *   k  [T, n_kv, head_dim]: RMSNorm(1 + k_norm) and RoPE'd in place;
 *   the rows k and v (raw) quantized into the caches (cpu/kvquant.h layout
 *   L, bit for bit what tern_kv_quantize_row writes for the same floats) at
 *   rows pos0 + t.
 * RoPE: rotate-half on the first rope_dim dims, angle pos * inv_freq[i]
 * (rope_dim / 2 device floats). */
typedef struct tern_cuda_attn_dims {
    int n_heads, n_kv, head_dim, rope_dim;
    float eps;
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

/* The same attention for a prefill of T tokens (flash-attention style, one
 * launch, no workspace): a block takes 64 query rows (tokens x the query
 * heads of one KV head) through the cache in tiles of 64 positions, K and
 * V dequantized to f16 in shared memory, f16 tensor-core products with
 * fp32 accumulation and an fp32 online softmax; each K/V row is read once
 * per 64 query rows instead of once per token. head_dim 32/64/128/256. */
int tern_cuda_attention_prefill(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg,
                                const uint8_t *kcache, const uint8_t *vcache, int T, int pos0, float scale, float *o,
                                tern_stream s, tern_error *err);

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

/* ---- sampling ---------------------------------------------------------- */

/* The id of the largest of logits[0 .. n_valid) (lowest id on ties; NaN
 * counts as -inf), written to *id (device or mapped host memory) and, when
 * id2 is not NULL, to *id2 too. work: tern_cuda_sample_workspace
 * bytes, zero before their first use (a count the call leaves zero). One
 * launch that may start before the logits' kernel ends (programmatic
 * dependent launch). */
size_t tern_cuda_sample_workspace(int n_valid);
int tern_cuda_argmax(const float *logits, int n_valid, void *work, int32_t *id, int32_t *id2, tern_stream s,
                     tern_error *err);

/* Temperature, top-k (1 <= top_k <= TERN_CUDA_SAMPLE_MAX_K), top-p over what
 * top-k kept, min-p, then the draw at *u in [0, 1) (the caller's random
 * number, read on the device when the kernel runs, so a captured step
 * takes a new one each replay): the order and rules of engine/sampler.h,
 * on the GPU; only the id comes back (into *id and *id2 as argmax's). Penalties are the caller's (applied
 * to the logits). */
#define TERN_CUDA_SAMPLE_MAX_K TERN_GPU_SAMPLE_MAX_K
int tern_cuda_sample(const float *logits, int n_valid, float temperature, int top_k, float top_p, float min_p,
                     const double *u, void *work, int32_t *id, int32_t *id2, tern_stream s, tern_error *err);
/* Whether tern_cuda_sample takes n_valid ids at top_k: its merge holds
 * ceil(n_valid / 4096) x top_k candidates, at most 4096 (top-k 64 up to
 * 262,144 ids). */
int tern_cuda_sample_fits(int n_valid, int top_k);

/* ---- prefill ----------------------------------------------------------- */

/* y[T, W.rows] = x[T, W.cols] W^T for any T through cuBLAS: W is
 * dequantized tile by tile into the context's bf16 scratch, x rounded to
 * bf16, products accumulated in fp32 (cublasGemmEx). */
int tern_cuda_gemm(tern_cuda_ctx *c, const tern_mat *W, const float *x, int64_t T, float *y, tern_stream s,
                   tern_error *err);

#ifdef __cplusplus
}
#endif

#endif
