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
 *     this kernel's input reads (docs/PERFORMANCE.md step 38;
 *     TERN_CUDA_TRIGGER_LATE=0 triggers at the start again);
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
    int norm_pre;                /* the norm's weights requested before the wait (TERN_GEMV1_NORM_PRE=0: not) */
    int late;                    /* the successor may launch once the input is built, not at the start */
    int pre;                     /* staged: tiles requested before the wait (TERN_GEMV1_PRE, 0 .. GS_STAGES - 1) */
    /* tern_cuda_gemv1_lin: h = x_res + y and its blocks' sums of squares,
     * and the router's linear part u beside the rows */
    tern_cuda_lin_out lin;
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

/* The staged kernel's tiles pre .. GS_STAGES - 2 (the first pre before
 * the wait), requested in g1_input once the input's loads are issued: a
 * load issued behind a block's tile requests waits for them (measured: x
 * in 2.75 us after the release instead of 0.80 once the experts' launch
 * ended sooner, docs/PERFORMANCE.md step 60). */
template <int KIND>
__device__ __forceinline__ void gs_issue_post(const g1_args &a, const gs_layout &L, uint8_t *stages, int64_t tiles) {
#pragma unroll 1
    for (int k = a.pre; k < GS_STAGES - 1; k++) {
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
 * block's sum of squares; docs/PERFORMANCE.md step 37). They land where the
 * input will go (xs4): in g1_input each thread reads the entries it later
 * writes, and the permuted layout of g1_stage writes after a barrier. */
__device__ __forceinline__ const float4 *g1_norm_prefetch(const g1_args &a, float4 *xs4) {
    if (!a.in.norm_w || !a.norm_pre) return NULL;
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

/* ---- the router's linear part beside the output projection (LIN) -------
 * The router's input is RMSNorm(x_res + W_o a) and RMSNorm is a scalar
 * times (1 + w) elementwise, so its logits are r * u with
 *   u = [M | N] [a | x_res],  N = W_r diag(1 + w),  M = N W_o
 * (tern_cuda_router_lin_build) and r = 1 / sqrt(mean(h^2) + eps). u needs
 * only the projection's input, not its output, so the projection's blocks
 * compute it beside their rows and the experts' launch takes the top k of
 * u (r > 0 does not change the order) and r from the sums of squares the
 * blocks leave: the router's launch drops out of the chain. Block b takes
 * rows b, b + grid, ... of u, thread t float4 t, t + G1_THREADS, ... of a
 * row, whose first LIN_V are requested with the block's first weights,
 * before the wait ([M | N] is constant): every block carries an equal share
 * of u's bytes (u rows in blocks of their own, 96 KB each in two round
 * trips, measured slower: docs/PERFORMANCE.md step 50). */
#define LIN_V 8   /* (cols + rows) / 4 <= LIN_V * G1_THREADS float4 a row: 8192 floats */

/* ---- the router's products accumulated beside the output projection
 * (LIN 2, tern_cuda_gemv1_lin with rx) ----------------------------------
 * u = N h, N = W_r diag(1 + w), is a sum over h's rows, and each block of
 * the projection makes RB = G1_WARPS * R of them (the grid uncapped: one
 * row group a warp, block b rows [b RB, b RB + RB)). So after its rows the
 * block adds N[:, its rows] h[its rows] into u itself: its slice of N
 * (rx, [blocks][n_e][RB] fp32, tern_cuda_router_rx_build) is copied into
 * shared memory before the wait, and each of its partial sums goes into
 * u_fx as a 64-bit fixed-point integer (u * 2^TERN_CUDA_UFX_SHIFT, one
 * 128-byte line an entry). Integer adds commute, so u does not depend on
 * the order the blocks finish in (float atomics would); the experts' launch
 * reads it, routes, and zeroes it for the next layer. No [M | N] (6.3 MB a
 * layer) and no u rows in the blocks' chain (step 50's form), only
 * n_e x RB products and one atomic a thread at the end. */
__device__ __forceinline__ void g1_rx_fetch(const g1_args &a, int rb, float *rx_s) {
    const int n4 = a.lin.n_e * rb / 4;
    const float4 *src = (const float4 *)(a.lin.rx + (size_t)blockIdx.x * (size_t)n4 * 4);
    for (int i = threadIdx.x; i < n4; i += G1_THREADS) cp_async<16>((float4 *)rx_s + i, src + i);
    cp_async_commit();
}

/* (1 a fixed-point unit: |u| below 2^31 fits; past it the entry saturates) */
__device__ __forceinline__ unsigned long long ufx_of(float v) {
    const float lim = 9.2e18f, s = v * (float)(1ull << TERN_CUDA_UFX_SHIFT);
    return (unsigned long long)__float2ll_rn(fminf(fmaxf(s, -lim), lim));
}

/* after the block's h rows are in hs (a barrier): thread e's partial sums
 * of u, RB products each in row order */
__device__ __forceinline__ void g1_rx_add(const g1_args &a, int rb, const float *rx_s, const float *hs) {
    for (int e = threadIdx.x; e < a.lin.n_e; e += G1_THREADS) {
        const float *w = rx_s + (size_t)e * rb;
        float acc = 0.0f;
        for (int i = 0; i < rb; i++) acc = fmaf(w[i], hs[i], acc);
        asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(a.lin.u_fx + (size_t)e * TERN_CUDA_UFX_STRIDE),
                     "l"(ufx_of(acc))
                     : "memory");
    }
}

__device__ __forceinline__ void g1_lin_fetch(const g1_args &a, int e, float4 (&w)[LIN_V]) {
    const int C4 = (a.cols + (int)a.rows) / 4;
    const float4 *m4 = (const float4 *)(a.lin.ru + (size_t)e * (size_t)C4 * 4);
#pragma unroll
    for (int j = 0; j < LIN_V; j++) {
        const int f = threadIdx.x + G1_THREADS * j;
        w[j] = e < a.lin.n_e && f < C4 ? __ldcs(m4 + f) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* u[e] from the row's weights w, the block's input a in xs4 (permuted:
 * float4 q of chunk c at [q * nch + c], F float4 a chunk) and x_res. */
template <int F>
__device__ __forceinline__ void g1_lin_row(const g1_args &a, int e, const float4 (&w)[LIN_V], const float4 *xs4,
                                           int nch, const float *xres_s, float *red) {
    const int C4 = (a.cols + (int)a.rows) / 4, A4 = a.cols / 4;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < LIN_V; j++) {
        const int f = threadIdx.x + G1_THREADS * j;
        if (f >= C4) break;
        const float4 v = f < A4 ? xs4[(f % F) * nch + f / F] : ((const float4 *)xres_s)[f - A4];
        acc = fmaf(w[j].x, v.x, acc);
        acc = fmaf(w[j].y, v.y, acc);
        acc = fmaf(w[j].z, v.z, acc);
        acc = fmaf(w[j].w, v.w, acc);
    }
    const float t = g1_block_sum(acc, red);
    if (threadIdx.x == 0 && e < a.lin.n_e) a.lin.u[e] = t;
    __syncthreads();   /* red is free again */
}

/* LIN: 0 none, 1 the u rows from [M | N] (tern_cuda_gemv1_lin with ru),
 * 2 the router's products accumulated (with rx) */
template <int KIND, int R, int U, int LIN = 0>
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
    if (!a.late) pdl_trigger();
    g1_tile<R, U> cur;
    const float4 *wsm = g1_norm_prefetch(a, xs4);
    if (tiles) g1_load<KIND, R, U>(a, gw, 0, lane, cur);
    constexpr int RB = G1_WARPS * R;            /* LIN 2: the block's rows */
    float4 uw[LIN == 1 ? LIN_V : 1];
    float *xres_s = csum + ((nch + 3) & ~3);   /* LIN 1: x_res (16-byte aligned), copied in while the input is built */
    float *rx_s = xres_s + a.rows;              /* LIN 2: the block's columns of N (constant: before the wait) */
    __shared__ float hs[LIN == 2 ? RB : 1];
    if constexpr (LIN == 1) g1_lin_fetch(a, blockIdx.x, uw);
    if constexpr (LIN == 2) g1_rx_fetch(a, RB, rx_s);
    TRACE_MARK(1);
    pdl_wait();   /* the input is the previous kernel's output */
    TRACE_MARK(2);
    float xr[R];   /* LIN: x_res of the group's rows (LIN 2: the warp's one group, in registers from here) */
    if constexpr (LIN == 1) {
        for (int i = threadIdx.x; i < a.rows / 4; i += G1_THREADS)
            cp_async<16>((float4 *)xres_s + i, (const float4 *)a.lin.x_res + i);
        cp_async_commit();
    }
    if constexpr (LIN == 2) {
#pragma unroll
        for (int r = 0; r < R; r++) xr[r] = lane == 0 && gw * R + r < a.rows ? __ldcg(a.lin.x_res + gw * R + r) : 0.0f;
        if (threadIdx.x < RB && (int64_t)blockIdx.x * RB + threadIdx.x >= a.rows) hs[threadIdx.x] = 0.0f;
    }
    g1_stage<KIND, 0>(a, xs4, csum, red, wsm, TRACE_PTR);
    if constexpr (LIN == 1) {
        cp_async_wait_all();
        __syncthreads();
    }
    if (a.late) pdl_trigger();
    if constexpr (LIN == 1) {
        for (int e = blockIdx.x; e < a.lin.n_e; e += gridDim.x) {
            if (e != (int)blockIdx.x) g1_lin_fetch(a, e, uw);
            g1_lin_row<F>(a, e, uw, xs4, nch, xres_s, red);
        }
    }
    TRACE_MARK(3);

    float acc[R], ssw = 0.0f;   /* LIN: the warp's sum of h^2 */
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int64_t t = 0; t < tiles; t++) {
        int64_t grp = gw + (t / nb) * nw;
        int batch = (int)(t % nb);
        if (LIN == 1 && batch == 0 && lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) xr[r] = grp * R + r < a.rows ? xres_s[grp * R + r] : 0.0f;
        }
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
                if (lane == 0 && row < a.rows) {
                    a.y[row] = v;
                    if (LIN) {
                        const float hv = xr[r] + v;
                        a.lin.h[row] = hv;
                        ssw = fmaf(hv, hv, ssw);
                        if (LIN == 2) hs[row - (int64_t)blockIdx.x * RB] = hv;
                    }
                }
                acc[r] = 0.0f;
            }
        }
        if (more) cur = nxt;
    }
    if (LIN) {   /* the block's sum of squares of h, its warps in order */
        if (lane == 0) red[threadIdx.x >> 5] = ssw;
        if (LIN == 2) cp_async_wait_all();   /* the slice of N, for after the barrier */
        __syncthreads();
        if (threadIdx.x == 0) {
            float v = 0.0f;
#pragma unroll
            for (int i = 0; i < G1_WARPS; i++) v += red[i];
            a.lin.ssq[blockIdx.x] = v;
        }
        if constexpr (LIN == 2) g1_rx_add(a, RB, rx_s, hs);   /* (the barrier above: hs complete; past the end 0) */
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
 * registers bound the warps per SM: measured, a q4 12352 x 2048 projection
 * ran at ~1.3 TB/s. Here a block's tile of RT = 8 x RW whole rows (~16 KB
 * with their scales and biases) is copied into shared memory with
 * cp.async (no registers held while in flight), GS_STAGES tiles deep: the
 * first GS_STAGES - 1 are requested as soon as the input's loads are issued
 * (TERN_GEMV1_PRE=n: n of them before waiting for the previous kernel,
 * measured slower: docs/PERFORMANCE.md step 60), each later one as soon as a stage frees. Rows are contiguous, so a tile is
 * one contiguous range. Warps then read their RW rows from shared memory
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
    if (!a.late) pdl_trigger();
    const float4 *wsm = g1_norm_prefetch(a, xs4);   /* its group precedes the stages' */
