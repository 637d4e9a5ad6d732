/* Attention of the query heads over the quantized KV cache, split-K
 * ("flash-decoding"): decode has one query per head, so parallelism comes
 * from the positions. The context is cut into splits; block (split, query
 * group, token) runs its split for up to Q query heads that share a KV
 * head (GQA: each K/V row is read once for all of them) and writes the
 * split's max, exp-sum and unnormalised output; a second kernel merges the
 * splits (log-sum-exp) and applies the output gate.
 *
 * The split kernel. Scoring the split into shared memory and then walking
 * the rows serially for V, a thread per dimension, made a chain of
 * dependent row loads. Instead each warp streams its own
 * chunks of R rows (chunk c of the split goes to warp c % W) through a
 * pipeline of S stages in shared memory filled by cp.async (K, V and their
 * scales; 2-3 chunks in flight per warp, no registers held by them), with
 * an online softmax per warp:
 *   - a lane owns 8 dimensions of a row (CPL = 2 pieces of 8 at head_dim
 *     > 256), keeps the Q queries' values of them in registers and
 *     accumulates the Q outputs of them in registers;
 *   - scores: each lane computes partial dots for R x Q = 32 (row, query)
 *     pairs, then a reduce-scatter over the warp (16 + 8 + 4 + 2 + 1
 *     shuffles, no selects: lane l's register slot k holds pair k ^ l,
 *     which it gets by loading query (i ^ l % Q) and row (r ^ l / Q)
 *     into slot (r, i)) leaves lane l with the full score of pair l;
 *   - the chunk's probabilities and the queries' rescale factors go
 *     through shared memory to every lane for the weighted sum of V.
 * At the end the warps' (max, sum, output) are merged in a fixed order in
 * shared memory (no atomics: results do not depend on timing). At 8/4-bit
 * KV the kernel is not DRAM-bound (the FP32 work of 8 queries per K/V
 * value and the dequantization). Six stages, or four planned blocks per
 * SM, measured slower (timings: docs/experiments/cuda-attention.md).
 *
 * Splits: their count ns is planned on the host from n_plan (about two
 * blocks per SM, at least 32 positions a split); their length sl is
 * computed on the device from the actual context (pos_dev), so a step
 * captured for a longer plan still spreads its positions over all the
 * blocks; splits past the context exit at once and are not merged (in the
 * cluster form they stay, with empty records, for the cluster's barriers).
 *
 * Layout of the work area: outputs [T][n_heads][ns][head_dim] floats, then
 * stats [T][n_heads][ns][2] (max, sum).
 *
 * With T > 1 (a chunk of prefill tokens already in the cache) token t sees
 * positions < pos0 + t + 1: correct but re-reads K and V per token.
 *
 * Both kernels are launched with programmatic dependent launch: they wait
 * (pdl_wait) before their first read of what attn_prep writes and let the
 * next kernel launch (pdl_trigger) right after it; the tensor-core split
 * kernel requests its first chunks of rows before pos0 (the cache of earlier
 * steps) before it waits. One token at up to 16 splits merges its splits in
 * a cluster instead of the combine kernel (see att_cluster_merge). */
#include <float.h>

#include "cuda/common.cuh"

#define ATT_W 4           /* warps per split block */
#define ATT_GRAN 32       /* split lengths: multiples of this, at least this */
#define ATT_BLOCKS_PER_SM 2   /* resident (~220 registers a thread) */
#ifndef ATT_PLAN_PER_SM
#define ATT_PLAN_PER_SM 2     /* blocks planned per SM */
#endif
#ifndef ATT_STAGES
#define ATT_STAGES 4          /* pipeline stages per warp up to head_dim 256 */
#endif

template <int CPL> struct att_cfg {
    enum {
        Q = 8 / CPL,                  /* query heads per block */
        R = 32 / Q,                   /* rows per chunk: R x Q = 32 pairs, one per lane */
        S = CPL == 1 ? ATT_STAGES : 2, /* pipeline stages per warp */
    };
};

