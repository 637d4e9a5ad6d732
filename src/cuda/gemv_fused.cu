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
 *   - the successor (a PDL launch) may launch once this kernel's input is
 *     built: launched at the start, its weight requests queued ahead of
 *     this kernel's input reads;
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

#include "cuda/common.cuh"
#include "cuda/idot.cuh"
#include "cuda/route.cuh"
#include "cuda/trace.cuh"

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
 * (common.cuh's grid_last_block on a counter it leaves zero) routes the
 * logits y[0..E) with tern_cuda_route's code (route.cuh), E <= 256 (8
 * logits a lane: more would cost every GEMV variant registers). */
__device__ __forceinline__ void g1_route(const g1_args &a) {
    route_row<8>(a.y, a.route.n_experts, a.route.top_k, a.route.renorm, a.route.ids, a.route.wts);
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

#define GS_STAGES 3
#define GS_TILE_BYTES 16384

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
    for (int i = threadIdx.x; i < n16; i += G1_THREADS) cp_async<16>(stage + (size_t)i * 16, src + (size_t)i * 16);
    if (kind_traits<KIND>::QUANT) {
        int n4 = nrow * L.ng / 2;   /* ng is even here: whole 4-byte pieces */
        const uint8_t *ss = (const uint8_t *)(a.sc + r0 * L.ng), *bb = (const uint8_t *)(a.bi + r0 * L.ng);
        for (int i = threadIdx.x; i < n4; i += G1_THREADS) {
            cp_async<4>(stage + L.dbytes + (size_t)i * 4, ss + (size_t)i * 4);
            cp_async<4>(stage + L.dbytes + L.sbytes + (size_t)i * 4, bb + (size_t)i * 4);
        }
    }
}

/* The staged kernel's first GS_STAGES - 1 tiles, requested in g1_input
 * once the input's loads are issued: a load issued behind a block's tile
 * requests waits for them (docs/experiments/cuda-gemv.md). */
template <int KIND>
__device__ __forceinline__ void gs_issue_post(const g1_args &a, const gs_layout &L, uint8_t *stages, int64_t tiles) {
#pragma unroll 1
    for (int k = 0; k < GS_STAGES - 1; k++) {
        int64_t t = blockIdx.x + (int64_t)k * gridDim.x;
        if (t < tiles) gs_issue<KIND>(a, L, t, stages + k * L.stage);
        cp_async_commit();
    }
}

/* What a kernel requests in g1_input once the input's loads are issued
 * (so they go ahead of it): a callable, by default nothing. */
struct g1_no_post {
    __device__ void operator()() const {}
};

/* The input, made by every block in registers (float4 k of a thread is
 * element tid + k * G1_THREADS): x (+ delta, which block 0 writes to
 * x_out), then the RMSNorm when asked (block 0 keeps the result in
 * xn_out). Shared by the three kernels, which then lay it out their way. */
template <int WG, typename POST = g1_no_post>
__device__ __forceinline__ void g1_input(const g1_args &a, float *red, float4 (&v)[G1_MAXV], const float4 *wsm,
                                         unsigned long long *tm,   /* tm: the trace's marks (a measurement build) */
                                         const POST &post = POST()) {
    const tern_cuda_vec_in &in = a.in;
    int n4 = a.cols / 4, tid = threadIdx.x;
    bool first = blockIdx.x == 0;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < G1_MAXV; k++) {
        int i = tid + k * G1_THREADS;
        if (i < n4) {
            v[k] = ((const float4 *)in.x)[i];
            if (in.delta || in.delta_fx) {
                float4 d = in.delta_fx ? dfx_load4(in.delta_fx, i) : ((const float4 *)in.delta)[i];
                v[k].x += d.x; v[k].y += d.y; v[k].z += d.z; v[k].w += d.w;
                if (first && in.x_out) ((float4 *)in.x_out)[i] = v[k];
            }
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
    }
    post();   /* (the input's loads are issued: what it requests queues behind them) */
    TRACE_MARK_AFTER(tm, 5, ss);   /* this thread's x (+ delta) in */
    float r = 1.0f;
    if (in.norm_w) {
        if (wsm) cp_async_wait<WG>();   /* this thread's copies of the norm weights; the sum's barrier: everyone's */
        r = 1.0f / sqrtf(g1_block_sum(ss, red) / (float)a.cols + in.eps);
    }
    TRACE_MARK_AFTER(tm, 6, r);   /* the norm's sum of squares in */
#pragma unroll
    for (int k = 0; k < G1_MAXV; k++) {
        int i = tid + k * G1_THREADS;
        if (i < n4) {
            if (in.norm_w) v[k] = rms_apply4(v[k], wsm ? wsm[i] : ((const float4 *)in.norm_w)[i], r, in.one_plus);
            if (first && in.xn_out) ((float4 *)in.xn_out)[i] = v[k];
        }
    }
}