#pragma unroll 1
    for (int k = 0; k < a.pre; k++) {   /* weights only: before the wait */
        int64_t t = blockIdx.x + (int64_t)k * gridDim.x;
        if (t < tiles) gs_issue<KIND>(a, L, t, stages + k * L.stage);
        cp_async_commit();
    }
    TRACE_MARK(1);
    pdl_wait();
    TRACE_MARK(2);
    auto post = [&]() { gs_issue_post<KIND>(a, L, stages, tiles); };   /* the other GS_STAGES - 1 - pre */
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
    if (a.late) pdl_trigger();
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
 * dynamic shared memory: the input as floats and its chunk sums, with LIN
 * the chunk sums padded to 16 bytes and x_res after them. With LIN the
 * block count is also the sums of squares' count. */
template <int KIND, int R, int U, int LIN = 0>
static int64_t g1_grid(const g1_args &a, size_t *smem) {
    constexpr int E = kind_traits<KIND>::E;
    const size_t nch = (size_t)(a.cols / E);
    *smem = ((size_t)a.cols + (LIN ? ((nch + 3) & ~(size_t)3) + (size_t)a.rows : nch) +
             (LIN == 2 ? (size_t)a.lin.n_e * G1_WARPS * R : 0)) *
            sizeof(float);
    static occ_cache cache;
    int64_t ngrp = (a.rows + R - 1) / R,
            cap = (int64_t)tern_cuda_sm_count() * blocks_per_sm(cache, gemv1_kernel<KIND, R, U, LIN>, G1_THREADS, *smem);
    int64_t blocks = (ngrp + G1_WARPS - 1) / G1_WARPS;
    return blocks < cap ? blocks : cap;
}