/* Split length for a context of n positions cut into at most ns splits;
 * the host plans ns, both kernels derive sl and the splits used. */
__host__ __device__ static inline int att_split_len(int n, int ns) {
    int sl = (n + ns - 1) / ns;
    sl = (sl + ATT_GRAN - 1) / ATT_GRAN * ATT_GRAN;
    return sl < ATT_GRAN ? ATT_GRAN : sl;
}

/* What block (split, query group, token) of a launch covers, from the
 * context's first position pos0: query heads h0 .. h0 + nq - 1 of KV head
 * kvh, token t's positions j0 .. j0 + len - 1 (causal: t sees pos0 + t +
 * 1). False when the split lies past the context (it exits, not merged). */
typedef struct {
    int split, kvh, t, h0, nq, j0, len;
} att_block;

template <int Q>
__device__ __forceinline__ bool att_block_of(const tern_cuda_attn_dims &dm, int pos0, int T, int ns, att_block &b) {
    int n_last = pos0 + T, sl = att_split_len(n_last, ns), used = (n_last + sl - 1) / sl;
    b.split = blockIdx.x;
    int G = dm.n_heads / dm.n_kv, ngq = (G + Q - 1) / Q;
    b.kvh = blockIdx.y / ngq;
    b.t = blockIdx.z;
    b.h0 = b.kvh * G + (blockIdx.y % ngq) * Q;
    b.nq = min(Q, b.kvh * G + G - b.h0);
    b.j0 = b.split * sl;
    b.len = max(0, min(sl, pos0 + b.t + 1 - b.j0));   /* (0 past the context) */
    return b.split < used;
}

/* ---- the split kernel ------------------------------------------------------ */

/* Shared memory of a stage row: K values, V values (vb bytes each: the
 * head's slice), K and V scale/bias regions (sbb bytes each: the row's
 * whole region, 8/4 bits), padded to 128 bytes so the lanes reading
 * different rows (the score slots) hit different banks. */
struct att_geom {
    int vb, sbb, rowst;
};
__host__ __device__ static inline att_geom att_geom_of(int hd, int bits, int n_groups) {
    att_geom g;
    g.vb = (hd * bits / 8 + 15) / 16 * 16;
    g.sbb = bits == 16 ? 0 : (4 * n_groups + 15) / 16 * 16;
    g.rowst = (2 * g.vb + 2 * g.sbb + 127) / 128 * 128;
    return g;
}

/* Copies chunk c of the split (rows j0 + c R ..; rows at or past len as
 * zeros) into a stage: each lane its 8-value pieces of the head slice of
 * K and V, the lanes together the rows' scale/bias regions. ALIGNED: by
 * cp.async (one commit group per stage, committed by the caller); else by
 * plain loads (tiny test rows whose pieces are not aligned). */
template <int BITS, bool ALIGNED, int CPL>
__device__ __forceinline__ void att_issue(uint8_t *st, const att_geom &gm, const kv_layout &L, const uint8_t *kc,
                                          const uint8_t *vc, int j0, int c, int len, int first, int C, int lane) {
    constexpr int R = att_cfg<CPL>::R;
#pragma unroll
    for (int r = 0; r < R; r++) {
        int jj = c * R + r;
        bool ok = jj < len;
        size_t ro = (size_t)(j0 + (ok ? jj : 0)) * L.row_bytes;
        const uint8_t *kr = kc + ro, *vr = vc + ro;
        uint8_t *dst = st + (size_t)r * gm.rowst;
#pragma unroll
        for (int cc = 0; cc < CPL; cc++) {
            int ch = lane + 32 * cc;
            if (ch < C) {
                size_t off = (size_t)(first + 8 * ch) * BITS / 8;   /* BITS bytes a piece */
                if (ALIGNED) {
                    cp_async_zfill<BITS>(dst + ch * BITS, kr + off, ok);
                    cp_async_zfill<BITS>(dst + gm.vb + ch * BITS, vr + off, ok);
                } else {
#pragma unroll
                    for (int b = 0; b < BITS; b++) {
                        dst[ch * BITS + b] = ok ? kr[off + b] : 0;
                        dst[gm.vb + ch * BITS + b] = ok ? vr[off + b] : 0;
                    }
                }
            }
        }
        if (BITS != 16) {
            uint8_t *ks = dst + 2 * gm.vb, *vs = ks + gm.sbb;
            if (ALIGNED) {   /* the region: n_groups 4-byte pieces, 4-aligned with the rows */
                for (int p = lane; p < L.n_groups; p += 32) {
                    cp_async_zfill<4>(ks + 4 * p, kr + L.q_bytes + 4 * p, ok);
                    cp_async_zfill<4>(vs + 4 * p, vr + L.q_bytes + 4 * p, ok);
                }
            } else {
                for (int p = lane; p < 2 * L.n_groups; p += 32) {
                    ((uint16_t *)ks)[p] = ok ? ((const uint16_t *)(kr + L.q_bytes))[p] : 0;
                    ((uint16_t *)vs)[p] = ok ? ((const uint16_t *)(vr + L.q_bytes))[p] : 0;
                }
            }
        }
    }
}

