/* The split-K attention's shared parts (attention.cu describes the
 * method): the split plan, a block's share of the work, the merge of a
 * block's warps, and the tensor-core form's entry points for the host.
 *   attention.cu     the FP32 split kernel, the combine kernel, planning
 *                    and launch (tern_cuda_attention)
 *   attention_tc.cu  the split kernel on tensor cores (16-bit KV) and its
 *                    cluster form, which merges the splits itself */
#ifndef TERN_CUDA_ATTENTION_CUH
#define TERN_CUDA_ATTENTION_CUH

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

/* The splits' records in part (T x n_heads x ns outputs of head_dim, then
 * their (max, sum) pairs; a split a token does not reach: max -inf) merged
 * into o, times sigmoid(gate): attention.cu's combine, launched after the
 * kernel that wrote them (the prefill's split form uses it too). */
cudaError_t att_combine(const tern_cuda_attn_dims &d, const float *qg, const float *part, int pos0, const int *pos_dev,
                        int T, int ns, float *o, cudaStream_t s);

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


/* attention_tc.cu, for the host: whether the tensor-core kernel takes
 * these dims (else the FP32 kernel); the cluster form's splits for one
 * token planned for contexts up to n (0: the two-kernel form); and the
 * launch of the ns splits (cl: the cluster form, no combine after it). */
int att_tc_ok(const tern_cuda_attn_dims &d, const tern_kvq *L, bool al);
int att_cluster_splits(const tern_cuda_attn_dims *d, int T, int n, int ns);
cudaError_t att_launch_split_tc(bool cl, int ns, int T, cudaStream_t s, const tern_cuda_attn_dims &d,
                                const kv_layout &L, const float *qg, const uint8_t *kc, const uint8_t *vc, int pos0,
                                const int *pos_dev, float scale, float *part, float *o);

#endif