template <int KIND, int R, int U, int LIN = 0>
static cudaError_t g1_launch(const g1_args &a, cudaStream_t s) {
    size_t smem = 0;
    const int64_t blocks = g1_grid<KIND, R, U, LIN>(a, &smem);
    return launch_pdl(gemv1_kernel<KIND, R, U, LIN>, dim3((unsigned)blocks), dim3(G1_THREADS), smem, s, a);
}

/* The tile of a lane by the row's chunks per lane: 4 rows x 1 chunk, 2 x 2,
 * 1 x 4, or 1 x 1. */
enum { G1_T41, G1_T22, G1_T14, G1_T11 };
static int g1_shape(int64_t cols, int E) {
    const int64_t cpl = (cols / E + 31) / 32;   /* chunks per lane per row */
    return cpl == 1 ? G1_T41 : cpl == 2 ? G1_T22 : cpl % 4 == 0 ? G1_T14 : G1_T11;
}

template <int KIND, int LIN = 0>
static cudaError_t g1_pick(const g1_args &a, cudaStream_t s) {
    switch (g1_shape(a.cols, kind_traits<KIND>::E)) {
    case G1_T41: return g1_launch<KIND, 4, 1, LIN>(a, s);
    case G1_T22: return g1_launch<KIND, 2, 2, LIN>(a, s);
    case G1_T14: return g1_launch<KIND, 1, 4, LIN>(a, s);
    default: return g1_launch<KIND, 1, 1, LIN>(a, s);
    }
}

