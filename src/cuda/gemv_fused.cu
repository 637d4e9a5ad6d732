/* One-token GEMV with its input made in the prologue: y = W xin, where
 * xin = x (+ delta, the residual; block 0 writes the sum to x_out), then
 * RMSNorm'd with (1 + w) or w when a norm is given (block 0 may keep the
 * normalised vector in xn_out). The decode step's RMSNorms and residual
 * adds ride on the GEMV that consumes them instead of costing a launch
 * each.
 *
 * Shaped around the weight loads, which are all there is at one token: a
 * q4 row of 2,048 is 1 KB, a whole projection a few MB, so a kernel is
 * over in a few microseconds and most of that is the DRAM latency of its
 * first loads. So:
 *   - every lane issues its first tile's loads (R rows x U 16-byte chunks,
 *     with their scales and biases) before anything else, before even
 *     waiting for the previous kernel (programmatic dependent launch: the
 *     weights are constant), and the next tile's loads before computing the
 *     current one (two tiles in registers);
 *   - the input is built once per block into shared memory, float4 q of
 *     chunk c at [q * n_chunks + c], so the 32 lanes reading 32 consecutive
 *     chunks hit 32 different banks; per chunk the sum of its inputs is kept
 *     too, so a quantized chunk costs scale * sum(q x) + bias * sum(x) with
 *     sum(x) read once;
 *   - lanes take chunks lane, lane + 32, ... of a row; R x U = 4 chunks per
 *     tile (R = 4 rows of one chunk per lane, 2 x 2, or 1 row x 4 chunks,
 *     by the row's chunk count; lanes past a short row's last chunk idle);
 *     the grid is at most the resident blocks, each warp walking row
 *     groups warp, warp + all warps, ...
 * cols <= 8192: the input lives in registers during the norm. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/idot.cuh"
#include "cuda/route.cuh"

#define G1_THREADS 256
#define G1_WARPS (G1_THREADS / 32)
#define G1_MAXV 8                    /* float4 of the input per thread: cols <= 8192 */

typedef struct {
    const uint8_t *q;
    const uint16_t *sc, *bi;
    int64_t rows;
    int cols, gsh;
    size_t row_bytes;
    tern_cuda_vec_in in;
    float *y;
    tern_cuda_route_out route;   /* counter NULL: no routing epilogue */
} g1_args;

/* The router's epilogue (one-token path): the block that finishes last
 * (a counter, reset by that block for the next call) routes the logits
 * y[0..E) with tern_cuda_route's code (route.cuh), E <= 256 (8 logits a
 * lane: more would cost every GEMV variant registers). */