/* Values 8 ch .. 8 ch + 7 of a staged row slice (vals), dequantized with
 * the staged scale/bias region sb (8/4 bits); zeros for ch >= C. */
template <int BITS>
__device__ __forceinline__ void att_piece(const uint8_t *vals, const uint8_t *sb, const kv_layout &L, int first,
                                          int ch, int C, float (&v)[8]) {
    if (ch < C) {
        kv_load8<BITS>(vals, 8 * ch, true, v);
        if (BITS != 16) {
            int g = (first + 8 * ch) / L.group;
            float s = h2f(((const uint16_t *)sb)[g]), b = h2f(((const uint16_t *)sb)[L.n_groups + g]);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = fmaf(v[e], s, b);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = 0.0f;
    }
}

/* One reduce-scatter step: slots [0, H) += the partner's (lane ^ H) slots
 * [H, 2H). */
template <int H> __device__ __forceinline__ void rs_step(float (&v)[32]) {
#pragma unroll
    for (int j = 0; j < H; j++) v[j] += __shfl_xor_sync(0xffffffffu, v[j + H], H);
}

/* The end of a split block: the warps' records (mo [W][Q][hd] unnormalised
 * outputs, wm / wl [W][Q] maxima and exp-sums, in shared memory and
 * synchronised) merged in warp order and written as the split's record of
 * each of its nq queries; LOCAL (the cluster's merge, part unused): kept in
 * shared memory instead, the outputs over warp 0's (each thread reads its
 * (query, dims) of every warp before writing them: in place is safe) and the
 * (max, sum) per query in tot. */
template <int Q, bool LOCAL = false>
__device__ void att_finish(float *mo, const float *wm, const float *wl, float *wgt, float *tot, int hd, int nq,
                           int t, int nh, int h0, int ns, int split, int T, float *part) {
    if (threadIdx.x < Q) {
        int i = threadIdx.x;
        float M = -INFINITY, l = 0.0f;
        for (int w = 0; w < ATT_W; w++) M = fmaxf(M, wm[w * Q + i]);
        for (int w = 0; w < ATT_W; w++) {
            float mw = wm[w * Q + i], a = mw > -INFINITY ? expf(mw - M) : 0.0f;
            wgt[w * Q + i] = a;
            l = fmaf(a, wl[w * Q + i], l);
        }
        tot[2 * i] = M;
        tot[2 * i + 1] = l;
    }
    __syncthreads();
    size_t rec0 = ((size_t)t * nh + h0) * ns + split;   /* record of query 0; query i: + i * ns */
    float *po = part, *pml = part + (size_t)T * nh * ns * hd;
    int hd4 = hd / 4;
    for (int it = threadIdx.x; it < nq * hd4; it += blockDim.x) {
        int i = it / hd4, d = (it - i * hd4) * 4;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < ATT_W; w++) {
            float a = wgt[w * Q + i];
            float4 x = *(const float4 *)(mo + ((size_t)w * Q + i) * hd + d);
            acc.x = fmaf(a, x.x, acc.x); acc.y = fmaf(a, x.y, acc.y);
            acc.z = fmaf(a, x.z, acc.z); acc.w = fmaf(a, x.w, acc.w);
        }
        if constexpr (LOCAL) {
            *(float4 *)(mo + (size_t)i * hd + d) = acc;
        } else {
            size_t rec = rec0 + (size_t)i * ns;
            *(float4 *)(po + rec * hd + d) = acc;
            if (d == 0) {
                pml[2 * rec] = tot[2 * i];
                pml[2 * rec + 1] = tot[2 * i + 1];
            }
        }
    }
}