/* ---- tern_cuda_gemv1_lin: host side ---------------------------------------
 * The register-tile kernel with LIN: its blocks (and so its sums of
 * squares) as g1_grid counts them, *rb its rows per block; 0 where it does
 * not apply (LIN 2: also where the grid is capped, so that a block's rows
 * are not the contiguous RB the slices of rx are cut for). */
template <int KIND, int LIN>
static int lin_blocks(const g1_args &a, int *rb) {
    size_t smem = 0;
    int R = 1;
    int64_t blocks;
    switch (g1_shape(a.cols, kind_traits<KIND>::E)) {
    case G1_T41: R = 4; blocks = g1_grid<KIND, 4, 1, LIN>(a, &smem); break;
    case G1_T22: R = 2; blocks = g1_grid<KIND, 2, 2, LIN>(a, &smem); break;
    case G1_T14: blocks = g1_grid<KIND, 1, 4, LIN>(a, &smem); break;
    default: blocks = g1_grid<KIND, 1, 1, LIN>(a, &smem); break;
    }
    *rb = G1_WARPS * R;
    const int64_t uncapped = (a.rows + *rb - 1) / *rb;
    return LIN == 2 && (blocks < uncapped || smem > (size_t)100 * 1024) ? 0 : (int)blocks;
}