__device__ __forceinline__ void g1_route(const g1_args &a) {
    __shared__ int last;
    __threadfence();   /* this block's rows are visible before it counts */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(a.route.counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    route_row<8>(a.y, a.route.n_experts, a.route.top_k, a.route.renorm, a.route.ids, a.route.wts);
    if (threadIdx.x == 0) *a.route.counter = 0;
}

template <int R, int U> struct g1_tile {
    uint4 raw[R][U];
    float s[R][U], b[R][U];
};

/* Row group grp (rows grp * R ..), chunk batch `batch` of the lane. */
template <int KIND, int R, int U>
__device__ __forceinline__ void g1_load(const g1_args &a, int64_t grp, int batch, int lane, g1_tile<R, U> &t) {
    constexpr int E = kind_traits<KIND>::E;
    int64_t ng = a.cols >> a.gsh;
#pragma unroll
    for (int r = 0; r < R; r++) {
        int64_t row = grp * R + r;
        row = row < a.rows ? row : a.rows - 1;   /* past the end: a valid row, nothing stored */
        const uint8_t *qp = a.q + row * a.row_bytes;
#pragma unroll
        for (int j = 0; j < U; j++) {
            int ci = lane + 32 * (batch * U + j);
            if (ci >= a.cols / E) {   /* past the row's end: contributes nothing */
                t.raw[r][j] = make_uint4(0, 0, 0, 0);
                t.s[r][j] = t.b[r][j] = 0.0f;
                continue;
            }
            t.raw[r][j] = ld_stream(qp + (size_t)ci * 16);
            if (kind_traits<KIND>::QUANT) {
                int g = (ci * E) >> a.gsh;
                t.s[r][j] = bf16f(__ldg(a.sc + row * ng + g));
                t.b[r][j] = bf16f(__ldg(a.bi + row * ng + g));
            }
        }
    }
}

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

__device__ float g1_block_sum(float v, float *red) {
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
__device__ __forceinline__ void g1_input(const g1_args &a, float *red, float4 (&v)[G1_MAXV]) {
    const tern_cuda_vec_in &in = a.in;
    int n4 = a.cols / 4, tid = threadIdx.x;
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
    if (in.norm_w) r = 1.0f / sqrtf(g1_block_sum(ss, red) / (float)a.cols + in.eps);
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

/* The input into shared memory (permuted, see the header) and, for
 * quantized kinds, each chunk's sum. */
template <int KIND>
__device__ void g1_stage(const g1_args &a, float4 *xs4, float *csum, float *red) {
    constexpr int E = kind_traits<KIND>::E, F = E / 4;
    int n4 = a.cols / 4, nch = a.cols / E, tid = threadIdx.x;
    float4 v[G1_MAXV];
    g1_input(a, red, v);
#pragma unroll
    for (int k = 0; k < G1_MAXV; k++) {
        int i = tid + k * G1_THREADS;
        if (i < n4) xs4[(i % F) * nch + i / F] = v[k];
    }
    __syncthreads();
    if (kind_traits<KIND>::QUANT) {
        for (int c = tid; c < nch; c += G1_THREADS) {
            float s = 0.0f;
#pragma unroll
            for (int q = 0; q < F; q++) {
                float4 o = xs4[q * nch + c];
                s += (o.x + o.y) + (o.z + o.w);
            }
            csum[c] = s;
        }
        __syncthreads();
    }
}

template <int KIND, int R, int U>
__global__ void __launch_bounds__(G1_THREADS, 2) gemv1_kernel(g1_args a) {
    constexpr int E = kind_traits<KIND>::E, F = E / 4;
    extern __shared__ float4 g1_smem[];
    __shared__ float red[G1_WARPS];
    int nch = a.cols / E, lane = threadIdx.x & 31;
    float4 *xs4 = g1_smem;
    float *csum = (float *)(g1_smem + a.cols / 4);
    int64_t gw = (int64_t)blockIdx.x * G1_WARPS + (threadIdx.x >> 5), nw = (int64_t)gridDim.x * G1_WARPS;
    int64_t ngrp = (a.rows + R - 1) / R;
    int nb = ((nch + 31) / 32 + U - 1) / U;
    int64_t tiles = gw < ngrp ? ((ngrp - 1 - gw) / nw + 1) * nb : 0;

    pdl_trigger();
    g1_tile<R, U> cur;
    if (tiles) g1_load<KIND, R, U>(a, gw, 0, lane, cur);
    pdl_wait();   /* the input is the previous kernel's output */
    g1_stage<KIND>(a, xs4, csum, red);

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int64_t t = 0; t < tiles; t++) {
        int64_t grp = gw + (t / nb) * nw;
        int batch = (int)(t % nb);
        g1_tile<R, U> nxt;
        bool more = t + 1 < tiles;
        if (more) g1_load<KIND, R, U>(a, gw + ((t + 1) / nb) * nw, (int)((t + 1) % nb), lane, nxt);
#pragma unroll
        for (int j = 0; j < U; j++) {
            int ci = lane + 32 * (batch * U + j);
            if (ci >= nch) continue;
            float4 xv[F];
#pragma unroll
            for (int q = 0; q < F; q++) xv[q] = xs4[q * nch + ci];
            float cs = kind_traits<KIND>::QUANT ? csum[ci] : 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float p = g1_chunk_dot<KIND>(cur.raw[r][j], xv);
                acc[r] += kind_traits<KIND>::QUANT ? fmaf(cur.s[r][j], p, cur.b[r][j] * cs) : p;
            }
        }
        if (batch == nb - 1) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                float v = warp_sum(acc[r]);
                int64_t row = grp * R + r;
                if (lane == 0 && row < a.rows) a.y[row] = v;
                acc[r] = 0.0f;
            }
        }
        if (more) cur = nxt;
    }
    if (a.route.counter) g1_route(a);
}

static int g1_sms(void);

/* Resident blocks per SM of a kernel at `smem` bytes of dynamic shared
 * memory, cached per kernel and size (the CUDA queries cost microseconds,
 * and a step launched outside a graph would pay them every call); the
 * kernel's shared-memory limit is raised to the largest size asked. A pure
 * function of the kernel and the device, so the cache is safe to share. */
typedef struct {
    size_t smem[8], limit;
    int occ[8], n;
} occ_cache;

template <typename Kernel>
static int blocks_per_sm(occ_cache &c, Kernel kernel, size_t smem) {
    for (int i = 0; i < c.n; i++)
        if (c.smem[i] == smem) return c.occ[i];
    if (smem > c.limit && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) ==
                              cudaSuccess)
        c.limit = smem;
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, G1_THREADS, smem) != cudaSuccess || occ < 1) occ = 1;
    if (c.n < 8) {
        c.smem[c.n] = smem;
        c.occ[c.n++] = occ;
    }
    return occ;
}

/* ---- the staged variant: weights through shared memory -------------------
 * The register tiles above keep at most two tiles per lane in flight, and
 * registers bound the warps per SM: measured, a q4 12352 x 2048 projection
 * ran at ~1.3 TB/s. Here a block's tile of RT = 8 x RW whole rows (~16 KB
 * with their scales and biases) is copied into shared memory with
 * cp.async (no registers held while in flight), GS_STAGES tiles deep: the
 * first GS_STAGES - 1 are requested before waiting for the previous kernel,
 * each later one as soon as a stage frees. Rows are contiguous, so a tile is
 * one contiguous range. Warps then read their RW rows from shared memory
 * (32 lanes, 32 consecutive 16-byte chunks: no bank conflicts). With ID the
 * products are integer dots on the input's digits (idot.cuh): q4 always,
 * q8 for the largest matrices (gemv1 below). */
