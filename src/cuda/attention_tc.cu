/* The split kernel of the attention on tensor cores, for a 16-bit KV cache
 * (attention.cuh; attention.cu describes the splits, the staging and the
 * records this kernel shares with the FP32 one). */
#include "cuda/attention.cuh"

/* ---- the split kernel on tensor cores (16-bit KV) -----------------------------
 * The FP32 kernel above does 16 multiply-adds per K/V value (8 queries, the
 * score and the output) and is bound by them at long contexts
 * (docs/experiments/cuda-attention.md). Here the products run on mma.sync:
 *   scores S^T [16 x 8] = Q [16 x hd] K^T [hd x 8 rows]: the block's 8
 *     queries padded to 16 (rows 8..15 zero), a chunk of 8 K rows as B
 *     (ldmatrix of the staged rows);
 *   output O^T [hd x 8] += V^T [hd x 8 rows] P^T [8 rows x 8]: V^T by
 *     ldmatrix.trans of the staged rows, and P^T is the score product's
 *     accumulator layout as it stands (lane 4g + t holds query g, rows 2t
 *     and 2t + 1), so the probabilities go from one product to the next in
 *     registers.
 * K and V are f16 as stored, so they enter exactly; the queries and the
 * probabilities are fp32 and enter as two f16 terms each (hi = f16(x), lo =
 * f16(x - hi), ~22 bits together), every product accumulated in fp32, so
 * the result keeps the FP32 kernel's accuracy. The staging, the online
 * softmax per query and the records are as above; a chunk is 8 rows and
 * each warp keeps 3 in flight. Stage rows are padded by 16 bytes so the 8
 * rows an ldmatrix reads fall in different banks. */
#define TC_R 8        /* rows per chunk */
#define TC_S 3        /* chunks in flight per warp */
#define TC_Q 8        /* queries per block */

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint8_t *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const uint8_t *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* d += A [16 x 16] B [16 x 8] (f16, fp32 accumulation); A rows 8..15 zero */
__device__ __forceinline__ void mma_k16_top(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
/* d += A [16 x 8] B [8 x 8] (f16, fp32 accumulation) */
__device__ __forceinline__ void mma_k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}
/* The probabilities' scale in the P V products (a power of two). */
#define TC_PSCALE 32768.0f

/* x as two f16 terms, for a pair of values: hi and lo registers */
__device__ __forceinline__ void split_f16(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
    hi = (uint32_t)__half_as_ushort(h0) | (uint32_t)__half_as_ushort(h1) << 16;
    __half l0 = __float2half_rn(x0 - __half2float(h0)), l1 = __float2half_rn(x1 - __half2float(h1));
    lo = (uint32_t)__half_as_ushort(l0) | (uint32_t)__half_as_ushort(l1) << 16;
}

/* Chunk c of the split (rows j0 + 8c ..; rows at or past len as zeros):
 * each lane a 16-byte piece of the head slice of K and V per row. */
__device__ __forceinline__ void tc_issue(uint8_t *st, int rowst, int vb, const kv_layout &L, const uint8_t *kc,
                                         const uint8_t *vc, int j0, int c, int len, int first, int C, int lane) {
#pragma unroll
    for (int r = 0; r < TC_R; r++) {
        int jj = c * TC_R + r;
        bool ok = jj < len;
        size_t ro = (size_t)(j0 + (ok ? jj : 0)) * L.row_bytes + (size_t)first * 2 + 16 * lane;
        if (lane < C) {
            cp_async_zfill<16>(st + r * rowst + 16 * lane, kc + ro, ok);
            cp_async_zfill<16>(st + r * rowst + vb + 16 * lane, vc + ro, ok);
        }
    }
}

