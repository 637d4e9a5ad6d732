/* Exact integer row dots for 4-bit weights at one token (the one-token GEMV
 * and the experts' gate/up).
 *
 * Why: dequantizing a q4 weight to fp32 costs a PRMT, an FADD and an FFMA,
 * and with addressing and loads a 16-byte chunk (32 weights) took ~265
 * instructions per row (measured, Nsight Compute: 6.6 M for a 12352 x 2048
 * product), so the kernels were issue-bound at a third of the bandwidth.
 * Here the weights stay integers and dp4a (four 8-bit products summed into
 * an int32) takes them four at a time: a chunk is 12 masks/shifts and 24
 * dp4a per row.
 *
 * The input becomes integers too, as the tensor-core GEMV does
 * (gemv_fused.cu): per span of 64 values x ~ dx * xi with dx = max|x| / 2^20
 * (|x - dx xi| <= dx / 2, ~5e-7 of the span's largest value), and xi is cut
 * into three 7-bit digits xi = d2 2^14 + d1 2^7 + d0 (d0, d1 in 0..127, d2
 * in -64..64). A chunk's sum q x = dx (c0 + 2^7 c1 + 2^14 c2) with c_i the
 * digit dots: all int32 and exact (|2^14 c2| <= 2^14 * 32 * 15 * 64 < 2^29).
 * Then scale * that + bias * sum(x), as the float kernels do.
 *
 * 8-bit weights take the same digits with dp4a on their bytes as they are
 * (unsigned x signed), 12 per 16-byte chunk.
 *
 * Layout (shared memory): a q4 word holds elements 0..7 of its 8, the low
 * nibbles of its bytes are elements 0, 2, 4, 6 and the high ones 1, 3, 5, 7.
 * So a chunk's digits are 24 int32 words f = (word * 2 + half) * 3 + digit,
 * byte b of word f the digit of element 8 word + 2 b + half; word f of chunk
 * c sits in uint4 (f / 4) * n_chunks + c, component f % 4, so the 32 lanes
 * of a warp reading 32 consecutive chunks read 512 contiguous bytes. */
#ifndef TERN_CUDA_IDOT_CUH
#define TERN_CUDA_IDOT_CUH

#include "cuda/common.cuh"

#define XD_SPAN 64
#define XD_VEC4 6   /* uint4 of digits per chunk, the most of any kind */

/* Per chunk (16 bytes of weights): elements, and uint4 of digits (three
 * bytes per element). q8: a word holds elements 4 w .. 4 w + 3 in its
 * bytes, so its digits are 12 words f = word * 3 + digit. */
template <int KIND> struct xd_traits;
template <> struct xd_traits<KIND_Q4> { enum { E = 32, V4 = 6 }; };
template <> struct xd_traits<KIND_Q8> { enum { E = 16, V4 = 3 }; };

/* Per chunk: the span's dx and the chunk's sum of x. */
typedef struct {
    float dx, sum;
} xd_chunk;

/* Shared memory for an input of cols floats, its digits and its chunks
 * (E elements each): room for q4's six uint4 per chunk (q8 uses three). */
__host__ __device__ static inline size_t xd_smem_bytes(int64_t cols, int E) {
    return (size_t)cols * sizeof(float) + (size_t)(cols / E) * (XD_VEC4 * 16 + sizeof(xd_chunk));
}

/* Digits of xf[0..cols) (shared memory, cols a multiple of 64) into xd
 * (V4 * cols / E uint4) and cx (cols / E) for weights of KIND: warp w takes
 * spans w, w + nwarps, ...; lane l holds values 2l and 2l + 1 of a span.
 * The caller synchronises before (xf complete) and after. */
template <int KIND>
__device__ __forceinline__ void xd_span(const float *xf, int sp, int nch, uint8_t *xb, xd_chunk *cx) {
    constexpr int E = xd_traits<KIND>::E, LPC = E / 2;   /* lanes per chunk */
    const int lane = threadIdx.x & 31;
    float x0 = xf[sp * XD_SPAN + 2 * lane], x1 = xf[sp * XD_SPAN + 2 * lane + 1];
    float m = warp_max(fmaxf(fabsf(x0), fabsf(x1)));
    float s = x0 + x1;   /* the chunk's sum over its LPC lanes */
#pragma unroll
    for (int o = LPC / 2; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float inv = m > 0.0f ? 1048576.0f / m : 0.0f, dx = m > 0.0f ? m * (1.0f / 1048576.0f) : 0.0f;
    int ci = sp * (XD_SPAN / E) + lane / LPC, e = (2 * lane) % E;
    int xi[2] = {__float2int_rn(x0 * inv), __float2int_rn(x1 * inv)};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int dg[3] = {xi[h] & 127, (xi[h] >> 7) & 127, xi[h] >> 14};
        /* q4: word e / 8, half h, byte (e % 8) / 2; q8: word (e + h) / 4, byte (e + h) % 4 */
        const int w = KIND == KIND_Q4 ? e >> 3 : (e + h) >> 2;
        const int b = KIND == KIND_Q4 ? (e & 7) >> 1 : (e + h) & 3;
#pragma unroll
        for (int d = 0; d < 3; d++) {
            int f = KIND == KIND_Q4 ? (w * 2 + h) * 3 + d : w * 3 + d;
            xb[((size_t)(f >> 2) * nch + ci) * 16 + (f & 3) * 4 + b] = (uint8_t)(int8_t)dg[d];
        }
    }
    if (lane % LPC == 0) cx[ci] = xd_chunk{dx, s};
}