#define GS_STAGES 3
#define GS_TILE_BYTES 16384

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

typedef struct {
    size_t dbytes, sbytes, stage;   /* a stage: data, then scales and biases (each padded to 16 bytes) */
    int ng, rt;
} gs_layout;

__host__ __device__ static inline gs_layout gs_layout_of(int quant, int64_t cols, int gsh, size_t row_bytes, int rt) {
    gs_layout L;
    L.rt = rt;
    L.ng = quant ? (int)(cols >> gsh) : 0;
    L.dbytes = (size_t)rt * row_bytes;
    L.sbytes = quant ? ((size_t)rt * L.ng * 2 + 15) / 16 * 16 : 0;
    L.stage = L.dbytes + 2 * L.sbytes;
    return L;
}

/* Tile t's rows (those that exist) into a stage; every thread takes part. */
template <int KIND>
__device__ __forceinline__ void gs_issue(const g1_args &a, const gs_layout &L, int64_t t, uint8_t *stage) {
    int64_t r0 = t * L.rt;
    int nrow = (int)min((int64_t)L.rt, a.rows - r0);
    int n16 = nrow * (int)(a.row_bytes / 16);
    const uint8_t *src = a.q + r0 * a.row_bytes;
    for (int i = threadIdx.x; i < n16; i += G1_THREADS) cp_async16(stage + (size_t)i * 16, src + (size_t)i * 16);
    if (kind_traits<KIND>::QUANT) {
        int n4 = nrow * L.ng / 2;   /* ng is even here: whole 4-byte pieces */
        const uint8_t *ss = (const uint8_t *)(a.sc + r0 * L.ng), *bb = (const uint8_t *)(a.bi + r0 * L.ng);
        for (int i = threadIdx.x; i < n4; i += G1_THREADS) {
            cp_async4(stage + L.dbytes + (size_t)i * 4, ss + (size_t)i * 4);
            cp_async4(stage + L.dbytes + L.sbytes + (size_t)i * 4, bb + (size_t)i * 4);
        }
    }
}

