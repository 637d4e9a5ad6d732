/* Attention of the query heads over the quantized KV cache, split-K
 * ("flash-decoding"): decode has one query per head, so parallelism comes
 * from the positions. The context is cut into splits; block (split, KV
 * head, token) scores its positions for up to 8 query heads that share the
 * KV head (GQA: each K/V row is read once for all of them), keeps the
 * split's max and exp-sum, and writes its unnormalised output; a second
 * kernel merges the splits (log-sum-exp) and applies the output gate.
 *
 * Layout of the work area: [T][n_heads][n_splits] records of head_dim + 2
 * floats: max, sum, output.
 *
 * With T > 1 (a chunk of prefill tokens already in the cache) token t sees
 * positions < pos0 + t + 1: correct but re-reads K and V per token (v1). */
#include <float.h>

#include "cuda/common.cuh"

#define MAXQ 8            /* query heads per block */
#define ATT_THREADS 256

/* Split policy: at least 32 positions a split, at most 256 splits until the
 * splits reach 1024 positions (their scores live in shared memory). */
static int split_len(int n) {
    int sl = (n + 255) / 256;
    sl = (sl + 31) / 32 * 32;
    if (sl < 32) sl = 32;
    if (sl > 1024) sl = 1024;
    return sl;
}



template <int BITS, bool ALIGNED>
__global__ void __launch_bounds__(ATT_THREADS) attn_split_kernel(tern_cuda_attn_dims dm, kv_layout L, const float *qg,
                                                                 const uint8_t *kc, const uint8_t *vc, int pos0,
                                                                 const int *pos_dev, int sl, int ns, int tpp,
                                                                 float scale, float *part) {
    extern __shared__ float sm[];
    int hd = dm.head_dim, G = dm.n_heads / dm.n_kv, ngq = (G + MAXQ - 1) / MAXQ;
    int split = blockIdx.x, kvh = blockIdx.y / ngq, t = blockIdx.z;
    int h0 = kvh * G + (blockIdx.y % ngq) * MAXQ, nq = min(MAXQ, kvh * G + G - h0);
    if (pos_dev) pos0 = *pos_dev;
    int n = pos0 + t + 1, j0 = split * sl, len = max(0, min(sl, n - j0));   /* splits past n are empty */
    float *qs = sm, *sc = sm + MAXQ * hd;
    float *stat = sc + MAXQ * sl;                        /* [MAXQ][2]: max, sum */
    for (int i = threadIdx.x; i < nq * hd; i += blockDim.x)
        qs[i] = qg[((size_t)t * dm.n_heads + h0 + i / hd) * 2 * hd + i % hd];
    __syncthreads();
    int first = kvh * hd;                                /* the head's first value in a row */
    /* scores: tpp threads per position, thread `sub` taking the 8-value
     * pieces sub, sub + tpp, ... (interleaved: the tpp threads read 8 * tpp
     * consecutive values of the row and of each query; contiguous slices
     * 32 values apart put all eight on the same shared-memory banks and ran
     * 1.8x slower than v1 at 32 K), then a shuffle sum. v1 had a thread per
     * position: a 32-position split ran in one warp. */
    int sub = threadIdx.x % tpp, per_pass = blockDim.x / tpp;
    for (int jb = 0; jb < len; jb += per_pass) {
        int jj = jb + threadIdx.x / tpp;
        float acc[MAXQ];
#pragma unroll
        for (int i = 0; i < MAXQ; i++) acc[i] = 0.0f;
        if (jj < len) {
            const uint8_t *row = kc + (size_t)(j0 + jj) * L.row_bytes;
            const uint8_t *vals = row + (size_t)first * BITS / 8;
            const uint16_t *sb = (const uint16_t *)(row + L.q_bytes);
#pragma unroll 4
            for (int d = sub * 8; d < hd; d += tpp * 8) {
                float kv[8];
                kv_load8<BITS>(vals, d, ALIGNED, kv);
                if (BITS != 16) {
                    int g = (first + d) / L.group;
                    float ks = h2f(sb[g]), b = h2f(sb[L.n_groups + g]);
#pragma unroll
                    for (int e = 0; e < 8; e++) kv[e] = fmaf(kv[e], ks, b);
                }
#pragma unroll
                for (int i = 0; i < MAXQ; i++) {
                    if (i < nq) {
                        float4 a = *(const float4 *)(qs + i * hd + d), c = *(const float4 *)(qs + i * hd + d + 4);
                        acc[i] += a.x * kv[0] + a.y * kv[1] + a.z * kv[2] + a.w * kv[3] + c.x * kv[4] + c.y * kv[5] +
                                  c.z * kv[6] + c.w * kv[7];
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < MAXQ; i++) acc[i] = group_sum(acc[i], tpp);
        if (jj < len && sub == 0)
#pragma unroll
            for (int i = 0; i < MAXQ; i++)
                if (i < nq) sc[i * sl + jj] = acc[i] * scale;
    }
    __syncthreads();
    /* per query (one warp each): the split's max, exp and sum */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < nq) {
        float m = -FLT_MAX;
        for (int jj = lane; jj < len; jj += 32) m = fmaxf(m, sc[warp * sl + jj]);
        m = warp_max(m);
        float l = 0.0f;
        for (int jj = lane; jj < len; jj += 32) {
            float p = expf(sc[warp * sl + jj] - m);
            sc[warp * sl + jj] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) { stat[2 * warp] = len ? m : -INFINITY; stat[2 * warp + 1] = l; }
    }
    __syncthreads();
    /* weighted sum of V: a thread per dimension; its byte offset, nibble
     * and group are the same in every row */
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        int e = first + d, g = BITS == 16 ? 0 : e / L.group, sh = BITS == 4 ? 4 * (e & 1) : 0;
        size_t off = BITS == 16 ? 2 * (size_t)e : BITS == 8 ? (size_t)e : (size_t)e / 2;
        const uint8_t *vrow = vc + (size_t)j0 * L.row_bytes;
        float o[MAXQ];
#pragma unroll
        for (int i = 0; i < MAXQ; i++) o[i] = 0.0f;
#pragma unroll 4
        for (int jj = 0; jj < len; jj++) {
            const uint8_t *rp = vrow + (size_t)jj * L.row_bytes;
            float v;
            if (BITS == 16) {
                v = h2f(*(const uint16_t *)(rp + off));
            } else {
                const uint16_t *sb = (const uint16_t *)(rp + L.q_bytes);
                float q = (float)((rp[off] >> sh) & (BITS == 8 ? 255 : 15));
                v = fmaf(q, h2f(sb[g]), h2f(sb[L.n_groups + g]));
            }
#pragma unroll
            for (int i = 0; i < MAXQ; i++)
                if (i < nq) o[i] = fmaf(sc[i * sl + jj], v, o[i]);
        }
#pragma unroll
        for (int i = 0; i < MAXQ; i++) {
            if (i >= nq) continue;
            float *rec = part + (((size_t)t * dm.n_heads + h0 + i) * ns + split) * (hd + 2);
            rec[2 + d] = o[i];
            if (d == 0) { rec[0] = stat[2 * i]; rec[1] = stat[2 * i + 1]; }
        }
    }
}

/* Merges the splits of head h, token t: o = sum_s e^{m_s - M} o_s / sum_s
 * e^{m_s - M} l_s, times sigmoid(gate). Block (h, t, dims/64): the split
 * weights e^{m_s - M} are computed once into shared memory (v1 recomputed
 * them per dimension, serially per thread: 16 blocks, most of the 131 us
 * at 32 K context), then each thread sums one dimension over the splits. */
#define COMBINE_DIMS 64

__device__ float block_reduce(float v, float *red, bool is_max) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < nw; i++) r = is_max ? fmaxf(r, red[i]) : r + red[i];
    return r;
}