/* Digits of xf[0..cols) (shared memory, cols a multiple of 64) into xd
 * (V4 * cols / E uint4) and cx (cols / E) for weights of KIND: warp w takes
 * spans w, w + nwarps, ..., XD_ILP of them at once (each span is a chain
 * of shuffles, a division and byte stores: one at a time, a warp's four
 * spans of a 2,048 input took ~1,600 cycles); lane l holds values 2l and
 * 2l + 1 of a span. The caller synchronises before (xf complete) and after. */
#define XD_ILP 4
/* The same digits and chunks as whole words (the staged GEMV's; measured
 * in docs/experiments/cuda-gemv.md, step 82): lane l of a warp takes the 8
 * consecutive values 8 (l % 8) .. of span 4 i + l / 8, so every byte of a digit word is
 * the lane's own (q4: a word's 8 elements; q8: two words' 4 each) and it
 * stores 6 words instead of 24 bytes, with the span's max in 3 shuffles.
 * The chunk's sum keeps the byte form's order exactly (each pair x[2j] +
 * x[2j + 1], then the butterfly over the pairs: its partners at pair
 * distance 8 and 4 are lanes k ^ 2 and k ^ 1, at 2 and 1 in the lane), so
 * the digits and chunks are the same bits as the byte form's. */
__device__ __forceinline__ uint32_t xd_pack(const int (&xi)[8], int i0, int step, int d) {
    uint32_t w = 0;
#pragma unroll
    for (int b = 0; b < 4; b++) {
        const int v = xi[i0 + step * b];
        const int dg = d == 0 ? v & 127 : d == 1 ? (v >> 7) & 127 : v >> 14;
        w |= ((uint32_t)dg & 0xffu) << (8 * b);
    }
    return w;
}

template <int KIND>
__device__ __forceinline__ void xd_build_wide(const float *xf, int cols, uint4 *xd, xd_chunk *cx, int nwarps,
                                              int w0 = 0) {
    const int nsp = cols / XD_SPAN, nch = cols / xd_traits<KIND>::E, lane = threadIdx.x & 31, k = lane & 7;
    uint32_t *xw = (uint32_t *)xd;
    for (int base = 4 * ((int)(threadIdx.x >> 5) - w0); base < nsp; base += 4 * nwarps) {
        const int sp = base + (lane >> 3);
        const bool on = sp < nsp;
        float x[8];
        {   /* lanes 4-7 of each 8 load their second half first: a quarter warp's 16-byte loads then cover
             * the 32 banks once (32-byte strides alone hit each bank group twice) */
            const int sw = 4 * ((k >> 2) & 1);
            const float *p = xf + sp * XD_SPAN + 8 * k;
            const float4 a = on ? *(const float4 *)(p + sw) : make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 b = on ? *(const float4 *)(p + 4 - sw) : make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 lo = sw ? b : a, hi = sw ? a : b;
            x[0] = lo.x; x[1] = lo.y; x[2] = lo.z; x[3] = lo.w;
            x[4] = hi.x; x[5] = hi.y; x[6] = hi.z; x[7] = hi.w;
        }
        float m = fmaxf(fabsf(x[0]), fabsf(x[1]));
#pragma unroll
        for (int i = 2; i < 8; i++) m = fmaxf(m, fabsf(x[i]));
#pragma unroll
        for (int o = 4; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float inv = m > 0.0f ? 1048576.0f / m : 0.0f, dx = m > 0.0f ? m * (1.0f / 1048576.0f) : 0.0f;
        float p[4];   /* the byte form's lane sums: pair j of this lane is pair 4 (k % LPC/4) + j of its chunk */
#pragma unroll
        for (int j = 0; j < 4; j++) p[j] = x[2 * j] + x[2 * j + 1];
        float sum;
        if (KIND == KIND_Q4) {   /* 16 pairs: partners at 8 (lane k ^ 2), 4 (k ^ 1), then 2 and 1 in the lane */
#pragma unroll
            for (int j = 0; j < 4; j++) p[j] += __shfl_xor_sync(0xffffffffu, p[j], 2);
#pragma unroll
            for (int j = 0; j < 4; j++) p[j] += __shfl_xor_sync(0xffffffffu, p[j], 1);
            sum = (p[0] + p[2]) + (p[1] + p[3]);
        } else {                 /* 8 pairs: partner at 4 (lane k ^ 1), then 2 and 1 in the lane */
#pragma unroll
            for (int j = 0; j < 4; j++) p[j] += __shfl_xor_sync(0xffffffffu, p[j], 1);
            sum = (p[0] + p[2]) + (p[1] + p[3]);
        }
        int xi[8];
#pragma unroll
        for (int i = 0; i < 8; i++) xi[i] = __float2int_rn(x[i] * inv);
        if (!on) continue;
        if (KIND == KIND_Q4) {   /* word k % 4 of chunk sp * 2 + k / 4: byte b of half h is element 2 b + h */
            const int ci = sp * 2 + (k >> 2), w = k & 3;
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int d = 0; d < 3; d++) {
                    const int f = (w * 2 + h) * 3 + d;
                    xw[((size_t)(f >> 2) * nch + ci) * 4 + (f & 3)] = xd_pack(xi, h, 2, d);
                }
            if ((k & 3) == 0) cx[ci] = xd_chunk{dx, sum};
        } else {                 /* words 2 (k % 2), + 1 of chunk sp * 4 + k / 2: byte b is element 4 w + b */
            const int ci = sp * 4 + (k >> 1);
#pragma unroll
            for (int wl = 0; wl < 2; wl++)
#pragma unroll
                for (int d = 0; d < 3; d++) {
                    const int f = (2 * (k & 1) + wl) * 3 + d;
                    xw[((size_t)(f >> 2) * nch + ci) * 4 + (f & 3)] = xd_pack(xi, 4 * wl, 1, d);
                }
            if ((k & 1) == 0) cx[ci] = xd_chunk{dx, sum};
        }
    }
}