/* ID: q4 / q8 through integer dots (idot.cuh), the input as digits. */
template <int KIND, int RW, bool ID>
__global__ void __launch_bounds__(G1_THREADS) gemv1s_kernel(g1_args a) {
    constexpr int E = kind_traits<KIND>::E, F = E / 4;
    constexpr bool Q = kind_traits<KIND>::QUANT;
    extern __shared__ float4 g1_smem[];
    __shared__ float red[G1_WARPS];
    gs_layout L = gs_layout_of(Q, a.cols, a.gsh, a.row_bytes, G1_WARPS * RW);
    int nch = a.cols / E, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint8_t *stages = (uint8_t *)g1_smem;
    float4 *xs4 = (float4 *)(stages + GS_STAGES * L.stage);
    float *csum = (float *)(xs4 + a.cols / 4);
    uint4 *xd = (uint4 *)(xs4 + a.cols / 4);
    xd_chunk *cx = (xd_chunk *)(xd + XD_VEC4 * nch);
    int64_t tiles = (a.rows + L.rt - 1) / L.rt;

    pdl_trigger();
#pragma unroll
    for (int k = 0; k < GS_STAGES - 1; k++) {   /* weights only: before the wait */
        int64_t t = blockIdx.x + (int64_t)k * gridDim.x;
        if (t < tiles) gs_issue<KIND>(a, L, t, stages + k * L.stage);
        cp_commit();
    }
    pdl_wait();
    if (ID) {
        float4 v[G1_MAXV];
        g1_input(a, red, v);
#pragma unroll
        for (int k = 0; k < G1_MAXV; k++) {
            int i = threadIdx.x + k * G1_THREADS;
            if (i < a.cols / 4) xs4[i] = v[k];
        }
        __syncthreads();
        xd_build<KIND == KIND_Q8 ? KIND_Q8 : KIND_Q4>((const float *)xs4, a.cols, xd, cx, G1_WARPS);
        __syncthreads();
    } else {
        g1_stage<KIND>(a, xs4, csum, red);
    }

    for (int k = 0;; k++) {
        int64_t t = blockIdx.x + (int64_t)k * gridDim.x;
        if (t >= tiles) break;
        cp_wait<GS_STAGES - 2>();   /* this thread's copies of tile t have landed */
        __syncthreads();            /* and everyone's; stage (k - 1) is free again */
        int64_t tn = t + (int64_t)(GS_STAGES - 1) * gridDim.x;
        if (tn < tiles) gs_issue<KIND>(a, L, tn, stages + ((k + GS_STAGES - 1) % GS_STAGES) * L.stage);
        cp_commit();
        const uint8_t *st = stages + (k % GS_STAGES) * L.stage;
        const uint16_t *ssc = (const uint16_t *)(st + L.dbytes), *sbi = (const uint16_t *)(st + L.dbytes + L.sbytes);
        int64_t r0 = t * L.rt;
        float acc[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) acc[r] = 0.0f;
        for (int ci = lane; ci < nch; ci += 32) {
            if (ID) {
                constexpr int IK = KIND == KIND_Q8 ? KIND_Q8 : KIND_Q4;
                uint4 d[XD_VEC4];
                xd_load<IK>(xd, nch, ci, d);
                xd_chunk c = cx[ci];
                int g = (ci * E) >> a.gsh;
#pragma unroll
                for (int r = 0; r < RW; r++) {
                    int row = warp * RW + r;
                    uint4 raw = *(const uint4 *)(st + (size_t)row * a.row_bytes + (size_t)ci * 16);
                    float p = xd_dot<IK>(raw, d) * c.dx;
                    acc[r] += fmaf(bf16f(ssc[row * L.ng + g]), p, bf16f(sbi[row * L.ng + g]) * c.sum);
                }
            } else {
                float4 xv[F];
#pragma unroll
                for (int q = 0; q < F; q++) xv[q] = xs4[q * nch + ci];
                float cs = Q ? csum[ci] : 0.0f;
                int g = Q ? (ci * E) >> a.gsh : 0;
#pragma unroll
                for (int r = 0; r < RW; r++) {
                    int row = warp * RW + r;
                    uint4 raw = *(const uint4 *)(st + (size_t)row * a.row_bytes + (size_t)ci * 16);
                    float p = g1_chunk_dot<KIND>(raw, xv);
                    acc[r] += Q ? fmaf(bf16f(ssc[row * L.ng + g]), p, bf16f(sbi[row * L.ng + g]) * cs) : p;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < RW; r++) {
            float v = warp_sum(acc[r]);
            int64_t row = r0 + warp * RW + r;
            if (lane == 0 && row < a.rows) a.y[row] = v;
        }
    }
    cp_wait<0>();
}

/* Rows per warp for a tile of ~GS_TILE_BYTES; 0 when the staged kernel does
 * not fit the matrix (odd group counts, stages too large). */
static int gs_rows_per_warp(int kind, const tern_mat *W) {
    size_t rb = kind_row_bytes(kind, W->cols);
    int quant = kind == KIND_Q4 || kind == KIND_Q8;
    if (quant && ((W->cols / W->group) % 2 || ((uintptr_t)W->scales | (uintptr_t)W->biases) % 4)) return 0;
    if (((uintptr_t)W->data) % 16) return 0;
    int rw = 1;
    while (rw < 8 && (size_t)G1_WARPS * rw * 2 * rb <= GS_TILE_BYTES) rw *= 2;
    if ((size_t)G1_WARPS * rw * rb > 2 * GS_TILE_BYTES) return 0;
    return rw;
}

template <int KIND, int RW, bool ID>
static cudaError_t gs_launch(const g1_args &a, cudaStream_t s) {
    constexpr int E = kind_traits<KIND>::E;
    gs_layout L = gs_layout_of(kind_traits<KIND>::QUANT, a.cols, a.gsh, a.row_bytes, G1_WARPS * RW);
    /* the input as floats, then per chunk its sum, or its digits (room for
     * q4's six uint4; q8 uses three) and dx / sum */
    size_t smem = GS_STAGES * L.stage + (size_t)a.cols * sizeof(float) +
                  (size_t)(a.cols / E) * (ID ? XD_VEC4 * 16 + sizeof(xd_chunk) : sizeof(float));
    static occ_cache cache;
    int occ = blocks_per_sm(cache, gemv1s_kernel<KIND, RW, ID>, smem);
    int64_t tiles = (a.rows + L.rt - 1) / L.rt, cap = (int64_t)g1_sms() * occ;
    int64_t blocks = tiles < cap ? tiles : cap;
    return launch_pdl(gemv1s_kernel<KIND, RW, ID>, dim3((unsigned)blocks), dim3(G1_THREADS), smem, s, a);
}

template <int KIND, bool ID = false>
static cudaError_t gs_pick(const g1_args &a, int rw, cudaStream_t s) {
    switch (rw) {
    case 1: return gs_launch<KIND, 1, ID>(a, s);
    case 2: return gs_launch<KIND, 2, ID>(a, s);
    case 4: return gs_launch<KIND, 4, ID>(a, s);
    default: return gs_launch<KIND, 8, ID>(a, s);
    }
}

/* ---- the tensor-core variant: q4/q8 in groups of 64 or 128 --------------
 * At 4 bits the CUDA-core kernels above are issue-bound (each weight costs
 * a PRMT, an FADD and an FFMA: a 16-byte chunk ~110 instructions; at full
 * bandwidth that is the whole issue rate). Here the integer tensor cores
 * take the products, exactly: the weights stay integers (q4 nibbles spread
 * to bytes with one AND or shift+AND per 4, q8 bytes as they are) as the A
 * operand of mma.m16n8k32 u8 x s8 -> s32, and the input becomes integers
 * too: per span of 64 values, x ~ dx * xi with dx = max|x| / 2^20 (|x -
 * dx xi| <= 0.56 dx, ~5e-7 of the span's largest value), xi cut into three
 * signed 7-bit digits xi = d2 2^14 + d1 2^7 + d0 that ride in three of the
 * eight columns of B, so one mma gives sum q d for all three digits. The
 * int32 sums are exact; per span and row, sum q x = dx (2^14 c2 + 2^7 c1 +
 * c0) in fp32, then scale * that + bias * sum(x) as before.
 * The k order inside an mma is free as long as A and B agree: a group of 4
 * lanes reads a row's 32 (q4) or 64 (q8) bytes of a span as one 8- or
 * 16-byte load each, and B's digits are laid out in shared memory in that
 * order. A block takes 16 rows; its 8 warps split the spans (K) and sum
 * their partial rows in shared memory at the end (fixed order). It runs
 * only under TERN_GEMV1=mma: the staged kernel with integer dots (dp4a on
 * the same digits) measured faster (q4 lm_head 78 against 112 us). */
#define GM_SPAN 64
#define GM_WARPS 8

__device__ __forceinline__ void mma_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Where value p (0..63) of a span sits in B: (mma j, lane column c,
 * register, byte), matching how the A side unpacks a lane's bytes. */
template <int KIND>
__device__ __forceinline__ int gm_digit_at(int sp, int p, int d) {
    int c, j, reg, byte;
    if (KIND == KIND_Q4) {   /* lane c: bytes 8c..8c+7 = words 2c, 2c+1; mma j: word 2c + j, low nibbles then high */
        int w8 = p >> 3, e = p & 7;
        c = w8 >> 1; j = w8 & 1; reg = e & 1; byte = e >> 1;
    } else {                 /* lane c: bytes 16c..16c+15; mma j: words 2j, 2j + 1 */
        c = p >> 4; j = (p >> 3) & 1; reg = (p >> 2) & 1; byte = p & 3;
    }
    return ((((sp * 2 + j) * 3 + d) * 4 + c) * 2 + reg) * 4 + byte;
}

/* The input (x + delta, norm) into xf, then per span its scale, sum and
 * digits. */
template <int KIND>
__device__ void gm_stage(const g1_args &a, float *xf, int8_t *xd, float *dxs, float *sums, float *red) {
    int n4 = a.cols / 4, tid = threadIdx.x;
    float4 v[G1_MAXV];
    g1_input(a, red, v);
#pragma unroll
    for (int k = 0; k < G1_MAXV; k++) {
        int i = tid + k * G1_THREADS;
        if (i < n4) ((float4 *)xf)[i] = v[k];
    }
    __syncthreads();
    int lane = tid & 31, nsp = a.cols / GM_SPAN;
    for (int sp = tid >> 5; sp < nsp; sp += G1_WARPS) {
        float x0 = xf[sp * GM_SPAN + 2 * lane], x1 = xf[sp * GM_SPAN + 2 * lane + 1];
        float m = warp_max(fmaxf(fabsf(x0), fabsf(x1)));
        float su = warp_sum(x0 + x1);
        float inv = m > 0.0f ? 1048576.0f / m : 0.0f;
        int xi[2] = {__float2int_rn(x0 * inv), __float2int_rn(x1 * inv)};
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int p = 2 * lane + e;
            xd[gm_digit_at<KIND>(sp, p, 0)] = (int8_t)(xi[e] & 127);
            xd[gm_digit_at<KIND>(sp, p, 1)] = (int8_t)((xi[e] >> 7) & 127);
            xd[gm_digit_at<KIND>(sp, p, 2)] = (int8_t)(xi[e] >> 14);
        }
        if (lane == 0) {
            dxs[sp] = m > 0.0f ? m * (1.0f / 1048576.0f) : 0.0f;
            sums[sp] = su;
        }
    }
    __syncthreads();
}

/* The weights come through shared memory as in the staged kernel (tiles
 * of 16 rows, GS_STAGES deep, cp.async): the registers of a lane hold no
 * weights while they are in flight, so ~100 KB per SM can be. Rows sit
 * GM_PAD bytes apart beyond their length so that the 8 rows a warp's lanes
 * read at once (32 bytes each) fall on different banks. */
#define GM_PAD 32

typedef struct {
    size_t rstride, dbytes, sbytes, stage;
    int ng;
} gm_layout;

__host__ __device__ static inline gm_layout gm_layout_of(int64_t cols, int gsh, size_t row_bytes) {
    gm_layout L;
    L.ng = (int)(cols >> gsh);
    L.rstride = row_bytes + GM_PAD;
    L.dbytes = 16 * L.rstride;
    L.sbytes = ((size_t)16 * L.ng * 2 + 15) / 16 * 16;
    L.stage = L.dbytes + 2 * L.sbytes;
    return L;
}

__device__ __forceinline__ void gm_issue(const g1_args &a, const gm_layout &L, int64_t t, uint8_t *stage) {
    int64_t r0 = t * 16;
    int nrow = (int)min((int64_t)16, a.rows - r0);
    int cpr = (int)(a.row_bytes / 16);
    const uint8_t *src = a.q + r0 * a.row_bytes;
    for (int i = threadIdx.x; i < nrow * cpr; i += G1_THREADS) {
        int r = i / cpr, col = i - r * cpr;
        cp_async16(stage + (size_t)r * L.rstride + (size_t)col * 16, src + (size_t)i * 16);
    }
    int n4 = nrow * L.ng / 2;   /* ng even: whole 4-byte pieces */
    const uint8_t *ss = (const uint8_t *)(a.sc + r0 * L.ng), *bb = (const uint8_t *)(a.bi + r0 * L.ng);
    for (int i = threadIdx.x; i < n4; i += G1_THREADS) {
        cp_async4(stage + L.dbytes + (size_t)i * 4, ss + (size_t)i * 4);
        cp_async4(stage + L.dbytes + L.sbytes + (size_t)i * 4, bb + (size_t)i * 4);
    }
}

template <int KIND>
__global__ void __launch_bounds__(G1_THREADS) gemv1m_kernel(g1_args a) {
    constexpr int LB = KIND == KIND_Q4 ? 8 : 16;   /* bytes of a span per lane per row */
    extern __shared__ float4 g1_smem[];
    __shared__ float red[G1_WARPS];
    __shared__ float part[2][GM_WARPS][16];
    gm_layout L = gm_layout_of(a.cols, a.gsh, a.row_bytes);
    int nsp = a.cols / GM_SPAN;
    uint8_t *stages = (uint8_t *)g1_smem;
    float *xf = (float *)(stages + GS_STAGES * L.stage), *dxs = xf + a.cols, *sums = dxs + nsp;
    int8_t *xd = (int8_t *)(sums + nsp);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int64_t ntile = (a.rows + 15) / 16;

    pdl_trigger();
#pragma unroll
    for (int k = 0; k < GS_STAGES - 1; k++) {   /* weights only: before the wait */
        int64_t t = blockIdx.x + (int64_t)k * gridDim.x;
        if (t < ntile) gm_issue(a, L, t, stages + k * L.stage);
        cp_commit();
    }
    pdl_wait();
    gm_stage<KIND>(a, xf, xd, dxs, sums, red);
    const uint2 *xd2 = (const uint2 *)xd;

    int64_t prev = -1;   /* the tile whose partial rows wait in part[] */
    int k = 0;
    for (;; k++) {
        int64_t t = blockIdx.x + (int64_t)k * gridDim.x;
        if (t >= ntile) break;
        cp_wait<GS_STAGES - 2>();
        __syncthreads();   /* tile t landed for everyone; stage k - 1 and part[(k - 1) & 1] are complete */
        if (prev >= 0 && threadIdx.x < 16) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < GM_WARPS; w++) v += part[(k - 1) & 1][w][threadIdx.x];
            int64_t row = prev * 16 + threadIdx.x;
            if (row < a.rows) a.y[row] = v;
        }
        int64_t tn = t + (int64_t)(GS_STAGES - 1) * gridDim.x;
        if (tn < ntile) gm_issue(a, L, tn, stages + ((k + GS_STAGES - 1) % GS_STAGES) * L.stage);
        cp_commit();
        const uint8_t *st = stages + (k % GS_STAGES) * L.stage;
        const uint16_t *ssc = (const uint16_t *)(st + L.dbytes), *sbi = (const uint16_t *)(st + L.dbytes + L.sbytes);
        const uint8_t *rowg = st + (size_t)g * L.rstride + c * LB, *rowg8 = rowg + 8 * L.rstride;
        float acc0 = 0.0f, acc8 = 0.0f;
        for (int sp = warp; sp < nsp; sp += GM_WARPS) {
            int cc[4] = {0, 0, 0, 0};
            uint4 r0, r8;
            if (KIND == KIND_Q4) {
                uint2 u0 = *(const uint2 *)(rowg + sp * 32), u8 = *(const uint2 *)(rowg8 + sp * 32);
                r0 = make_uint4(u0.x, u0.y, 0, 0);
                r8 = make_uint4(u8.x, u8.y, 0, 0);
            } else {
                r0 = *(const uint4 *)(rowg + sp * 64);
                r8 = *(const uint4 *)(rowg8 + sp * 64);
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                uint32_t a0, a1, a2, a3;
                if (KIND == KIND_Q4) {
                    uint32_t w0 = j ? r0.y : r0.x, w8 = j ? r8.y : r8.x;
                    a0 = w0 & 0x0f0f0f0fu; a2 = (w0 >> 4) & 0x0f0f0f0fu;
                    a1 = w8 & 0x0f0f0f0fu; a3 = (w8 >> 4) & 0x0f0f0f0fu;
                } else {
                    a0 = j ? r0.z : r0.x; a2 = j ? r0.w : r0.y;
                    a1 = j ? r8.z : r8.x; a3 = j ? r8.w : r8.y;
                }
                uint2 b = g < 3 ? xd2[((sp * 2 + j) * 3 + g) * 4 + c] : make_uint2(0, 0);
                mma_u8s8(cc, a0, a1, a2, a3, b.x, b.y);
            }
            /* lane 4g: columns 0, 1 (digits 0, 1); lane 4g + 1: column 2 (digit 2) */
            int d2 = __shfl_sync(0xffffffffu, cc[0], lane | 1), d2_8 = __shfl_sync(0xffffffffu, cc[2], lane | 1);
            if (c == 0) {
                int grp = (sp * GM_SPAN) >> a.gsh;
                float dx = dxs[sp], sx = sums[sp];
                float v0 = (float)d2 * 16384.0f + (float)cc[1] * 128.0f + (float)cc[0];
                float v8 = (float)d2_8 * 16384.0f + (float)cc[3] * 128.0f + (float)cc[2];
                acc0 += fmaf(bf16f(ssc[g * L.ng + grp]), dx * v0, bf16f(sbi[g * L.ng + grp]) * sx);
                acc8 += fmaf(bf16f(ssc[(g + 8) * L.ng + grp]), dx * v8, bf16f(sbi[(g + 8) * L.ng + grp]) * sx);
            }
        }
        if (c == 0) {
            part[k & 1][warp][g] = acc0;
            part[k & 1][warp][g + 8] = acc8;
        }
        prev = t;
    }
    cp_wait<0>();
    __syncthreads();
    if (prev >= 0 && threadIdx.x < 16) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < GM_WARPS; w++) v += part[(k - 1) & 1][w][threadIdx.x];
        int64_t row = prev * 16 + threadIdx.x;
        if (row < a.rows) a.y[row] = v;
    }
}