/* The norm's weights are constant: requested into shared memory before
 * the wait, as a commit group of their own, so that the norm does not wait
 * a DRAM round trip after the input arrives (they were read after the
 * block's sum of squares; docs/experiments/cuda-step-timeline.md). They land where the
 * input will go (xs4): in g1_input each thread reads the entries it later
 * writes, and the permuted layout of g1_stage writes after a barrier. */
__device__ __forceinline__ const float4 *g1_norm_prefetch(const g1_args &a, float4 *xs4) {
    if (!a.in.norm_w) return NULL;
    for (int i = threadIdx.x; i < a.cols / 4; i += G1_THREADS) cp_async<16>(xs4 + i, (const float4 *)a.in.norm_w + i);
    cp_async_commit();
    return xs4;
}

/* The input into shared memory (permuted, see the header) and, for
 * quantized kinds, each chunk's sum. */
template <int KIND, int WG, typename POST = g1_no_post>
__device__ void g1_stage(const g1_args &a, float4 *xs4, float *csum, float *red, const float4 *wsm,
                         unsigned long long *tm, const POST &post = POST()) {
    constexpr int E = kind_traits<KIND>::E, F = E / 4;
    int n4 = a.cols / 4, nch = a.cols / E, tid = threadIdx.x;
    float4 v[G1_MAXV];
    g1_input<WG>(a, red, v, wsm, tm, post);
    if (wsm) __syncthreads();   /* every thread has read its norm weights from where the input goes */
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

    TRACE_DECL;
    TRACE_MARK(0);
    g1_tile<R, U> cur;
    const float4 *wsm = g1_norm_prefetch(a, xs4);
    if (tiles) g1_load<KIND, R, U>(a, gw, 0, lane, cur);
    TRACE_MARK(1);
    pdl_wait();   /* the input is the previous kernel's output */
    TRACE_MARK(2);
    g1_stage<KIND, 0>(a, xs4, csum, red, wsm, TRACE_PTR);
    pdl_trigger();
    TRACE_MARK(3);

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
    TRACE_MARK(4);
    if (a.route.counter) {
        const bool last = grid_last_block(a.route.counter);
        TRACE_MARK(5);
        if (last && threadIdx.x < 32) g1_route(a);
        TRACE_MARK(6);
        TRACE_END(TRACE_GEMV1_ROUTE, last ? 1u : 0u);
        return;
    }
    TRACE_END(TRACE_GEMV1, (unsigned)a.rows);
}