template <int BITS, bool ALIGNED, int CPL>
__global__ void __launch_bounds__(ATT_W * 32, ATT_BLOCKS_PER_SM)
    attn_split_kernel(tern_cuda_attn_dims dm, kv_layout L, att_geom gm, const float *qg, const uint8_t *kc,
                      const uint8_t *vc, int pos0, const int *pos_dev, int T, int ns, float scale, float *part) {
    constexpr int Q = att_cfg<CPL>::Q, R = att_cfg<CPL>::R, S = att_cfg<CPL>::S;
    extern __shared__ __align__(16) uint8_t smem[];
    pdl_wait();      /* q and the current rows come from attn_prep */
    pdl_trigger();
    att_block b;
    if (!att_block_of<Q>(dm, pos_dev ? *pos_dev : pos0, T, ns, b)) return;
    const int split = b.split, kvh = b.kvh, t = b.t, h0 = b.h0, nq = b.nq, j0 = b.j0, len = b.len;
    int hd = dm.head_dim, nh = dm.n_heads;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int first = kvh * hd, C = hd / 8;   /* the head's first value in a row; 8-value pieces */
    int stage_bytes = R * gm.rowst;
    uint8_t *wst = smem + (size_t)warp * S * stage_bytes;
    size_t stage_all = (size_t)ATT_W * S * stage_bytes, merge_all = (size_t)ATT_W * Q * hd * sizeof(float);
    float *xb = (float *)(smem + (stage_all > merge_all ? stage_all : merge_all)) + warp * (32 + Q);
    int nchunks = (len + R - 1) / R, mine = nchunks > warp ? (nchunks - warp + ATT_W - 1) / ATT_W : 0;

    /* the first S - 1 chunks in flight before anything else */
#pragma unroll
    for (int k = 0; k < S - 1; k++) {
        if (k < mine) att_issue<BITS, ALIGNED, CPL>(wst + k * stage_bytes, gm, L, kc, vc, j0, warp + k * ATT_W, len,
                                                    first, C, lane);
        cp_async_commit();
    }

    /* the queries: slot i holds query i ^ ix (see the top) */
    int ix = lane & (Q - 1), rx = lane / Q;
    float qr[Q][CPL * 8];
#pragma unroll
    for (int i = 0; i < Q; i++) {
        int qi = i ^ ix;
#pragma unroll
        for (int cc = 0; cc < CPL; cc++) {
            int ch = lane + 32 * cc;
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
            if (qi < nq && ch < C) {
                const float4 *qp = (const float4 *)(qg + ((size_t)t * nh + h0 + qi) * 2 * hd + 8 * ch);
                a = qp[0];
                b = qp[1];
            }
            qr[i][cc * 8 + 0] = a.x; qr[i][cc * 8 + 1] = a.y; qr[i][cc * 8 + 2] = a.z; qr[i][cc * 8 + 3] = a.w;
            qr[i][cc * 8 + 4] = b.x; qr[i][cc * 8 + 5] = b.y; qr[i][cc * 8 + 6] = b.z; qr[i][cc * 8 + 7] = b.w;
        }
    }
    float o[Q][CPL * 8];
#pragma unroll
    for (int i = 0; i < Q; i++)
#pragma unroll
        for (int e = 0; e < CPL * 8; e++) o[i][e] = 0.0f;
    float m = -INFINITY, lsum = 0.0f;   /* this lane's query ix: running max, its rows' exp-sum */

    for (int k = 0; k < mine; k++) {
        if (k + S - 1 < mine)
            att_issue<BITS, ALIGNED, CPL>(wst + ((k + S - 1) % S) * stage_bytes, gm, L, kc, vc, j0,
                                          warp + (k + S - 1) * ATT_W, len, first, C, lane);
        cp_async_commit();
        cp_async_wait<S - 1>();   /* this lane's copies of chunk k */
        __syncwarp();             /* and everyone's */
        const uint8_t *st = wst + (k % S) * stage_bytes;
        int nr = min(R, len - (warp + k * ATT_W) * R);   /* rows of the chunk in the context, >= 1 */

        /* partial scores of slot (r, i) = pair ((r ^ rx), (i ^ ix)) */
        float v[32];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint8_t *row = st + (size_t)(r ^ rx) * gm.rowst;
            float kf[CPL][8];
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) att_piece<BITS>(row, row + 2 * gm.vb, L, first, lane + 32 * cc, C, kf[cc]);
#pragma unroll
            for (int i = 0; i < Q; i++) {
                float a = 0.0f;
#pragma unroll
                for (int cc = 0; cc < CPL; cc++)
#pragma unroll
                    for (int e = 0; e < 8; e++) a = fmaf(qr[i][cc * 8 + e], kf[cc][e], a);
                v[r * Q + i] = a;
            }
        }
        /* reduce-scatter: slot k of lane l holds pair k ^ l; at each step
         * keep the lower half, add the partner's copy of it */
        rs_step<16>(v);
        rs_step<8>(v);
        rs_step<4>(v);
        rs_step<2>(v);
        rs_step<1>(v);
        /* lane l: row rx, query ix */
        float s = rx < nr ? v[0] * scale : -INFINITY;
        float cm = s;