static size_t gm_smem(int64_t cols, int gsh, size_t row_bytes) {
    gm_layout L = gm_layout_of(cols, gsh, row_bytes);
    int64_t nsp = cols / GM_SPAN;
    return GS_STAGES * L.stage + (size_t)cols * sizeof(float) + 2 * (size_t)nsp * sizeof(float) + (size_t)nsp * 192;
}

static int gm_fits(int kind, const tern_mat *W) {
    if ((kind != KIND_Q4 && kind != KIND_Q8) || (W->group != 64 && W->group != 128) || W->cols % GM_SPAN) return 0;
    if (((uintptr_t)W->data % 16) || ((uintptr_t)W->scales | (uintptr_t)W->biases) % 4) return 0;
    return gm_smem(W->cols, log2i(W->group), kind_row_bytes(kind, W->cols)) <= 200 * 1024;
}

template <int KIND>
static cudaError_t gm_launch(const g1_args &a, cudaStream_t s) {
    size_t smem = gm_smem(a.cols, a.gsh, a.row_bytes);
    static occ_cache cache;
    int occ = blocks_per_sm(cache, gemv1m_kernel<KIND>, smem);
    int64_t ntile = (a.rows + 15) / 16, cap = (int64_t)g1_sms() * occ;
    int64_t blocks = ntile < cap ? ntile : cap;
    return launch_pdl(gemv1m_kernel<KIND>, dim3((unsigned)blocks), dim3(G1_THREADS), smem, s, a);
}