/* ---- the splits merged inside a cluster (one token, few splits) -----------
 * At a short context the combine kernel is a launch of its own in the
 * step's chain: its boundary and its read of the records cost time on
 * every layer (docs/experiments/cuda-attention.md). When the
 * splits of a KV head fit one thread-block cluster (ns <= 16 blocks, one
 * token), each block keeps its record (the warps' merge, in place over
 * warp 0's outputs, and its (max, sum) per query) in shared memory; after
 * a cluster barrier block r merges outputs r, r + ns x threads, .. of the
 * nq x hd (query, dim) pairs from every block's record through distributed
 * shared memory, splits in ascending order, and applies the gate: the
 * combine kernel's result without its launch. A second barrier keeps every
 * record alive until its readers are done. Blocks past the context take
 * part with an empty record (max -inf, sum 0). */
__device__ __forceinline__ float cl_ld(unsigned a) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}

/* The cluster's merge (see above): ns blocks, this one rank blockIdx.x. */
__device__ void att_cluster_merge(const float *rec, const float *tot, int hd, int nq, int ns, const float *qg,
                                  int t, int nh, int h0, float *o) {
    unsigned rank, size;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    /* the launch's cluster is its ns splits (a graph updated in place to
     * other splits must have taken the new cluster size too): anything else
     * would merge part of the splits, so stop rather than answer wrong */
    if (size != (unsigned)ns) __trap();
    cluster_arrive();   /* every block's record complete and visible */
    cluster_wait();
    const int n = nq * hd;
    for (int it = (int)rank * blockDim.x + threadIdx.x; it < n; it += ns * blockDim.x) {
        const int i = it / hd, d = it - i * hd;
        float ms[16], ls[16], os[16];
#pragma unroll
        for (int r = 0; r < 16; r++)
            if (r < ns) {
                ms[r] = cl_ld(cluster_map(tot + 2 * i, r));
                ls[r] = cl_ld(cluster_map(tot + 2 * i + 1, r));
                os[r] = cl_ld(cluster_map(rec + (size_t)i * hd + d, r));
            }
        float M = -INFINITY;
#pragma unroll
        for (int r = 0; r < 16; r++)
            if (r < ns) M = fmaxf(M, ms[r]);
        float L = 0.0f, acc = 0.0f;
#pragma unroll
        for (int r = 0; r < 16; r++)
            if (r < ns) {
                const float w = ms[r] > -INFINITY ? expf(ms[r] - M) : 0.0f;
                L = fmaf(w, ls[r], L);
                acc = fmaf(w, os[r], acc);
            }
        const float gate = qg[((size_t)t * nh + h0 + i) * 2 * hd + hd + d];
        o[((size_t)t * nh + h0 + i) * hd + d] = acc / L * sigmoid_f(gate);
    }
    cluster_arrive();   /* the records are read: blocks may leave */
    cluster_wait();
}

/* HD: the head dimension (a multiple of 32, at most 256), a template
 * argument so the queries' and outputs' fragments stay in registers. CL:
 * the splits merged in the cluster (att_cluster_merge; o the output, part
 * unused), else records into part for the combine kernel. */
