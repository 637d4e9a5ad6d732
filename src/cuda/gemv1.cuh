/* The one-token GEMV's input and chunk dot (gemv_fused.cu), shared with
 * the fused MoE block (moe_fused.cu), whose router must give the same
 * logits as the fused router of gemv1 bit for bit: the same norm, the same
 * products in the same order. Blocks of G1_THREADS threads. */
#ifndef TERN_CUDA_GEMV1_CUH
#define TERN_CUDA_GEMV1_CUH

#include "cuda/common.cuh"

#define G1_THREADS 256
#define G1_WARPS (G1_THREADS / 32)
#define G1_MAXV 8                    /* float4 of the input per thread: cols <= 8192 */

/* sum over a 16-byte chunk of w_i x_i (quantized kinds: of q_i x_i). */
template <int KIND>
__device__ __forceinline__ float g1_chunk_dot(uint4 raw, const float4 *xv) {
    const uint32_t wv[4] = {raw.x, raw.y, raw.z, raw.w};
    float pw[4];   /* one chain per word: four independent FMA chains instead of one of 32 */
#pragma unroll
    for (int wi = 0; wi < 4; wi++) {
        uint32_t w = wv[wi];
        float p = 0.0f;
        if (KIND == KIND_Q4) {
            uint32_t lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;
            float4 a = xv[2 * wi], b = xv[2 * wi + 1];
            p = fmaf(byte_f<0>(lo), a.x, p); p = fmaf(byte_f<0>(hi), a.y, p);
            p = fmaf(byte_f<1>(lo), a.z, p); p = fmaf(byte_f<1>(hi), a.w, p);
            p = fmaf(byte_f<2>(lo), b.x, p); p = fmaf(byte_f<2>(hi), b.y, p);
            p = fmaf(byte_f<3>(lo), b.z, p); p = fmaf(byte_f<3>(hi), b.w, p);
        } else if (KIND == KIND_Q8) {
            float4 a = xv[wi];
            p = fmaf(byte_f<0>(w), a.x, p); p = fmaf(byte_f<1>(w), a.y, p);
            p = fmaf(byte_f<2>(w), a.z, p); p = fmaf(byte_f<3>(w), a.w, p);
        } else {
            float4 a = xv[wi / 2];
            float x0 = (wi & 1) ? a.z : a.x, x1 = (wi & 1) ? a.w : a.y;
            float f0 = KIND == KIND_BF16 ? bf16_lo(w) : f16_lo(w), f1 = KIND == KIND_BF16 ? bf16_hi(w) : f16_hi(w);
            p = fmaf(f1, x1, fmaf(f0, x0, p));
        }
        pw[wi] = p;
    }
    return (pw[0] + pw[1]) + (pw[2] + pw[3]);
}

static __device__ float g1_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < G1_WARPS; i++) s += red[i];
    return s;
}

/* The input, made by every block in registers (float4 k of a thread is
 * element tid + k * G1_THREADS): x (+ delta, which block 0 writes to
 * x_out), then the RMSNorm when asked (block 0 keeps the result in
 * xn_out). Shared by the three kernels, which then lay it out their way. */
__device__ __forceinline__ void g1_input(const tern_cuda_vec_in &in, int cols, float *red, float4 (&v)[G1_MAXV]) {
    int n4 = cols / 4, tid = threadIdx.x;
    bool first = blockIdx.x == 0;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < G1_MAXV; k++) {
        int i = tid + k * G1_THREADS;
        if (i < n4) {
            v[k] = ((const float4 *)in.x)[i];
            if (in.delta) {
                float4 d = ((const float4 *)in.delta)[i];
                v[k].x += d.x; v[k].y += d.y; v[k].z += d.z; v[k].w += d.w;
                if (first && in.x_out) ((float4 *)in.x_out)[i] = v[k];
            }
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
    }
    float r = 1.0f;
    if (in.norm_w) r = 1.0f / sqrtf(g1_block_sum(ss, red) / (float)cols + in.eps);
#pragma unroll
    for (int k = 0; k < G1_MAXV; k++) {
        int i = tid + k * G1_THREADS;
        if (i < n4) {
            if (in.norm_w) {
                float4 w = ((const float4 *)in.norm_w)[i];
                if (in.one_plus) { w.x += 1.0f; w.y += 1.0f; w.z += 1.0f; w.w += 1.0f; }
                v[k].x = v[k].x * r * w.x; v[k].y = v[k].y * r * w.y; v[k].z = v[k].z * r * w.z; v[k].w = v[k].w * r * w.w;
            }
            if (first && in.xn_out) ((float4 *)in.xn_out)[i] = v[k];
        }
    }
}

#endif