__global__ void attn_combine_kernel(tern_cuda_attn_dims dm, const float *qg, const float *part, int ns, float *o) {
    extern __shared__ float w[];   /* [ns] */
    __shared__ float red[32];
    int h = blockIdx.x, t = blockIdx.y, hd = dm.head_dim;
    const float *rec = part + ((size_t)t * dm.n_heads + h) * ns * (hd + 2);
    float M = -INFINITY;
    for (int s = threadIdx.x; s < ns; s += blockDim.x) M = fmaxf(M, rec[(size_t)s * (hd + 2)]);
    M = block_reduce(M, red, true);
    float L = 0.0f;
    for (int s = threadIdx.x; s < ns; s += blockDim.x) {
        float m = rec[(size_t)s * (hd + 2)];
        w[s] = m > -INFINITY ? expf(m - M) : 0.0f;
        L += w[s] * rec[(size_t)s * (hd + 2) + 1];
    }
    L = block_reduce(L, red, false);   /* its barriers also publish w[] */
    int d = blockIdx.z * COMBINE_DIMS + threadIdx.x;
    if (d >= hd) return;
    const float *gate = qg + ((size_t)t * dm.n_heads + h) * 2 * hd + hd;
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < ns; s++) acc += w[s] * rec[(size_t)s * (hd + 2) + 2 + d];
    o[((size_t)t * dm.n_heads + h) * hd + d] = acc / L * sigmoid_f(gate[d]);
}

static int n_splits(int n) {
    int sl = split_len(n);
    return (n + sl - 1) / sl;
}

/* The most splits any context up to n takes: split_len keeps a context of
 * n <= 256 * 1024 within 256 splits (and n / 32), longer ones need n / 1024
 * (the count is not monotonic in n, hence the bound). */
static int max_splits(int n) {
    if (n > 256 * 1024) return (n + 1023) / 1024;
    int by32 = (n + 31) / 32;
    return by32 < 256 ? by32 : 256;
}