template <int HD, bool CL>
__global__ void __launch_bounds__(ATT_W * 32, ATT_BLOCKS_PER_SM)
    attn_split_tc_kernel(tern_cuda_attn_dims dm, kv_layout L, const float *qg, const uint8_t *kc, const uint8_t *vc,
                         int pos0, const int *pos_dev, int T, int ns, float scale, float *part, float *out) {
    constexpr int KS = HD / 16, VB = HD * 2, ROWST = 2 * VB + 16, STAGE = TC_R * ROWST;
    extern __shared__ __align__(16) uint8_t smem[];
    /* the position is the step's (copied in before the step's kernels
     * run), and attn_prep writes only the rows of this call's tokens, at
     * pos0 and after: the warp's first chunks wholly below pos0 are
     * requested before the wait, under attn_prep, the rest after it */
    if (pos_dev) pos0 = __ldcg(pos_dev);
    att_block b;
    /* (CL: a block past the context stays for the cluster's barriers, with
     * no rows: len 0) */
    const bool live = att_block_of<TC_Q>(dm, pos0, T, ns, b);
    const int split = b.split, kvh = b.kvh, t = b.t, h0 = b.h0, nq = b.nq, j0 = b.j0, len = b.len;
    int nh = dm.n_heads;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int first = kvh * HD;
    uint8_t *wst = smem + (size_t)warp * TC_S * STAGE;
    int nchunks = (len + TC_R - 1) / TC_R, mine = nchunks > warp ? (nchunks - warp + ATT_W - 1) / ATT_W : 0;
    int kpre = 0;   /* chunks requested before the wait: a prefix (commit groups stay in chunk order) */
    for (; live && kpre < TC_S - 1 && kpre < mine && j0 + TC_R * (warp + kpre * ATT_W + 1) <= pos0;
         kpre++) {
        tc_issue(wst + kpre * STAGE, ROWST, VB, L, kc, vc, j0, warp + kpre * ATT_W, len, first, HD / 8, lane);
        cp_async_commit();
    }
    pdl_wait();      /* q and the current rows come from attn_prep */
    pdl_trigger();
    if (!live && !CL) return;
    for (int k = kpre; k < TC_S - 1; k++) {
        if (k < mine) tc_issue(wst + k * STAGE, ROWST, VB, L, kc, vc, j0, warp + k * ATT_W, len, first, HD / 8, lane);
        cp_async_commit();
    }

    /* query g's values 16 ks + 2 tq, +1 and + 8 of them: the A fragments */
    uint32_t qh[KS][2], ql[KS][2];
    {
        const float *qp = qg + ((size_t)t * nh + h0 + g) * 2 * HD;
        bool real = g < nq;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float2 x = real ? *(const float2 *)(qp + 16 * ks + 8 * h + 2 * tq) : make_float2(0.f, 0.f);
                split_f16(x.x, x.y, qh[ks][h], ql[ks][h]);
            }
    }
    float o[KS][4];   /* O^T: dims 16 mt + g (+ 8) x queries 2 tq, 2 tq + 1 */
