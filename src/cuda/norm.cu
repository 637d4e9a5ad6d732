/* RMSNorm with the residual add, and the attention block's pre-attention
 * step (q/k RMSNorm + partial RoPE per head, K/V rows into the quantized
 * cache). Both are small (a few KB per token): one block per token, so
 * their cost is the launch. */
#include <float.h>

#include "cuda/attn_rows.cuh"
#include "cuda/common.cuh"

/* Block-wide sum (blockDim a multiple of 32, <= 1024). */
__device__ float block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

__global__ void rmsnorm_kernel(float *y, float *x, const float *delta, const float *w, int one_plus, int n,
                               float eps) {
    __shared__ float red[32];
    float *xr = x + (size_t)blockIdx.x * n;
    const float *dr = delta ? delta + (size_t)blockIdx.x * n : NULL;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (dr) {
            v += dr[i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    float *yr = y + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * (one_plus ? 1.0f + w[i] : w[i]);
}

int tern_cuda_rmsnorm(float *y, float *x, const float *delta, const float *w, int one_plus, int n, int T, float eps,
                      tern_stream s, tern_error *err) {
    if (n < 1 || T < 1) return tern_fail(err, "rmsnorm: n = %d, T = %d", n, T);
    if (delta && y == x) return tern_fail(err, "rmsnorm: y must differ from x when a residual is added");
    rmsnorm_kernel<<<T, 256, 0, s>>>(y, x, delta, w, one_plus, n, eps);
    return launch_check("rmsnorm", err);
}

__global__ void dfx_float_kernel(float *y, const long long *fx, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = dfx_val(fx[i]);
}

int tern_cuda_dfx_float(float *y, const long long *fx, int n, tern_stream s, tern_error *err) {
    if (n < 1 || !y || !fx) return tern_fail(err, "dfx_float: n = %d, or no buffer", n);
    dfx_float_kernel<<<ceil_div(n, 256), 256, 0, s>>>(y, fx, n);
    return launch_check("dfx_float", err);
}

/* ---- f16 rounding, as cpu/kvquant.c rounds ------------------------------- */

__device__ __forceinline__ float f16f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t f16_step_up(uint16_t h) {
    return (uint16_t)(h == 0x8000u ? 1u : (h & 0x8000u) ? h - 1u : h + 1u);
}
__device__ __forceinline__ uint16_t f16_step_down(uint16_t h) {
    return (uint16_t)(h == 0 ? 0x8001u : (h & 0x8000u) ? h + 1u : h - 1u);
}
/* Largest f16 <= x; smallest f16 >= x. */
__device__ __forceinline__ uint16_t f16_down(float x) {
    uint16_t h = f16_rne(x);
    return f16f(h) > x ? f16_step_down(h) : h;
}
__device__ __forceinline__ uint16_t f16_up(double x) {
    uint16_t h = f16_rne((float)x);
    return (double)f16f(h) < x ? f16_step_up(h) : h;
}

/* One group of a row (8/4 bits) by one warp: bias = min rounded down to
 * f16, scale = (max - bias) / levels rounded up, q = rint((x - bias) /
 * scale) in double, exactly as tern_kv_quantize_row. */
__device__ void quantize_group(const kv_layout &L, const float *x, int g, uint8_t *row) {
    int lane = threadIdx.x & 31, G = L.group, levels = (1 << L.bits) - 1;
    const float *xg = x + (size_t)g * G;
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int i = lane; i < G; i += 32) {
        float v = clamp16(xg[i]);
        mn = fminf(mn, v);
        mx = fmaxf(mx, v);
    }
    mn = -warp_max(-mn);
    mx = warp_max(mx);
    uint16_t b16 = f16_down(mn);
    float b = f16f(b16);
    double span = ((double)mx - b) / levels;
    uint16_t s16 = span > 0 ? f16_up(span) : 0;
    float sc = f16f(s16);
    if (lane == 0) {
        ((uint16_t *)(row + L.q_bytes))[g] = s16;
        ((uint16_t *)(row + L.q_bytes))[L.n_groups + g] = b16;
    }
    size_t e0 = (size_t)g * G;
    if (L.bits == 8) {
        for (int i = lane; i < G; i += 32) {
            int v = 0;
            if (sc > 0) v = (int)min(max(rint(((double)clamp16(xg[i]) - b) / sc), 0.0), (double)levels);
            row[e0 + i] = (uint8_t)v;
        }
        return;
    }
    for (int i = 2 * lane; i < G; i += 64) {   /* a byte holds elements 2j (low nibble) and 2j + 1 */
        int v0 = 0, v1 = 0;
        if (sc > 0) {
            v0 = (int)min(max(rint(((double)clamp16(xg[i]) - b) / sc), 0.0), (double)levels);
            v1 = (int)min(max(rint(((double)clamp16(xg[i + 1]) - b) / sc), 0.0), (double)levels);
        }
        row[(e0 + i) / 2] = (uint8_t)(v0 | v1 << 4);
    }
}

/* A whole row (row_len floats) by the block's warps. */
__device__ void quantize_row(const kv_layout &L, const float *x, uint8_t *row) {
    int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (L.bits == 16) {
        for (int i = threadIdx.x; i < L.row_len; i += blockDim.x) ((uint16_t *)row)[i] = f16_rne(clamp16(x[i]));
        return;
    }
    for (int g = warp; g < L.n_groups; g += nw) quantize_group(L, x, g, row);
    /* the padding byte of an odd-length q part is written as 0 */
    size_t used = (size_t)L.row_len * L.bits / 8;
    if (threadIdx.x == 0 && used < L.q_bytes) row[used] = 0;
}

/* Block (token, 0) takes the KV heads (K's norm and RoPE) and then
 * quantizes the token's K and V rows; blocks (token, 1..) take ATTP_QH query
 * heads each, a warp per head, so the heads' norms run side by side instead
 * of in rounds of one block's warps. Launched with programmatic dependent
 * launch: it waits for the projections before its first read. */
#define ATTP_THREADS 256
#define ATTP_QH (ATTP_THREADS / 32)
__global__ void __launch_bounds__(ATTP_THREADS)
    attn_prep_kernel(tern_cuda_attn_dims d, kv_layout L, float *qg, float *k, const float *v, const float *q_norm,
                     const float *k_norm, const float *inv_freq, int pos0, const int *pos_dev, uint8_t *kcache,
                     uint8_t *vcache) {
    extern __shared__ float scratch[];   /* [warps][head_dim] */
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int hd = d.head_dim, pos = (pos_dev ? *pos_dev : pos0) + t;
    float *mine = scratch + (size_t)warp * hd;
    if (blockIdx.y > 0) {
        int h0 = (blockIdx.y - 1) * ATTP_QH, h1 = min(h0 + ATTP_QH, d.n_heads);
        for (int i = h0 + warp; i < h1; i += nw)
            norm_rope(qg + ((size_t)t * d.n_heads + i) * 2 * hd, qg + ((size_t)t * d.n_heads + i) * 2 * hd, q_norm,
                      inv_freq, hd, d.rope_dim, d.rope_scale, pos, d.eps, mine);
        return;
    }
    for (int i = warp; i < d.n_kv; i += nw)
        norm_rope(k + ((size_t)t * d.n_kv + i) * hd, k + ((size_t)t * d.n_kv + i) * hd, k_norm, inv_freq, hd,
                  d.rope_dim, d.rope_scale, pos, d.eps, mine);
    __syncthreads();
    size_t row = (size_t)L.row_len;
    quantize_row(L, k + t * row, kcache + (size_t)pos * L.row_bytes);
    quantize_row(L, v + t * row, vcache + (size_t)pos * L.row_bytes);
}

static int attn_prep(const tern_cuda_attn_dims *d, const tern_kvq *L, float *qg, float *k, const float *v,
                     const float *q_norm, const float *k_norm, const float *inv_freq, int T, int pos0,
                     const int *pos_dev, uint8_t *kcache, uint8_t *vcache, tern_stream s, tern_error *err) {
    if (T < 1 || pos0 < 0 || d->rope_dim % 2 || d->rope_dim > d->head_dim || L->head_dim != d->head_dim ||
        L->n_heads != d->n_kv || d->head_dim > TERN_KV_MAX_HEAD_DIM)
        return tern_fail(err, "attn_prep: dims do not match the KV layout");
    if (!(d->rope_scale > 0)) return tern_fail(err, "attn_prep: rope_scale %g is not positive", d->rope_scale);
    size_t smem = (size_t)(ATTP_THREADS / 32) * d->head_dim * sizeof(float);
    dim3 grid(T, 1 + (d->n_heads + ATTP_QH - 1) / ATTP_QH);
    cudaError_t e = launch_pdl(attn_prep_kernel, grid, dim3(ATTP_THREADS), smem, s, *d, kv_of(L), qg, k, v, q_norm,
                               k_norm, inv_freq, pos0, pos_dev, kcache, vcache);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tern_fail(err, "attn_prep: %s", cudaGetErrorString(e));
    }
    return 0;
}

int tern_cuda_attn_prep(const tern_cuda_attn_dims *d, const tern_kvq *L, float *qg, float *k, const float *v,
                        const float *q_norm, const float *k_norm, const float *inv_freq, int T, int pos0,
                        uint8_t *kcache, uint8_t *vcache, tern_stream s, tern_error *err) {
    return attn_prep(d, L, qg, k, v, q_norm, k_norm, inv_freq, T, pos0, NULL, kcache, vcache, s, err);
}

int tern_cuda_attn_prep_at(const tern_cuda_attn_dims *d, const tern_kvq *L, float *qg, float *k, const float *v,
                           const float *q_norm, const float *k_norm, const float *inv_freq, int T, const int *pos_dev,
                           uint8_t *kcache, uint8_t *vcache, tern_stream s, tern_error *err) {
    if (!pos_dev) return tern_fail(err, "attn_prep: no device position");
    return attn_prep(d, L, qg, k, v, q_norm, k_norm, inv_freq, T, 0, pos_dev, kcache, vcache, s, err);
}
