/* The attention's per-token rows as attn_prep (norm.cu) makes them: a
 * head's RMSNorm(1 + w) and rotate-half RoPE, and the 16-bit cache's
 * rounding. */
#ifndef TERN_CUDA_ATTN_ROWS_CUH
#define TERN_CUDA_ATTN_ROWS_CUH

#include "cuda/common.cuh"

#define F16_MAX 65504.0f

/* f16 rounding, as cpu/kvquant.c rounds */
__device__ __forceinline__ uint16_t f16_rne(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float clamp16(float x) { return x > F16_MAX ? F16_MAX : x < -F16_MAX ? -F16_MAX : x; }

/* One head vector by one warp: RMSNorm(1 + w) of in into the warp's
 * scratch, then rotate-half RoPE on the first rope_dim dims with cos and
 * sin times scale, into out (out may be in: every read of in comes before
 * the first write of out). The products and sums are rounded one at a
 * time (no contraction), so its bits do not depend on the kernel it is
 * inlined into. */
__device__ __forceinline__ void norm_rope(const float *in, float *out, const float *w, const float *inv_freq, int hd,
                                          int rope_dim, float scale, int pos, float eps, float *scratch) {
    int lane = threadIdx.x & 31, half = rope_dim / 2;
    float ss = 0.0f;
    for (int d = lane; d < hd; d += 32) ss = __fadd_rn(ss, __fmul_rn(in[d], in[d]));
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int d = lane; d < hd; d += 32) scratch[d] = __fmul_rn(__fmul_rn(in[d], r), 1.0f + w[d]);
    __syncwarp();
    for (int d = lane; d < half; d += 32) {
        float ang = __fmul_rn((float)pos, inv_freq[d]);   /* formed in fp32, as the reference forms it */
        float c = __fmul_rn(cosf(ang), scale), s = __fmul_rn(sinf(ang), scale), a = scratch[d], b = scratch[d + half];
        out[d] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        out[d + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
    for (int d = rope_dim + lane; d < hd; d += 32) out[d] = scratch[d];
    __syncwarp();
}

#endif