#pragma unroll
        for (int off = Q; off < 32; off <<= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
        float mn = fmaxf(m, cm);   /* finite: row 0 is in the context */
        float alpha = expf(m - mn), p = expf(s - mn);
        lsum = fmaf(lsum, alpha, p);
        m = mn;
        bool rescale = __any_sync(0xffffffffu, alpha != 1.0f);
        xb[lane] = p;                       /* [R][Q] */
        if (lane < Q) xb[32 + lane] = alpha;
        __syncwarp();
        if (rescale) {
#pragma unroll
            for (int i = 0; i < Q; i++) {
                float a = xb[32 + i];
#pragma unroll
                for (int e = 0; e < CPL * 8; e++) o[i][e] *= a;
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                const uint8_t *row = st + (size_t)r * gm.rowst;
                float vf[CPL][8];
#pragma unroll
                for (int cc = 0; cc < CPL; cc++)
                    att_piece<BITS>(row + gm.vb, row + 2 * gm.vb + gm.sbb, L, first, lane + 32 * cc, C, vf[cc]);
                float pr[Q];
#pragma unroll
                for (int i = 0; i < Q; i += 4) {
                    float4 a = *(const float4 *)(xb + r * Q + i);
                    pr[i] = a.x; pr[i + 1] = a.y; pr[i + 2] = a.z; pr[i + 3] = a.w;
                }
#pragma unroll
                for (int i = 0; i < Q; i++)
#pragma unroll
                    for (int cc = 0; cc < CPL; cc++)
#pragma unroll
                        for (int e = 0; e < 8; e++) o[i][cc * 8 + e] = fmaf(pr[i], vf[cc][e], o[i][cc * 8 + e]);
            }
        }
        __syncwarp();   /* the stage and xb are rewritten next */
    }