static int lin_applies(const tern_mat *W, int n_e) {
    return tern_cuda_gemv1_supported(W) && n_e >= 1 && W->rows % 4 == 0 &&
           (W->cols + W->rows) / 4 <= LIN_V * G1_THREADS;
}

static g1_args lin_args(const tern_mat *W, const float *x, float *y, const tern_cuda_lin_out *lo, int n_e) {
    int kind = mat_kind(W);
    g1_args a = {(const uint8_t *)W->data, W->scales, W->biases, W->rows, (int)W->cols,
                 kind == KIND_Q4 || kind == KIND_Q8 ? log2i(W->group) : 0,
                 kind_row_bytes(kind, W->cols), {x, NULL, NULL, NULL, 0, 0.0f, NULL, NULL}, y, {}, 0,
                 tern_cuda_trigger_late(), 0, {}};
    if (lo) a.lin = *lo;
    a.lin.n_e = n_e;
    return a;
}

template <int LIN>
static int lin_blocks_of(const tern_mat *W, int n_e, int *rb) {
    const g1_args a = lin_args(W, NULL, NULL, NULL, n_e);
    switch (mat_kind(W)) {
    case KIND_Q4: return lin_blocks<KIND_Q4, LIN>(a, rb);
    case KIND_Q8: return lin_blocks<KIND_Q8, LIN>(a, rb);
    case KIND_BF16: return lin_blocks<KIND_BF16, LIN>(a, rb);
    default: return lin_blocks<KIND_F16, LIN>(a, rb);
    }
}

int tern_cuda_gemv1_lin_blocks(const tern_mat *W, int n_e) {
    int rb = 0;
    return lin_applies(W, n_e) ? lin_blocks_of<1>(W, n_e, &rb) : 0;
}

int tern_cuda_gemv1_rx_rows(const tern_mat *W, int n_e, int *blocks) {
    int rb = 0, nb = lin_applies(W, n_e) ? lin_blocks_of<2>(W, n_e, &rb) : 0;
    if (blocks) *blocks = nb;
    return nb ? rb : 0;
}

