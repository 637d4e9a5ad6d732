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
 * a cluster instead of the combine kernel (att_cluster_merge,
 * attention_tc.cu). */
#include "cuda/attention.cuh"

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

cudaError_t att_combine(const tern_cuda_attn_dims &d, const float *qg, const float *part, int pos0, const int *pos_dev,
                        int T, int ns, float *o, cudaStream_t s) {
    dim3 cgrid(d.n_heads, T, (d.head_dim + COMBINE_DIMS - 1) / COMBINE_DIMS);
    return launch_pdl(attn_combine_kernel, cgrid, dim3(COMBINE_THREADS), (size_t)ns * sizeof(float), s, d, qg, part,
                      pos0, pos_dev, T, ns, o);
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
        e = att_launch_split_tc(true, ncl, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part, o);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return tern_fail(err, "attention split (cluster): %s", cudaGetErrorString(e));
        }
        return 0;
    }
    if (att_tc_ok(*d, L, al))
        e = att_launch_split_tc(false, ns, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part, o);
    else if (L->bits == 16) e = launch_split_bits<16>(al, cpl, ns, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part);
    else if (L->bits == 8) e = launch_split_bits<8>(al, cpl, ns, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part);
    else e = launch_split_bits<4>(al, cpl, ns, T, s, *d, kl, qg, kcache, vcache, pos0, pos_dev, scale, part);
    if (e != cudaSuccess) {
        cudaGetLastError();   /* not left behind for the next check */
        return tern_fail(err, "attention split: %s", cudaGetErrorString(e));
    }
    e = att_combine(*d, qg, part, pos0, pos_dev, T, ns, o, s);
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
