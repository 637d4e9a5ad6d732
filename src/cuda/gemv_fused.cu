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
#include "cuda/common.cuh"

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
} g1_args;

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
    float p = 0.0f;
#pragma unroll
    for (int wi = 0; wi < 4; wi++) {
        uint32_t w = wv[wi];
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
    }
    return p;
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

/* The input into shared memory (permuted, see the header) and, for
 * quantized kinds, each chunk's sum. */
template <int KIND>
__device__ void g1_stage(const g1_args &a, float4 *xs4, float *csum, float *red) {
    constexpr int E = kind_traits<KIND>::E, F = E / 4;
    const tern_cuda_vec_in &in = a.in;
    int n4 = a.cols / 4, nch = a.cols / E, tid = threadIdx.x;
    bool first = blockIdx.x == 0;
    float4 v[G1_MAXV];
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
            float4 o = v[k];
            if (in.norm_w) {
                float4 w = ((const float4 *)in.norm_w)[i];
                if (in.one_plus) { w.x += 1.0f; w.y += 1.0f; w.z += 1.0f; w.w += 1.0f; }
                o.x = o.x * r * w.x; o.y = o.y * r * w.y; o.z = o.z * r * w.z; o.w = o.w * r * w.w;
            }
            if (first && in.xn_out) ((float4 *)in.xn_out)[i] = o;
            xs4[(i % F) * nch + i / F] = o;
        }
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
    /* resident blocks per SM at the largest input (a pure function of the
     * kernel, computed once) */
    static int occ = 0;
    size_t smem_max = 8192 * sizeof(float) + 8192 / 8 * sizeof(float);
    if (!occ && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv1_kernel<KIND, R, U>, G1_THREADS, smem_max) !=
                     cudaSuccess || occ < 1))
        occ = 1;
    constexpr int E = kind_traits<KIND>::E;
    int64_t ngrp = (a.rows + R - 1) / R, cap = (int64_t)g1_sms() * occ;
    int64_t blocks = (ngrp + G1_WARPS - 1) / G1_WARPS;
    if (blocks > cap) blocks = cap;
    size_t smem = (size_t)a.cols * sizeof(float) + (size_t)(a.cols / E) * sizeof(float);
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

int tern_cuda_gemv1(const tern_mat *W, const tern_cuda_vec_in *in, float *y, tern_stream s, tern_error *err) {
    if (!tern_cuda_gemv1_supported(W))
        return tern_fail(err, "gemv1: unsupported matrix (bits %d, dtype %d, %lldx%lld, group %d)", W->bits, W->dtype,
                         (long long)W->rows, (long long)W->cols, W->group);
    if (!in || !in->x) return tern_fail(err, "gemv1: no input");
    if (in->delta && !in->x_out) return tern_fail(err, "gemv1: a residual needs x_out");
    if (in->x_out && (in->x_out == in->x || in->x_out == in->delta))
        return tern_fail(err, "gemv1: x_out must not be an input (other blocks still read it)");
    int kind = mat_kind(W);
    g1_args a = {(const uint8_t *)W->data, W->scales, W->biases, W->rows, (int)W->cols,
                 kind_traits<KIND_Q4>::QUANT && (kind == KIND_Q4 || kind == KIND_Q8) ? log2i(W->group) : 0,
                 kind_row_bytes(kind, W->cols), *in, y};
    cudaStream_t st = (cudaStream_t)s;
    cudaError_t e = kind == KIND_Q4   ? g1_pick<KIND_Q4>(a, st)
                    : kind == KIND_Q8 ? g1_pick<KIND_Q8>(a, st)
                    : kind == KIND_BF16 ? g1_pick<KIND_BF16>(a, st)
                                        : g1_pick<KIND_F16>(a, st);
    if (e != cudaSuccess) return tern_fail(err, "gemv1: %s", cudaGetErrorString(e));
    return launch_check("gemv1", err);
}