/* ---- the staged variant: weights through shared memory -------------------
 * The register tiles above keep at most two tiles per lane in flight, and
 * registers bound the warps per SM, which leaves a large projection well
 * below the read rate (docs/experiments/cuda-gemv.md). Here a block's tile of RT = 8 x RW whole rows (~16 KB
 * with their scales and biases) is copied into shared memory with
 * cp.async (no registers held while in flight), GS_STAGES tiles deep: the
 * first GS_STAGES - 1 are requested as soon as the input's loads are issued,
 * each later one as soon as a stage frees. Rows are contiguous, so a tile
 * is one contiguous range. Warps then read their RW rows from shared memory
 * (32 lanes, 32 consecutive 16-byte chunks: no bank conflicts). With ID the
 * products are integer dots on the input's digits (idot.cuh): q4 always,
 * q8 for the largest matrices (gemv1 below). */
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

    TRACE_DECL;
    TRACE_MARK(0);
    const float4 *wsm = g1_norm_prefetch(a, xs4);   /* its group precedes the stages' */
    TRACE_MARK(1);
    pdl_wait();
    TRACE_MARK(2);
    auto post = [&]() { gs_issue_post<KIND>(a, L, stages, tiles); };   /* the first GS_STAGES - 1 tiles */
    if (ID) {
        float4 v[G1_MAXV];
        g1_input<GS_STAGES - 1>(a, red, v, wsm, TRACE_PTR, post);
#pragma unroll
        for (int k = 0; k < G1_MAXV; k++) {
            int i = threadIdx.x + k * G1_THREADS;
            if (i < a.cols / 4) xs4[i] = v[k];
        }
        __syncthreads();
        xd_build_wide<KIND == KIND_Q8 ? KIND_Q8 : KIND_Q4>((const float *)xs4, a.cols, xd, cx, G1_WARPS);
        __syncthreads();
    } else {
        g1_stage<KIND, GS_STAGES - 1>(a, xs4, csum, red, wsm, TRACE_PTR, post);
    }
    pdl_trigger();
    TRACE_MARK(3);

    for (int k = 0;; k++) {
        int64_t t = blockIdx.x + (int64_t)k * gridDim.x;
        if (t >= tiles) break;
        cp_async_wait<GS_STAGES - 2>();   /* this thread's copies of tile t have landed */
        __syncthreads();            /* and everyone's; stage (k - 1) is free again */
        if (k == 0) TRACE_MARK(4);
        int64_t tn = t + (int64_t)(GS_STAGES - 1) * gridDim.x;
        if (tn < tiles) gs_issue<KIND>(a, L, tn, stages + ((k + GS_STAGES - 1) % GS_STAGES) * L.stage);
        cp_async_commit();
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
    cp_async_wait<0>();
    TRACE_END(TRACE_GEMV1S, (unsigned)a.rows);
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
    /* the input as floats, then per chunk its sum, or its digits and dx / sum */
    size_t smem = GS_STAGES * L.stage +
                  (ID ? xd_smem_bytes(a.cols, E) : (size_t)a.cols * sizeof(float) + (size_t)(a.cols / E) * sizeof(float));
    static occ_cache cache;
    int occ = blocks_per_sm(cache, gemv1s_kernel<KIND, RW, ID>, G1_THREADS, smem);
    int64_t tiles = (a.rows + L.rt - 1) / L.rt, cap = (int64_t)tern_cuda_sm_count() * occ;
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

int tern_cuda_gemv1_supported(const tern_mat *W) {
    int kind = mat_kind(W);
    if (kind < 0 || W->rows < 1 || W->cols < 1 || W->cols > 8192 || W->cols % 4) return 0;
    if ((kind == KIND_Q4 || kind == KIND_Q8) && W->group != 32 && W->group != 64 && W->group != 128) return 0;
    int64_t E = kind == KIND_Q4 ? 32 : kind == KIND_Q8 ? 16 : 8;   /* a chunk: 16 bytes, within one group */
    return W->cols % E == 0 && (kind == KIND_BF16 || kind == KIND_F16 || W->cols % W->group == 0);
}

/* The register-tile kernel's grid for a's shape: a row group per warp, at
 * most the resident blocks (the warps then walk the groups); *smem its
 * dynamic shared memory: the input as floats and its chunk sums. */
template <int KIND, int R, int U>
static int64_t g1_grid(const g1_args &a, size_t *smem) {
    constexpr int E = kind_traits<KIND>::E;
    const size_t nch = (size_t)(a.cols / E);
    *smem = ((size_t)a.cols + nch) * sizeof(float);
    static occ_cache cache;
    int64_t ngrp = (a.rows + R - 1) / R,
            cap = (int64_t)tern_cuda_sm_count() * blocks_per_sm(cache, gemv1_kernel<KIND, R, U>, G1_THREADS, *smem);
    int64_t blocks = (ngrp + G1_WARPS - 1) / G1_WARPS;
    return blocks < cap ? blocks : cap;
}

template <int KIND, int R, int U>
static cudaError_t g1_launch(const g1_args &a, cudaStream_t s) {
    size_t smem = 0;
    const int64_t blocks = g1_grid<KIND, R, U>(a, &smem);
    return launch_pdl(gemv1_kernel<KIND, R, U>, dim3((unsigned)blocks), dim3(G1_THREADS), smem, s, a);
}

/* The tile of a lane by the row's chunks per lane: 4 rows x 1 chunk, 2 x 2,
 * 1 x 4, or 1 x 1. */
enum { G1_T41, G1_T22, G1_T14, G1_T11 };
static int g1_shape(int64_t cols, int E) {
    const int64_t cpl = (cols / E + 31) / 32;   /* chunks per lane per row */
    return cpl == 1 ? G1_T41 : cpl == 2 ? G1_T22 : cpl % 4 == 0 ? G1_T14 : G1_T11;
}

template <int KIND>
static cudaError_t g1_pick(const g1_args &a, cudaStream_t s) {
    switch (g1_shape(a.cols, kind_traits<KIND>::E)) {
    case G1_T41: return g1_launch<KIND, 4, 1>(a, s);
    case G1_T22: return g1_launch<KIND, 2, 2>(a, s);
    case G1_T14: return g1_launch<KIND, 1, 4>(a, s);
    default: return g1_launch<KIND, 1, 1>(a, s);
    }
}

static int gemv1(const tern_mat *W, const tern_cuda_vec_in *in, const tern_cuda_route_out *route, float *y,
                 tern_stream s, tern_error *err) {
    if (!tern_cuda_gemv1_supported(W))
        return tern_fail(err, "gemv1: unsupported matrix (bits %d, dtype %d, %lldx%lld, group %d)", W->bits, W->dtype,
                         (long long)W->rows, (long long)W->cols, W->group);
    if (!in || !in->x) return tern_fail(err, "gemv1: no input");
    if (in->delta && in->delta_fx) return tern_fail(err, "gemv1: a residual as floats or as fixed point, not both");
    if ((in->delta || in->delta_fx) && !in->x_out) return tern_fail(err, "gemv1: a residual needs x_out");
    if (in->delta_fx && ((uintptr_t)in->delta_fx & 15)) return tern_fail(err, "gemv1: fixed-point residual not 16-byte aligned");
    if (in->x_out && (in->x_out == in->x || in->x_out == in->delta || (const void *)in->x_out == (const void *)in->delta_fx))
        return tern_fail(err, "gemv1: x_out must not be an input (other blocks still read it)");
    int kind = mat_kind(W);
    g1_args a = {(const uint8_t *)W->data, W->scales, W->biases, W->rows, (int)W->cols,
                 kind == KIND_Q4 || kind == KIND_Q8 ? log2i(W->group) : 0,
                 kind_row_bytes(kind, W->cols), *in, y, {}};
    if (route) a.route = *route;
    cudaStream_t st = (cudaStream_t)s;
    /* Which kernel (measured: docs/experiments/cuda-gemv.md): below
     * ~8 MB of weights the register tiles (all of a lane's loads issued at
     * once, one wave); above, the staged kernel (weights through shared
     * memory, cp.async), at 4 bits with the input as digits and integer dots
     * (idot.cuh); the fused router takes the register tiles. */
    size_t bytes = (size_t)W->rows * kind_row_bytes(kind, W->cols);
    int regs = route || bytes < ((size_t)8 << 20);
    int rw = regs ? 0 : gs_rows_per_warp(kind, W);
    /* q8 takes the integer dots only for the largest matrices (the lm_head);
     * on the 9-27 MB ones they measured slower (docs/experiments/cuda-gemv.md) */
    int huge = bytes >= ((size_t)64 << 20);
    int ints = rw && (kind == KIND_Q4 || (kind == KIND_Q8 && huge)) && W->cols % XD_SPAN == 0;
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

TRACE_DUMP_FN(tern_cuda_trace_dump_gemv_fused)