#pragma unroll
    for (int mt = 0; mt < KS; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    float m = -INFINITY, lsum = 0.0f;   /* query g: running max, this lane's rows' exp-sum */
    /* the lane's ldmatrix row: matrix lane / 8, row lane % 8 */
    const int lrow = (lane & 7) * ROWST, lcol = 16 * (lane >> 3);

    for (int k = 0; k < mine; k++) {
        if (k + TC_S - 1 < mine)
            tc_issue(wst + ((k + TC_S - 1) % TC_S) * STAGE, ROWST, VB, L, kc, vc, j0, warp + (k + TC_S - 1) * ATT_W,
                     len, first, HD / 8, lane);
        cp_async_commit();
        cp_async_wait<TC_S - 1>();
        __syncwarp();
        const uint8_t *st = wst + (k % TC_S) * STAGE;
        int nr = min(TC_R, len - (warp + k * ATT_W) * TC_R);

        /* S^T: query g, rows 2 tq, 2 tq + 1 (and padding), in four
         * accumulators so that the products do not wait on each other */
        float sc[4][4] = {};
#pragma unroll
        for (int kp = 0; kp < KS / 2; kp++) {
            uint32_t b[4];   /* K rows: dims 32 kp + {0, 8, 16, 24} + 2 tq of row g */
            ldsm_x4(b, st + lrow + 64 * kp + lcol);
            mma_k16_top(sc[0], qh[2 * kp][0], qh[2 * kp][1], b[0], b[1]);
            mma_k16_top(sc[1], ql[2 * kp][0], ql[2 * kp][1], b[0], b[1]);
            mma_k16_top(sc[2], qh[2 * kp + 1][0], qh[2 * kp + 1][1], b[2], b[3]);
            mma_k16_top(sc[3], ql[2 * kp + 1][0], ql[2 * kp + 1][1], b[2], b[3]);
        }
        float r0 = (sc[0][0] + sc[2][0]) + (sc[1][0] + sc[3][0]), r1 = (sc[0][1] + sc[2][1]) + (sc[1][1] + sc[3][1]);
        float s0 = 2 * tq < nr ? r0 * scale : -INFINITY, s1 = 2 * tq + 1 < nr ? r1 * scale : -INFINITY;
        float cm = fmaxf(s0, s1);
        cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
        cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
        float mn = fmaxf(m, cm);   /* finite: row 0 is in the context */
        float alpha = expf(m - mn), p0 = expf(s0 - mn), p1 = expf(s1 - mn);
        lsum = fmaf(lsum, alpha, p0 + p1);
        m = mn;
        /* the outputs of queries 2 tq and 2 tq + 1: their rescale factors
         * come from lanes 8 tq and 8 tq + 4 */
        float a0 = __shfl_sync(0xffffffffu, alpha, 8 * tq), a1 = __shfl_sync(0xffffffffu, alpha, 8 * tq + 4);
        if (__any_sync(0xffffffffu, alpha != 1.0f)) {
#pragma unroll
            for (int mt = 0; mt < KS; mt++) {
                o[mt][0] *= a0; o[mt][1] *= a1; o[mt][2] *= a0; o[mt][3] *= a1;
            }
        }
        /* p <= 1 scaled by 2^15 before the split: small probabilities
         * (~1/context) would otherwise fall into f16's subnormals, where hi
         * and lo keep only absolute 2^-24 steps; the scale leaves the
         * outputs exact up to the final 2^-15 */
        uint32_t ph, pl;
        split_f16(p0 * TC_PSCALE, p1 * TC_PSCALE, ph, pl);
#pragma unroll
        for (int mp = 0; mp < KS / 2; mp++) {
            uint32_t a[4];   /* V^T: dims 32 mp + {g, 8 + g, 16 + g, 24 + g} x rows 2 tq, 2 tq + 1 */
            ldsm_x4_t(a, st + VB + lrow + 64 * mp + lcol);
            mma_k8(o[2 * mp], a[0], a[1], ph);
            mma_k8(o[2 * mp], a[0], a[1], pl);
            mma_k8(o[2 * mp + 1], a[2], a[3], ph);
            mma_k8(o[2 * mp + 1], a[2], a[3], pl);
        }
        __syncwarp();   /* the stage is rewritten next */
    }
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);

    /* the warps' records into shared memory (the stages are free now) */
    cp_async_wait<0>();
    __syncthreads();
    size_t stage_all = (size_t)ATT_W * TC_S * STAGE, merge_all = (size_t)ATT_W * TC_Q * HD * sizeof(float);
    float *mo = (float *)smem;   /* [W][Q][hd] */
    float *wm = (float *)(smem + (stage_all > merge_all ? stage_all : merge_all));
    float *wl = wm + ATT_W * TC_Q, *wgt = wl + ATT_W * TC_Q, *tot = wgt + ATT_W * TC_Q;
    float *mw = mo + (size_t)warp * TC_Q * HD;
#pragma unroll
    for (int mt = 0; mt < KS; mt++) {
        int d = 16 * mt + g;
        mw[(2 * tq) * HD + d] = o[mt][0] * (1.0f / TC_PSCALE);
        mw[(2 * tq + 1) * HD + d] = o[mt][1] * (1.0f / TC_PSCALE);
        mw[(2 * tq) * HD + d + 8] = o[mt][2] * (1.0f / TC_PSCALE);
        mw[(2 * tq + 1) * HD + d + 8] = o[mt][3] * (1.0f / TC_PSCALE);
    }
    if (tq == 0) {
        wm[warp * TC_Q + g] = m;
        wl[warp * TC_Q + g] = lsum;
    }
    __syncthreads();
    att_finish<TC_Q, CL>(mo, wm, wl, wgt, tot, HD, nq, t, nh, h0, ns, split, T, part);
    if constexpr (CL) att_cluster_merge(mo, tot, HD, nq, ns, qg, t, nh, h0, out);
}

/* 1 if the tensor-core split kernel takes these dims (else the FP32
 * kernel). */
int att_tc_ok(const tern_cuda_attn_dims &d, const tern_kvq *L, bool al) {
    int hd = d.head_dim;
    return L->bits == 16 && al && (hd == 32 || hd == 64 || hd == 128 || hd == 256);
}