#pragma unroll
    for (int off = Q; off < 32; off <<= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, off);

    /* merge the warps in shared memory (the stages are free now) */
    cp_async_wait<0>();
    __syncthreads();
    float *mo = (float *)smem;   /* [W][Q][hd] */
    float *wm = (float *)(smem + (stage_all > merge_all ? stage_all : merge_all)) + ATT_W * (32 + Q);
    float *wl = wm + ATT_W * Q, *wgt = wl + ATT_W * Q, *tot = wgt + ATT_W * Q;   /* [W][Q] x3, [Q][2] */
#pragma unroll
    for (int i = 0; i < Q; i++)
#pragma unroll
        for (int cc = 0; cc < CPL; cc++) {
            int ch = lane + 32 * cc;
            if (ch < C) {
                float4 *dst = (float4 *)(mo + ((size_t)warp * Q + i) * hd + 8 * ch);
                dst[0] = make_float4(o[i][cc * 8 + 0], o[i][cc * 8 + 1], o[i][cc * 8 + 2], o[i][cc * 8 + 3]);
                dst[1] = make_float4(o[i][cc * 8 + 4], o[i][cc * 8 + 5], o[i][cc * 8 + 6], o[i][cc * 8 + 7]);
            }
        }
    if (lane < Q) {   /* lanes 0 .. Q-1: row 0, query lane */
        wm[warp * Q + lane] = m;
        wl[warp * Q + lane] = lsum;
    }
    __syncthreads();
    att_finish<Q>(mo, wm, wl, wgt, tot, hd, nq, t, nh, h0, ns, split, T, part);
}

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
static int att_tc_ok(const tern_cuda_attn_dims &d, const tern_kvq *L, bool al) {
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
static int att_cluster_splits(const tern_cuda_attn_dims *d, int T, int n, int ns) {
    if (T != 1) return 0;
    int cl = tc_cluster_max_hd(d->head_dim, d->n_kv), ncl = ns < cl ? ns : cl;
    if (ncl < 1 || (int64_t)n > (int64_t)ncl * ATT_CL_LEN) return 0;
    return ncl;
}

/* ---- the merge of the splits ----------------------------------------------- */
/* o = sum_s e^{m_s - M} o_s / sum_s e^{m_s - M} l_s, times sigmoid(gate),
 * for head h, token t, dims z * 64 ..: the weights e^{m_s - M} once into
 * shared memory, then warp w sums splits w, w + 8, ... (a lane 2 dims) and
 * the warps' sums are added in order. */
#define COMBINE_DIMS 64
#define COMBINE_THREADS 256

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

__global__ void __launch_bounds__(COMBINE_THREADS)
    attn_combine_kernel(tern_cuda_attn_dims dm, const float *qg, const float *part, int pos0, const int *pos_dev, int T,
                        int ns, float *o) {
    extern __shared__ float w[];   /* [ns] */
    __shared__ float red[32];
    __shared__ float2 sum[COMBINE_THREADS / 32][32];
    pdl_wait();   /* the splits' records */
    pdl_trigger();
    if (pos_dev) pos0 = *pos_dev;
    int n_last = pos0 + T, sl = att_split_len(n_last, ns), used = (n_last + sl - 1) / sl;
    int h = blockIdx.x, t = blockIdx.y, hd = dm.head_dim, nh = dm.n_heads;
    size_t rec0 = ((size_t)t * nh + h) * ns;
    const float *ml = part + (size_t)T * nh * ns * hd + 2 * rec0;
    float M = -INFINITY;
    for (int s = threadIdx.x; s < used; s += blockDim.x) M = fmaxf(M, ml[2 * s]);
    M = block_reduce(M, red, true);
    float L = 0.0f;
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        float m = ml[2 * s];
        w[s] = m > -INFINITY ? expf(m - M) : 0.0f;
        L += w[s] * ml[2 * s + 1];
    }
    L = block_reduce(L, red, false);   /* its barriers also publish w[] */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, d = blockIdx.z * COMBINE_DIMS + 2 * lane;
    float2 acc = make_float2(0.f, 0.f);
    if (d < hd) {
        const float *po = part + rec0 * hd + d;
#pragma unroll 4
        for (int s = warp; s < used; s += COMBINE_THREADS / 32) {
            float2 x = *(const float2 *)(po + (size_t)s * hd);
            acc.x = fmaf(w[s], x.x, acc.x);
            acc.y = fmaf(w[s], x.y, acc.y);
        }
    }
    sum[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && d < hd) {
        for (int i = 1; i < COMBINE_THREADS / 32; i++) {
            acc.x += sum[i][lane].x;
            acc.y += sum[i][lane].y;
        }
        const float *gate = qg + ((size_t)t * nh + h) * 2 * hd + hd + d;
        float2 r = make_float2(acc.x / L * sigmoid_f(gate[0]), acc.y / L * sigmoid_f(gate[1]));
        *(float2 *)(o + ((size_t)t * nh + h) * hd + d) = r;
    }
}