int tern_cuda_gemv1_supported(const tern_mat *W) {
    int kind = mat_kind(W);
    if (kind < 0 || W->rows < 1 || W->cols < 1 || W->cols > 8192 || W->cols % 4) return 0;
    if ((kind == KIND_Q4 || kind == KIND_Q8) && W->group != 32 && W->group != 64 && W->group != 128) return 0;
    int64_t E = kind == KIND_Q4 ? 32 : kind == KIND_Q8 ? 16 : 8;   /* a chunk: 16 bytes, within one group */
    return W->cols % E == 0 && (kind == KIND_BF16 || kind == KIND_F16 || W->cols % W->group == 0);
}

static int g1_sms(void) {
    static int n = 0;
    if (!n) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        if (n < 1) n = 1;
    }
    return n;
}

template <int KIND, int R, int U>
static cudaError_t g1_launch(const g1_args &a, cudaStream_t s) {
    constexpr int E = kind_traits<KIND>::E;
    size_t smem = (size_t)a.cols * sizeof(float) + (size_t)(a.cols / E) * sizeof(float);
    static occ_cache cache;
    int64_t ngrp = (a.rows + R - 1) / R, cap = (int64_t)g1_sms() * blocks_per_sm(cache, gemv1_kernel<KIND, R, U>, smem);
    int64_t blocks = (ngrp + G1_WARPS - 1) / G1_WARPS;
    if (blocks > cap) blocks = cap;
    return launch_pdl(gemv1_kernel<KIND, R, U>, dim3((unsigned)blocks), dim3(G1_THREADS), smem, s, a);
}