template <int HD> static size_t tc_smem() {
    size_t stage_all = (size_t)ATT_W * TC_S * TC_R * (4 * HD + 16), merge_all = (size_t)ATT_W * TC_Q * HD * sizeof(float);
    return (stage_all > merge_all ? stage_all : merge_all) + (3 * ATT_W * TC_Q + 2 * TC_Q) * sizeof(float);
}

/* CL: the ns splits of a KV head one cluster */
template <int HD, bool CL>
static cudaError_t launch_split_tc(int ns, int T, cudaStream_t s, const tern_cuda_attn_dims &d, const kv_layout &L,
                                   const float *qg, const uint8_t *kc, const uint8_t *vc, int pos0, const int *pos_dev,
                                   float scale, float *part, float *o) {
    size_t smem = tc_smem<HD>();
    int G = d.n_heads / d.n_kv, ngq = (G + TC_Q - 1) / TC_Q;
    auto kern = attn_split_tc_kernel<HD, CL>;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (CL && ns > 8) cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return launch_pdl_cluster(kern, dim3(ns, d.n_kv * ngq, T), dim3(ATT_W * 32), smem, CL ? (unsigned)ns : 0u, s, d,
                              L, qg, kc, vc, pos0, pos_dev, T, ns, scale, part, o);
}

template <bool CL>
static cudaError_t launch_split_tc_hd(int ns, int T, cudaStream_t s, const tern_cuda_attn_dims &d, const kv_layout &L,
                                      const float *qg, const uint8_t *kc, const uint8_t *vc, int pos0,
                                      const int *pos_dev, float scale, float *part, float *o) {
    switch (d.head_dim) {
    case 32: return launch_split_tc<32, CL>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part, o);
    case 64: return launch_split_tc<64, CL>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part, o);
    case 128: return launch_split_tc<128, CL>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part, o);
    default: return launch_split_tc<256, CL>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part, o);
    }
}

/* The largest cluster (16, else 8, else 0: none) a launch of the CL
 * kernel for head_dim HD can be scheduled with, asked once per HD. */
template <int HD> static int tc_cluster_max(int n_kv) {
    static int known = -1;
    if (known >= 0) return known;
    known = 0;
    auto kern = attn_split_tc_kernel<HD, true>;
    size_t smem = tc_smem<HD>();
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    carveout_max((const void *)kern);   /* (as its launches will have it) */
    for (int cl = 16; cl >= 8 && !known; cl /= 2) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(cl, n_kv > 0 ? n_kv : 1, 1);
        cfg.blockDim = dim3(ATT_W * 32);
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = cl;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) == cudaSuccess && n > 0) known = cl;
        else cudaGetLastError();
    }
    return known;
}

static int tc_cluster_max_hd(int hd, int n_kv) {
    switch (hd) {
    case 32: return tc_cluster_max<32>(n_kv);
    case 64: return tc_cluster_max<64>(n_kv);
    case 128: return tc_cluster_max<128>(n_kv);
    default: return tc_cluster_max<256>(n_kv);
    }
}

/* The cluster form's splits for one token planned for contexts up to n:
 * as many as att_splits plans, at most the largest cluster, when that
 * leaves a split at most ATT_CL_LEN positions; 0: the two-kernel form. */
#define ATT_CL_LEN 64
int att_cluster_splits(const tern_cuda_attn_dims *d, int T, int n, int ns) {
    if (T != 1) return 0;
    int cl = tc_cluster_max_hd(d->head_dim, d->n_kv), ncl = ns < cl ? ns : cl;
    if (ncl < 1 || (int64_t)n > (int64_t)ncl * ATT_CL_LEN) return 0;
    return ncl;
}

cudaError_t att_launch_split_tc(bool cl, int ns, int T, cudaStream_t s, const tern_cuda_attn_dims &d,
                                const kv_layout &L, const float *qg, const uint8_t *kc, const uint8_t *vc, int pos0,
                                const int *pos_dev, float scale, float *part, float *o) {
    return cl ? launch_split_tc_hd<true>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part, o)
              : launch_split_tc_hd<false>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part, o);
}