/* ---- planning and launch --------------------------------------------------- */

/* 8-value pieces per lane: 1 up to head_dim 256, 2 up to 512 */
static int att_cpl(int hd) { return hd <= 256 ? 1 : 2; }

/* Splits of a launch for T tokens planned for contexts up to n: about
 * ATT_PLAN_PER_SM blocks per SM, none shorter than ATT_GRAN. */
static int att_splits(const tern_cuda_attn_dims *d, int T, int n) {
    int Q = 8 / att_cpl(d->head_dim), G = d->n_heads / d->n_kv;
    int groups = d->n_kv * ((G + Q - 1) / Q) * T;
    int want = (ATT_PLAN_PER_SM * tern_cuda_sm_count() + groups - 1) / groups, cap = (n + ATT_GRAN - 1) / ATT_GRAN;
    int ns = want < cap ? want : cap;
    return ns < 1 ? 1 : ns;
}

/* Any T' <= T may use the workspace sized for T (the engine sizes it for
 * its largest step), and T' * ns(T') is not monotonic in T'. */
size_t tern_cuda_attention_workspace(const tern_cuda_attn_dims *d, int T, int n_ctx_max) {
    size_t most = 0;
    for (int t = 1; t <= T; t++) {
        size_t r = (size_t)t * att_splits(d, t, n_ctx_max);
        if (r > most) most = r;
    }
    return most * d->n_heads * (d->head_dim + 2) * sizeof(float);
}

template <int BITS, bool ALIGNED, int CPL>
static cudaError_t launch_split(int ns, int T, cudaStream_t s, const tern_cuda_attn_dims &d, const kv_layout &L,
                                const float *qg, const uint8_t *kc, const uint8_t *vc, int pos0, const int *pos_dev,
                                float scale, float *part) {
    constexpr int Q = att_cfg<CPL>::Q, R = att_cfg<CPL>::R, S = att_cfg<CPL>::S;
    att_geom gm = att_geom_of(d.head_dim, BITS, L.n_groups);
    size_t stage_all = (size_t)ATT_W * S * R * gm.rowst, merge_all = (size_t)ATT_W * Q * d.head_dim * sizeof(float);
    size_t smem = (stage_all > merge_all ? stage_all : merge_all) +
                  ((size_t)ATT_W * (32 + Q) + 3 * ATT_W * Q + 2 * Q) * sizeof(float);
    int G = d.n_heads / d.n_kv, ngq = (G + Q - 1) / Q;
    cudaFuncSetAttribute(attn_split_kernel<BITS, ALIGNED, CPL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return launch_pdl(attn_split_kernel<BITS, ALIGNED, CPL>, dim3(ns, d.n_kv * ngq, T), dim3(ATT_W * 32), smem, s, d,
                      L, gm, qg, kc, vc, pos0, pos_dev, T, ns, scale, part);
}

template <int BITS>
static cudaError_t launch_split_bits(bool al, int cpl, int ns, int T, cudaStream_t s, const tern_cuda_attn_dims &d,
                                     const kv_layout &L, const float *qg, const uint8_t *kc, const uint8_t *vc, int pos0,
                                     const int *pos_dev, float scale, float *part) {
    if (cpl == 1)
        return al ? launch_split<BITS, true, 1>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part)
                  : launch_split<BITS, false, 1>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part);
    return al ? launch_split<BITS, true, 2>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part)
              : launch_split<BITS, false, 2>(ns, T, s, d, L, qg, kc, vc, pos0, pos_dev, scale, part);
}