template <int KIND>
__device__ __forceinline__ void xd_build(const float *xf, int cols, uint4 *xd, xd_chunk *cx, int nwarps,
                                         int w0 = 0) {   /* the warps taking part: w0 .. w0 + nwarps - 1 */
    const int nsp = cols / XD_SPAN, nch = cols / xd_traits<KIND>::E;
    uint8_t *xb = (uint8_t *)xd;
    for (int sp = (threadIdx.x >> 5) - w0; sp < nsp; sp += XD_ILP * nwarps) {
#pragma unroll
        for (int j = 0; j < XD_ILP; j++)
            if (sp + j * nwarps < nsp) xd_span<KIND>(xf, sp + j * nwarps, nch, xb, cx);
    }
}

/* The digits of chunk c (n_chunks chunks) from shared memory. */
template <int KIND>
__device__ __forceinline__ void xd_load(const uint4 *xd, int nch, int c, uint4 (&d)[XD_VEC4]) {
#pragma unroll
    for (int i = 0; i < xd_traits<KIND>::V4; i++) d[i] = xd[i * nch + c];
}

__device__ __forceinline__ int xd_word(const uint4 (&d)[XD_VEC4], int f) {
    const uint4 &v = d[f >> 2];
    return (f & 3) == 0 ? (int)v.x : (f & 3) == 1 ? (int)v.y : (f & 3) == 2 ? (int)v.z : (int)v.w;
}

/* Four unsigned bytes of a times four signed bytes of b, plus c. */
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* sum q x of a chunk over dx. q4: c0 + 2^7 c1 + 2^14 c2, exact in int32,
 * then one conversion. q8: the digit dots are exact, but 2^14 c2 may pass
 * 2^31 (255 * 64 * 16 * 2^14), so they combine in fp32 (each exact there:
 * |c| < 2^24). */
template <int KIND>
__device__ __forceinline__ float xd_dot(uint4 raw, const uint4 (&d)[XD_VEC4]) {
    const uint32_t wv[4] = {raw.x, raw.y, raw.z, raw.w};
    int c0 = 0, c1 = 0, c2 = 0;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        if (KIND == KIND_Q4) {
            int lo = (int)(wv[w] & 0x0f0f0f0fu), hi = (int)((wv[w] >> 4) & 0x0f0f0f0fu);
            c0 = __dp4a(lo, xd_word(d, w * 6 + 0), c0);
            c1 = __dp4a(lo, xd_word(d, w * 6 + 1), c1);
            c2 = __dp4a(lo, xd_word(d, w * 6 + 2), c2);
            c0 = __dp4a(hi, xd_word(d, w * 6 + 3), c0);
            c1 = __dp4a(hi, xd_word(d, w * 6 + 4), c1);
            c2 = __dp4a(hi, xd_word(d, w * 6 + 5), c2);
        } else {
            c0 = dp4a_us(wv[w], xd_word(d, w * 3 + 0), c0);
            c1 = dp4a_us(wv[w], xd_word(d, w * 3 + 1), c1);
            c2 = dp4a_us(wv[w], xd_word(d, w * 3 + 2), c2);
        }
    }
    if (KIND == KIND_Q4) return (float)(c0 + c1 * 128 + c2 * 16384);
    return fmaf((float)c2, 16384.0f, fmaf((float)c1, 128.0f, (float)c0));
}

#endif
