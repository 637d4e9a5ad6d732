/* The CUDA ops over weight matrices: the embedding's rows, the decode
 * GEMVs (with norms and the router's top k in their prologue and epilogue)
 * and the prefill's GEMM (conventions: cuda_ops.h). */
#ifndef TERN_CUDA_GEMV_H
#define TERN_CUDA_GEMV_H

#include "cuda/cuda_device.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

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