size_t tern_cuda_attention_workspace(const tern_cuda_attn_dims *d, int T, int n_ctx_max) {
    return (size_t)T * d->n_heads * max_splits(n_ctx_max) * (d->head_dim + 2) * sizeof(float);
}

template <int BITS, bool ALIGNED>
static void launch_split(dim3 grid, size_t smem, cudaStream_t s, const tern_cuda_attn_dims &d, const kv_layout &L,
                         const float *qg, const uint8_t *kc, const uint8_t *vc, int pos0, const int *pos_dev, int sl,
                         int ns, float scale, float *part) {
    /* threads per position: up to 8, a power of two that keeps whole
     * 8-value loads per thread (head_dim 256: 8 threads x 32 dims) */
    int tpp = 8;
    while (tpp > 1 && (d.head_dim / 8) % tpp) tpp /= 2;
    cudaFuncSetAttribute(attn_split_kernel<BITS, ALIGNED>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    attn_split_kernel<BITS, ALIGNED><<<grid, ATT_THREADS, smem, s>>>(d, L, qg, kc, vc, pos0, pos_dev, sl, ns, tpp, scale,
                                                                       part);
}

/* n_plan >= pos0 + T sizes the splits (the kernel reads pos0 from pos_dev
 * when given, so one plan serves every position up to n_plan). */
static int attention(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg, const uint8_t *kcache,
                     const uint8_t *vcache, int T, int pos0, const int *pos_dev, int n_plan, float scale, void *work,
                     size_t work_bytes, float *o, tern_stream s, tern_error *err) {
    int hd = d->head_dim;
    if (T < 1 || pos0 < 0 || hd % 8 || L->head_dim != hd || L->n_heads != d->n_kv || d->n_heads % d->n_kv ||
        (L->bits != 16 && L->group % 8))
        return tern_fail(err, "attention: dims do not match the KV layout (head_dim %d)", hd);
    int n = n_plan, sl = split_len(n), ns = n_splits(n);
    size_t need = (size_t)T * d->n_heads * ns * (hd + 2) * sizeof(float);
    if (need > work_bytes) return tern_fail(err, "attention: workspace %zu bytes, %zu needed", work_bytes, need);
    int G = d->n_heads / d->n_kv, ngq = (G + MAXQ - 1) / MAXQ;
    dim3 grid(ns, d->n_kv * ngq, T);
    size_t smem = ((size_t)MAXQ * hd + (size_t)MAXQ * sl + 2 * MAXQ) * sizeof(float);
    /* 16-byte loads of a 16-bit head slice need 16-byte rows and offsets;
     * 8-byte loads (8 bits) 8; 4-byte loads (4 bits) 4 */
    size_t need_al = L->bits == 16 ? 16 : L->bits == 8 ? 8 : 4;
    size_t first = (size_t)hd * L->bits / 8;
    bool al = L->row_bytes % need_al == 0 && first % need_al == 0 && ((uintptr_t)kcache % need_al) == 0;
    kv_layout kl = kv_of(L);
    float *part = (float *)work;
    if (L->bits == 16) {
        if (al) launch_split<16, true>(grid, smem, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, sl, ns, scale, part);
        else launch_split<16, false>(grid, smem, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, sl, ns, scale, part);
    } else if (L->bits == 8) {
        if (al) launch_split<8, true>(grid, smem, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, sl, ns, scale, part);
        else launch_split<8, false>(grid, smem, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, sl, ns, scale, part);
    } else {
        if (al) launch_split<4, true>(grid, smem, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, sl, ns, scale, part);
        else launch_split<4, false>(grid, smem, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, sl, ns, scale, part);
    }
    if (launch_check("attention split", err)) return -1;
    dim3 cgrid(d->n_heads, T, (hd + COMBINE_DIMS - 1) / COMBINE_DIMS);
    attn_combine_kernel<<<cgrid, COMBINE_DIMS, (size_t)ns * sizeof(float), s>>>(*d, qg, part, ns, o);
    return launch_check("attention combine", err);
}

int tern_cuda_attention(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg, const uint8_t *kcache,
                        const uint8_t *vcache, int T, int pos0, float scale, void *work, size_t work_bytes, float *o,
                        tern_stream s, tern_error *err) {
    if (pos0 < 0) return tern_fail(err, "attention: position %d", pos0);
    return attention(d, L, qg, kcache, vcache, T, pos0, NULL, pos0 + T, scale, work, work_bytes, o, s, err);
}

int tern_cuda_attention_at(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg, const uint8_t *kcache,
                           const uint8_t *vcache, int T, const int *pos_dev, int n_plan, float scale, void *work,
                           size_t work_bytes, float *o, tern_stream s, tern_error *err) {
    if (!pos_dev || n_plan < T) return tern_fail(err, "attention: no device position or a plan of %d", n_plan);
    return attention(d, L, qg, kcache, vcache, T, 0, pos_dev, n_plan, scale, work, work_bytes, o, s, err);
}