template <int KIND>
static cudaError_t g1_pick(const g1_args &a, cudaStream_t s) {
    int cpl = (a.cols / kind_traits<KIND>::E + 31) / 32;   /* chunks per lane per row */
    if (cpl == 1) return g1_launch<KIND, 4, 1>(a, s);
    if (cpl == 2) return g1_launch<KIND, 2, 2>(a, s);
    if (cpl % 4 == 0) return g1_launch<KIND, 1, 4>(a, s);
    return g1_launch<KIND, 1, 1>(a, s);
}

/* TERN_GEMV1, read once per process like the other debugging switches. */
enum { FORCE_NONE, FORCE_REGS, FORCE_STAGED, FORCE_MMA, FORCE_INT };
static int gemv1_forced(void) {
    static int f = -1;
    if (f < 0) {
        const char *v = getenv("TERN_GEMV1");
        f = !v                         ? FORCE_NONE
            : !strcmp(v, "regs")       ? FORCE_REGS
            : !strcmp(v, "staged")     ? FORCE_STAGED
            : !strcmp(v, "mma")        ? FORCE_MMA
            : !strcmp(v, "int")        ? FORCE_INT
                                       : FORCE_NONE;
    }
    return f;
}

static int gemv1(const tern_mat *W, const tern_cuda_vec_in *in, const tern_cuda_route_out *route, float *y,
                 tern_stream s, tern_error *err) {
    if (!tern_cuda_gemv1_supported(W))
        return tern_fail(err, "gemv1: unsupported matrix (bits %d, dtype %d, %lldx%lld, group %d)", W->bits, W->dtype,
                         (long long)W->rows, (long long)W->cols, W->group);
    if (!in || !in->x) return tern_fail(err, "gemv1: no input");
    if (in->delta && !in->x_out) return tern_fail(err, "gemv1: a residual needs x_out");
    if (in->x_out && (in->x_out == in->x || in->x_out == in->delta))
        return tern_fail(err, "gemv1: x_out must not be an input (other blocks still read it)");
    int kind = mat_kind(W);
    g1_args a = {(const uint8_t *)W->data, W->scales, W->biases, W->rows, (int)W->cols,
                 kind == KIND_Q4 || kind == KIND_Q8 ? log2i(W->group) : 0,
                 kind_row_bytes(kind, W->cols), *in, y, {}};
    if (route) a.route = *route;
    cudaStream_t st = (cudaStream_t)s;
    /* Which kernel (measured on the H200, docs/CUDA.md "third round"):
     * below ~8 MB of weights the register tiles (all of a lane's loads
     * issued at once, one wave); above, the staged kernel (weights through
     * shared memory, cp.async), at 4 bits with the input as digits and
     * integer dots (idot.cuh). TERN_GEMV1=regs|staged|int|mma forces one
     * where it fits (for comparisons; mma: the tensor-core kernel); the
     * fused router takes the register tiles. */
    int forced = gemv1_forced();
    size_t bytes = (size_t)W->rows * kind_row_bytes(kind, W->cols);
    int big = bytes >= ((size_t)8 << 20);
    int regs = route || (forced ? forced == FORCE_REGS : !big);
    if (!regs && forced == FORCE_MMA && gm_fits(kind, W)) {
        cudaError_t e = kind == KIND_Q4 ? gm_launch<KIND_Q4>(a, st) : gm_launch<KIND_Q8>(a, st);
        if (e != cudaSuccess) return tern_fail(err, "gemv1: %s", cudaGetErrorString(e));
        return launch_check("gemv1", err);
    }
    int rw = regs ? 0 : gs_rows_per_warp(kind, W);
    /* q8 takes the integer dots only for the largest matrices (the lm_head:
     * 160 -> 133 us); on the 9-27 MB ones they measured slower (docs/CUDA.md) */
    int huge = bytes >= ((size_t)64 << 20);
    int ints = rw && (kind == KIND_Q4 || (kind == KIND_Q8 && (huge || forced == FORCE_INT))) &&
               W->cols % XD_SPAN == 0 && forced != FORCE_STAGED;
    cudaError_t e = ints ? (kind == KIND_Q4 ? gs_pick<KIND_Q4, true>(a, rw, st) : gs_pick<KIND_Q8, true>(a, rw, st))
                  : rw ? (kind == KIND_Q4   ? gs_pick<KIND_Q4>(a, rw, st)
                          : kind == KIND_Q8 ? gs_pick<KIND_Q8>(a, rw, st)
                          : kind == KIND_BF16 ? gs_pick<KIND_BF16>(a, rw, st)
                                              : gs_pick<KIND_F16>(a, rw, st))
                  : kind == KIND_Q4   ? g1_pick<KIND_Q4>(a, st)
                    : kind == KIND_Q8 ? g1_pick<KIND_Q8>(a, st)
                    : kind == KIND_BF16 ? g1_pick<KIND_BF16>(a, st)
                                        : g1_pick<KIND_F16>(a, st);
    if (e != cudaSuccess) return tern_fail(err, "gemv1: %s", cudaGetErrorString(e));
    return launch_check("gemv1", err);
}

int tern_cuda_gemv1(const tern_mat *W, const tern_cuda_vec_in *in, float *y, tern_stream s, tern_error *err) {
    return gemv1(W, in, NULL, y, s, err);
}

int tern_cuda_gemv1_route(const tern_mat *W, const tern_cuda_vec_in *in, float *logits,
                          const tern_cuda_route_out *route, tern_stream s, tern_error *err) {
    if (!route || !route->counter || !route->ids || !route->wts)
        return tern_fail(err, "gemv1_route: no counter or outputs");
    if (route->n_experts != W->rows || route->n_experts > 256 || route->top_k < 1 || route->top_k > 32 ||
        route->top_k > route->n_experts)
        return tern_fail(err, "gemv1_route: %d experts, top %d for a %lldx%lld router", route->n_experts,
                         route->top_k, (long long)W->rows, (long long)W->cols);
    return gemv1(W, in, route, logits, s, err);
}
