/* Prefill products through cuBLAS: y[T, N] = x[T, K] W^T with W in any
 * tern_mat encoding. W is dequantized to f16 a tile of rows at a time into
 * the context's scratch (the whole lm_head in f16 would take 1 GiB), x is
 * rounded to f16 once, and cublasGemmEx multiplies them with fp32
 * accumulation, writing the tile's columns of y in place (ldc = N).
 *
 * f16, not bf16: the same tensor-core rate with 3 more mantissa bits. A
 * dequantized q4/q8 weight (q * scale + bias) rounded to bf16 is off by up
 * to 2^-9 of itself, and through a model's layers that reached 2-3e-2 of
 * the logit range against the fp32 CPU engine; f16 keeps it 8x smaller.
 * Weights and the GEMM inputs (normed activations, gated products) sit far
 * inside f16's range; values beyond +-65504 saturate instead of becoming
 * infinities.
 *
 * cuBLAS is column-major: y row-major [T, N] is y^T column-major [N, T],
 * and y^T = W_tile (row-major [n, K] = column-major [K, n], transposed) *
 * x^T (column-major [K, T]). */
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "cuda/internal.h"

/* Rounds to f16, saturating at +-65504. */
__device__ __forceinline__ __half to_f16_sat(float v) { return __float2half_rn(fminf(fmaxf(v, -65504.0f), 65504.0f)); }

/* Eight floats rounded to f16 (saturating), as one 16-byte word: eight
 * 2-byte stores ran the dequantization at ~0.6 TB/s. */
__device__ __forceinline__ uint4 pack8_f16(const float (&v)[8]) {
    uint4 o;
    uint32_t *ow = (uint32_t *)&o;
#pragma unroll
    for (int e = 0; e < 4; e++)
        ow[e] = (uint32_t)__half_as_ushort(to_f16_sat(v[2 * e])) | (uint32_t)__half_as_ushort(to_f16_sat(v[2 * e + 1])) << 16;
    return o;
}

/* 8 elements per thread: w = q * scale + bias (or the float widened), then
 * rounded to f16. */
template <int KIND>
__global__ void dequant_f16_kernel(const uint8_t *q, const uint16_t *sc, const uint16_t *bi, int64_t r0, int64_t n_rows,
                                    int cols, int gsh, __half *out) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n_rows * cols) return;
    int64_t r = r0 + i / cols;
    int c = (int)(i % cols);
    float v[8];
    if (KIND == KIND_Q4 || KIND == KIND_Q8) {
        int64_t ng = cols >> gsh, g = r * ng + (c >> gsh);
        float s = bf16f(sc[g]), b = bf16f(bi[g]);
        if (KIND == KIND_Q4) {
            uint32_t w = *(const uint32_t *)(q + (size_t)r * (cols / 2) + c / 2);
            for (int e = 0; e < 8; e++) v[e] = (float)((w >> (4 * e)) & 15u);
        } else {
            uint2 w = *(const uint2 *)(q + (size_t)r * cols + c);
            for (int e = 0; e < 4; e++) { v[e] = (float)((w.x >> (8 * e)) & 255u); v[4 + e] = (float)((w.y >> (8 * e)) & 255u); }
        }
        for (int e = 0; e < 8; e++) v[e] = fmaf(v[e], s, b);
    } else {
        uint4 w = *(const uint4 *)(q + ((size_t)r * cols + c) * 2);
        uint32_t ws[4] = {w.x, w.y, w.z, w.w};
        for (int e = 0; e < 4; e++) {
            v[2 * e] = KIND == KIND_BF16 ? bf16_lo(ws[e]) : f16_lo(ws[e]);
            v[2 * e + 1] = KIND == KIND_BF16 ? bf16_hi(ws[e]) : f16_hi(ws[e]);
        }
    }
    *(uint4 *)(out + i) = pack8_f16(v);
}

/* 8 values per thread (two 16-byte loads, one 16-byte store) when n is a
 * multiple of 8 and both sides 16-byte aligned; else one per thread. */
__global__ void to_f16_kernel(const float *x, int64_t n, __half *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = to_f16_sat(x[i]);
}

__global__ void to_f16x8_kernel(const float *x, int64_t n8, __half *out) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    float4 a = ((const float4 *)x)[2 * i], b = ((const float4 *)x)[2 * i + 1];
    float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    ((uint4 *)out)[i] = pack8_f16(v);
}

static void dequant_tile(const tern_mat *W, int kind, int64_t r0, int64_t n, __half *out, cudaStream_t s) {
    int64_t elems = n * W->cols;
    int blocks = ceil_div(elems / 8, 256);
    const uint8_t *q = (const uint8_t *)W->data;
    int gsh = W->bits ? log2i(W->group) : 0;
    switch (kind) {
    case KIND_Q4: dequant_f16_kernel<KIND_Q4><<<blocks, 256, 0, s>>>(q, W->scales, W->biases, r0, n, (int)W->cols, gsh, out); break;
    case KIND_Q8: dequant_f16_kernel<KIND_Q8><<<blocks, 256, 0, s>>>(q, W->scales, W->biases, r0, n, (int)W->cols, gsh, out); break;
    case KIND_BF16: dequant_f16_kernel<KIND_BF16><<<blocks, 256, 0, s>>>(q, NULL, NULL, r0, n, (int)W->cols, 0, out); break;
    default: dequant_f16_kernel<KIND_F16><<<blocks, 256, 0, s>>>(q, NULL, NULL, r0, n, (int)W->cols, 0, out); break;
    }
}

int tern_cuda_gemm(tern_cuda_ctx *c, const tern_mat *W, const float *x, int64_t T, float *y, tern_stream s,
                   tern_error *err) {
    int kind = mat_kind(W);
    if (!tern_cuda_gemv_supported(W) || T < 1)
        return tern_fail(err, "gemm: unsupported matrix (bits %d, %lldx%lld) or T = %lld", W->bits, (long long)W->rows,
                         (long long)W->cols, (long long)T);
    int64_t K = W->cols, N = W->rows;
    if (ctx_reserve_x(c, (size_t)T * K * 2, err)) return -1;
    __half *xb = (__half *)c->xb, *wb = (__half *)c->tile;
    if ((T * K) % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)xb % 16) == 0)
        to_f16x8_kernel<<<ceil_div(T * K / 8, 256), 256, 0, s>>>(x, T * K / 8, xb);
    else
        to_f16_kernel<<<ceil_div(T * K, 256), 256, 0, s>>>(x, T * K, xb);
    if (launch_check("gemm x to f16", err)) return -1;
    cublasSetStream(c->blas, s);
    int64_t tile_rows = (int64_t)(c->tile_bytes / ((size_t)K * 2));
    tile_rows = tile_rows / 64 * 64;   /* whole 64-row blocks keep cuBLAS on its aligned paths */
    if (tile_rows < 64) return tern_fail(err, "gemm: tile scratch too small for rows of %lld", (long long)K);
    const float one = 1.0f, zero = 0.0f;
    for (int64_t r0 = 0; r0 < N; r0 += tile_rows) {
        int64_t n = N - r0 < tile_rows ? N - r0 : tile_rows;
        dequant_tile(W, kind, r0, n, wb, s);
        if (launch_check("gemm dequantize", err)) return -1;
        cublasStatus_t st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)T, (int)K, &one, wb, CUDA_R_16F,
                                         (int)K, xb, CUDA_R_16F, (int)K, &zero, y + r0, CUDA_R_32F, (int)N,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) return tern_fail(err, "gemm: cublasGemmEx: %s", cublasGetStatusString(st));
    }
    return 0;
}