int tern_cuda_gemv1_lin(const tern_mat *W, const float *x, float *y, const tern_cuda_lin_out *lo, tern_stream s,
                        tern_error *err) {
    if (!lo || !x || !y || !lo->x_res || !lo->h || !lo->ssq || (lo->rx ? !lo->u_fx : !lo->ru || !lo->u))
        return tern_fail(err, "gemv1_lin: missing input or output");
    if (lo->h == lo->x_res || lo->h == y || lo->h == x || y == lo->x_res || y == x)
        return tern_fail(err, "gemv1_lin: h and y must differ from each other and from the inputs");
    if (!lin_applies(W, lo->n_e))
        return tern_fail(err, "gemv1_lin: unsupported matrix (bits %d, %lldx%lld) or %d experts", W->bits,
                         (long long)W->rows, (long long)W->cols, lo->n_e);
    if (lo->rx && !tern_cuda_gemv1_rx_rows(W, lo->n_e, NULL))
        return tern_fail(err, "gemv1_lin: the accumulated form needs one row group a warp, and %lld rows do not fit "
                         "the device's resident blocks", (long long)W->rows);
    const g1_args a = lin_args(W, x, y, lo, lo->n_e);
    cudaStream_t st = (cudaStream_t)s;
    const int kind = mat_kind(W);
    cudaError_t e = lo->rx ? (kind == KIND_Q4     ? g1_pick<KIND_Q4, 2>(a, st)
                              : kind == KIND_Q8   ? g1_pick<KIND_Q8, 2>(a, st)
                              : kind == KIND_BF16 ? g1_pick<KIND_BF16, 2>(a, st)
                                                  : g1_pick<KIND_F16, 2>(a, st))
                           : (kind == KIND_Q4     ? g1_pick<KIND_Q4, 1>(a, st)
                              : kind == KIND_Q8   ? g1_pick<KIND_Q8, 1>(a, st)
                              : kind == KIND_BF16 ? g1_pick<KIND_BF16, 1>(a, st)
                                                  : g1_pick<KIND_F16, 1>(a, st));
    if (e != cudaSuccess) return tern_fail(err, "gemv1_lin: %s", cudaGetErrorString(e));
    return launch_check("gemv1_lin", err);
}

/* TERN_GEMV1, read once per process like the other debugging switches. */
enum { FORCE_NONE, FORCE_REGS, FORCE_STAGED, FORCE_INT, FORCE_BAD };
static int gemv1_forced(void) {
    static int f = -1;
    if (f < 0) {
        const char *v = getenv("TERN_GEMV1");
        f = !v || !*v                  ? FORCE_NONE
            : !strcmp(v, "regs")       ? FORCE_REGS
            : !strcmp(v, "staged")     ? FORCE_STAGED
            : !strcmp(v, "int")        ? FORCE_INT
                                       : FORCE_BAD;
    }
    return f;
}

static int norm_pre_enabled(void) {
    static int on = -1;
    return switch_on(&on, "TERN_GEMV1_NORM_PRE");
}

/* TERN_GEMV1_PRE=n: the staged kernel's tiles requested before the wait
 * (0 .. GS_STAGES - 1, by default 0; the rest after the input's loads:
 * docs/PERFORMANCE.md step 60); -1 a bad value */
static int gemv1_pre(void) {
    static int pre = -2;
    if (pre == -2) {
        const char *v = getenv("TERN_GEMV1_PRE");
        pre = !v || !*v ? 0 : (v[0] >= '0' && v[0] < '0' + GS_STAGES && !v[1]) ? v[0] - '0' : -1;
    }
    return pre;
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
                 kind_row_bytes(kind, W->cols), *in, y, {}, norm_pre_enabled(), tern_cuda_trigger_late(), 0, {}};
    if (route) a.route = *route;
    cudaStream_t st = (cudaStream_t)s;
    /* Which kernel (measured on the H200, docs/CUDA.md "Round 3"): below
     * ~8 MB of weights the register tiles (all of a lane's loads issued at
     * once, one wave); above, the staged kernel (weights through shared
     * memory, cp.async), at 4 bits with the input as digits and integer dots
     * (idot.cuh). TERN_GEMV1=regs|staged|int forces one where it fits (for
     * comparisons); the fused router takes the register tiles. */
    int forced = gemv1_forced();
    if (forced == FORCE_BAD)
        return tern_fail(err, "TERN_GEMV1 must be regs, staged or int (got '%s')", getenv("TERN_GEMV1"));
    if ((a.pre = gemv1_pre()) < 0)
        return tern_fail(err, "TERN_GEMV1_PRE must be 0 to %d (got '%s')", GS_STAGES - 1, getenv("TERN_GEMV1_PRE"));
    size_t bytes = (size_t)W->rows * kind_row_bytes(kind, W->cols);
    int regs = route || (forced ? forced == FORCE_REGS : bytes < ((size_t)8 << 20));
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

TRACE_DUMP_FN(tern_cuda_trace_dump_gemv_fused)