/* The attention's dims against the KV layout. */
static bool att_dims_ok(const tern_cuda_attn_dims *d, const tern_kvq *L) {
    const int hd = d->head_dim;
    return hd % 8 == 0 && hd <= 512 && L->head_dim == hd && L->n_heads == d->n_kv && d->n_heads % d->n_kv == 0 &&
           (L->bits == 16 || L->group % 8 == 0);
}

/* cp.async of the pieces: 16/8/4 bytes at 16/8/4 bits need rows and bases
 * aligned to as much (and 8/4 bits then keep the scale regions 4-aligned). */
static bool att_aligned(const tern_kvq *L, const uint8_t *kcache, const uint8_t *vcache) {
    const size_t need = L->bits == 16 ? 16 : L->bits == 8 ? 8 : 4;
    return L->row_bytes % need == 0 && (uintptr_t)kcache % need == 0 && (uintptr_t)vcache % need == 0;
}

/* n_plan >= pos0 + T plans the splits (the kernels read pos0 from pos_dev
 * when given, so one plan serves every position up to n_plan). */
static int attention(const tern_cuda_attn_dims *d, const tern_kvq *L, const float *qg, const uint8_t *kcache,
                     const uint8_t *vcache, int T, int pos0, const int *pos_dev, int n_plan, float scale, void *work,
                     size_t work_bytes, float *o, tern_stream s, tern_error *err) {
    int hd = d->head_dim;
    if (T < 1 || pos0 < 0 || !att_dims_ok(d, L))
        return tern_fail(err, "attention: dims do not match the KV layout (head_dim %d)", hd);
    if ((uintptr_t)qg % 16 || (uintptr_t)o % 16 || (uintptr_t)work % 16)
        return tern_fail(err, "attention: q, output and workspace must be 16-byte aligned");
    int ns = att_splits(d, T, n_plan), cpl = att_cpl(hd);
    size_t need = (size_t)T * d->n_heads * ns * (hd + 2) * sizeof(float);
    if (need > work_bytes) return tern_fail(err, "attention: workspace %zu bytes, %zu needed", work_bytes, need);
    bool al = att_aligned(L, kcache, vcache);
    kv_layout kl = kv_of(L);
    float *part = (float *)work;
    cudaError_t e;
    int ncl = att_tc_ok(*d, L, al) ? att_cluster_splits(d, T, n_plan, ns) : 0;
    if (ncl) {   /* the splits merged in their cluster: no combine */
        e = launch_split_tc_hd<true>(ncl, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part, o);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return tern_fail(err, "attention split (cluster): %s", cudaGetErrorString(e));
        }
        return 0;
    }
    if (att_tc_ok(*d, L, al))
        e = launch_split_tc_hd<false>(ns, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part, o);
    else if (L->bits == 16) e = launch_split_bits<16>(al, cpl, ns, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part);
    else if (L->bits == 8) e = launch_split_bits<8>(al, cpl, ns, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part);
    else e = launch_split_bits<4>(al, cpl, ns, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part);
    if (e != cudaSuccess) {
        cudaGetLastError();   /* not left behind for the next check */
        return tern_fail(err, "attention split: %s", cudaGetErrorString(e));
    }
    dim3 cgrid(d->n_heads, T, (hd + COMBINE_DIMS - 1) / COMBINE_DIMS);
    e = launch_pdl(attn_combine_kernel, cgrid, dim3(COMBINE_THREADS), (size_t)ns * sizeof(float), s, *d, qg, part,
                   pos0, pos_dev, T, ns, o);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tern_fail(err, "attention combine: %s", cudaGetErrorString(e));
    }
    return 0;
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
