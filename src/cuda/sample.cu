/* Token choice on the GPU, so only the id crosses the bus: argmax, and
 * temperature / top-k / top-p / min-p sampling with the rules of
 * engine/sampler.h.
 *
 * Both work in two stages. Stage 1: each block takes a slice of the
 * vocabulary (SLICE ids) and keeps its best candidates (argmax: one; sample:
 * the top_k of the slice, found by a radix selection on the values' bits,
 * not a sort). Stage 2: one block selects the top_k of the candidates the
 * same way, ranks those few, and one thread walks them: weights exp(l -
 * max), top-p over what top-k kept, min-p against the best, then the draw
 * at u. Order: larger logit first, lower id first among equals; NaN counts
 * as -inf.
 *
 * One launch (TERN_SAMPLE_ONE=0: two): stage 2 runs in the stage-1 block
 * that finishes last (an acquire-release count in the workspace, left zero
 * for the next call), and the launch is a programmatic dependent one that
 * waits for the logits' kernel before reading them, so neither stage pays a
 * launch after the lm_head ends. */
#include <float.h>

#include "cuda/common.cuh"

#define SLICE 4096            /* ids per stage-1 block: 1024 threads x 4 */
#define MERGE 8192            /* stage-2 capacity: ceil(248320 / 4096) x 64 = 3904 fits */

static int one_launch(void) {
    static int on = -1;
    return switch_on(&on, "TERN_SAMPLE_ONE");
}

typedef struct {
    float v;
    int id;
} cand;

__device__ __forceinline__ bool before(cand a, cand b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

__device__ __forceinline__ float clean(float x) { return x != x ? -INFINITY : x; }

/* The workspace: the one launch's count of finished slices (zero between
 * calls; first, so that calls over different n_valid find it in one
 * place), then stage 1's candidates (TERN_CUDA_SAMPLE_MAX_K a slice) and
 * their thresholds. */
#define WORK_HEAD 16   /* bytes before the candidates: the count, padded to their alignment */

typedef struct {
    cand *cands;
    unsigned *thr, *done;
} sample_work;

static sample_work work_of(void *w, int nb) {
    sample_work t;
    t.done = (unsigned *)w;
    t.cands = (cand *)((uint8_t *)w + WORK_HEAD);
    t.thr = (unsigned *)(t.cands + (size_t)nb * TERN_CUDA_SAMPLE_MAX_K);
    return t;
}

/* ---- argmax ------------------------------------------------------------ */

__device__ cand block_best(cand m, cand *red) {
    for (int o = 16; o; o >>= 1) {
        cand x = {__shfl_xor_sync(0xffffffffu, m.v, o), __shfl_xor_sync(0xffffffffu, m.id, o)};
        if (before(x, m)) m = x;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = m;
    __syncthreads();
    cand b = red[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++)
        if (before(red[i], b)) b = red[i];
    return b;
}

/* The drawn id into *id and, when given, *id2 (a device copy beside a
 * host-mapped *id: the next step's embedding reads it, tern_cuda_embed_prev). */
__device__ __forceinline__ void put_id(int32_t v, int32_t *id, int32_t *id2) {
    *id = v;
    if (id2) *id2 = v;
}

/* Stage 2 of argmax: the best of nb slices' best (any block size). */
__device__ void argmax_pick(const cand *in, int nb, int32_t *id, int32_t *id2, cand *red) {
    cand m = {-INFINITY, 0x7fffffff};
    for (int i = threadIdx.x; i < nb; i += blockDim.x)
        if (before(in[i], m)) m = in[i];
    cand b = block_best(m, red);
    /* all -inf: id 0, as the CPU's argmax */
    if (threadIdx.x == 0) put_id(b.id == 0x7fffffff ? 0 : b.id, id, id2);
}

template <bool ONE>
__global__ void argmax_slices(const float *l, int n, cand *out, unsigned *done, int32_t *id, int32_t *id2) {
    __shared__ cand red[32];
    pdl_wait();   /* the logits (a no-op in an ordinary launch) */
    pdl_trigger();
    cand m = {-INFINITY, 0x7fffffff};
    int end = min(n, (blockIdx.x + 1) * SLICE);
    for (int i = blockIdx.x * SLICE + threadIdx.x; i < end; i += blockDim.x) {
        cand c = {clean(l[i]), i};
        if (before(c, m)) m = c;
    }
    cand b = block_best(m, red);
    if (threadIdx.x == 0) out[blockIdx.x] = b;
    if (ONE && grid_last_block(done)) argmax_pick(out, gridDim.x, id, id2, red);
}

__global__ void argmax_merge(const cand *in, int nb, int32_t *id, int32_t *id2) {
    __shared__ cand red[32];
    argmax_pick(in, nb, id, id2, red);
}

size_t tern_cuda_sample_workspace(int n_valid) {
    int nb = ceil_div(n_valid, SLICE);
    return WORK_HEAD + (size_t)nb * (TERN_CUDA_SAMPLE_MAX_K * sizeof(cand) + sizeof(unsigned));
}

int tern_cuda_argmax(const float *logits, int n_valid, void *work, int32_t *id, int32_t *id2, tern_stream s,
                     tern_error *err) {
    if (n_valid < 1) return tern_fail(err, "argmax: no logits");
    int nb = ceil_div(n_valid, SLICE);
    sample_work t = work_of(work, nb);
    if (one_launch()) {
        cudaError_t e = launch_pdl(argmax_slices<true>, dim3(nb), dim3(256), 0, s, logits, n_valid, t.cands, t.done, id, id2);
        if (e != cudaSuccess) return tern_fail(err, "argmax: %s", cudaGetErrorString(e));
        return launch_check("argmax", err);
    }
    argmax_slices<false><<<nb, 256, 0, s>>>(logits, n_valid, t.cands, t.done, id, NULL);
    if (launch_check("argmax", err)) return -1;
    argmax_merge<<<1, 1024, 0, s>>>((const cand *)t.cands, nb, id, id2);
    return launch_check("argmax merge", err);
}

/* ---- top-k / top-p / min-p sampling ------------------------------------ */

/* A float's order as an unsigned key (larger float, larger key; -0 and +0
 * one key, since they tie as floats); 0 is below every float's key and
 * marks padding. */
__device__ __forceinline__ unsigned key_of(float v) {
    unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

typedef struct {
    unsigned hist[256];
    unsigned prefix, need;   /* the selection's result */
    unsigned taken;          /* output slots used */
} select_smem;

/* Radix selection over a block's keys (N per thread, bit j of `mask` says
 * key[j] takes part): afterwards sm->prefix is the key t with fewer than k
 * masked keys above it and at least k at or above it, and sm->need = k -
 * (the count above t), how many keys equal to t complete the top k. Four
 * passes of 8 bits, each a shared histogram of the keys that match the
 * digits chosen so far (one atomic per distinct digit per warp), and one warp
 * finding the digit where the count from the top reaches what is still
 * needed. The caller makes sure at least k keys take part. */
template <int N>
__device__ void radix_select(const unsigned (&key)[N], unsigned mask, unsigned k, select_smem *sm) {
    unsigned prefix = 0, hi = 0, need = k;
    int lane = threadIdx.x & 31;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) sm->hist[i] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < N; j++) {
            bool in = (mask >> j & 1u) && (key[j] & hi) == prefix;
            unsigned d = (key[j] >> shift) & 255u;
            unsigned act = __ballot_sync(0xffffffffu, in);
            if (in) {
                unsigned peers = __match_any_sync(act, d);
                if (lane == __ffs(peers) - 1) atomicAdd(&sm->hist[d], (unsigned)__popc(peers));
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            /* lane l holds bins 255 - 8l down to 248 - 8l: lane order is
             * descending digit order, so an inclusive scan over lanes
             * counts the keys at or above each lane's lowest bin */
            unsigned c[8], sum = 0;
#pragma unroll
            for (int b = 0; b < 8; b++) sum += c[b] = sm->hist[255 - 8 * lane - b];
            unsigned incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += y;
            }
            unsigned run = incl - sum;
            if (run < need && need <= incl) {
                for (int b = 0; b < 8; b++) {
                    if (run + c[b] >= need) {
                        sm->prefix = prefix | (unsigned)(255 - 8 * lane - b) << shift;
                        sm->need = need - run;
                        break;
                    }
                    run += c[b];
                }
            }
        }
        __syncthreads();
        prefix = sm->prefix;
        need = sm->need;
        hi |= 255u << shift;
    }
}

/* Of a block's keys (N per thread, unique ids), which are among its top k
 * in the order larger value first, lower id first among equals: bit j of
 * the result says key[j] is; *kth gets the k-th key. The ties at the
 * threshold are rare with real logits; when more tie than are needed, a
 * second selection over the inverted ids keeps the lowest. */
template <int N>
__device__ unsigned block_top_k(const unsigned (&key)[N], const int (&id)[N], unsigned mask, unsigned k,
                                select_smem *sm, unsigned *kth) {
    radix_select<N>(key, mask, k, sm);
    unsigned t = sm->prefix, need = sm->need, eq_mask = 0;
    *kth = t;
    int eq = 0;
#pragma unroll
    for (int j = 0; j < N; j++) {
        bool e = (mask >> j & 1u) && key[j] == t;
        eq_mask |= (unsigned)e << j;
        eq += __syncthreads_count(e);
    }
    unsigned top = 0;
#pragma unroll
    for (int j = 0; j < N; j++) top |= (unsigned)((mask >> j & 1u) && key[j] > t) << j;
    if ((unsigned)eq <= need) return top | eq_mask;
    unsigned inv[N];
#pragma unroll
    for (int j = 0; j < N; j++) inv[j] = ~(unsigned)id[j];
    radix_select<N>(inv, eq_mask, need, sm);
    unsigned lowest = sm->prefix;   /* the inverted id of the last tie kept */
#pragma unroll
    for (int j = 0; j < N; j++) top |= (unsigned)((eq_mask >> j & 1u) && inv[j] >= lowest) << j;
    return top;
}

#define SLICE_PER (SLICE / 1024)
#define MERGE_PER (MERGE / 1024)

__device__ void topk_pick(const cand *in, const unsigned *thr, int nb, int k, float top_p, float min_p,
                          const double *u, int32_t *id, int32_t *id2);

/* Stage 1: each block's k best of its SLICE ids, in no order (padding past
 * n as {-inf, 0x7fffffff}), and the key of its k-th best in thr. ONE: the
 * block that finishes last then runs stage 2 (topk_pick). */
template <bool ONE>
__global__ void __launch_bounds__(1024) topk_slices(const float *l, int n, float inv_t, int k, cand *out,
                                                    unsigned *thr, unsigned *done, float top_p, float min_p,
                                                    const double *u, int32_t *pick, int32_t *pick2) {
    __shared__ select_smem sm;
    unsigned key[SLICE_PER];
    int id[SLICE_PER];
    float v[SLICE_PER];
    pdl_wait();   /* the logits (a no-op in an ordinary launch) */
    pdl_trigger();
    if (threadIdx.x == 0) sm.taken = 0;
#pragma unroll
    for (int j = 0; j < SLICE_PER; j++) {
        id[j] = blockIdx.x * SLICE + j * 1024 + threadIdx.x;
        v[j] = id[j] < n ? clean(l[id[j]]) * inv_t : -INFINITY;
        key[j] = id[j] < n ? key_of(v[j]) : 0u;
    }
    unsigned kth;
    unsigned top = block_top_k<SLICE_PER>(key, id, (1u << SLICE_PER) - 1, (unsigned)k, &sm, &kth);
    if (threadIdx.x == 0) thr[blockIdx.x] = kth;
#pragma unroll
    for (int j = 0; j < SLICE_PER; j++)
        if (top >> j & 1u) {
            unsigned slot = atomicAdd(&sm.taken, 1u);
            cand c = {-INFINITY, 0x7fffffff};
            if (key[j]) { c.v = v[j]; c.id = id[j]; }
            out[(size_t)blockIdx.x * k + slot] = c;
        }
    if (ONE && grid_last_block(done)) topk_pick(out, thr, gridDim.x, k, top_p, min_p, u, pick, pick2);
}

/* Stage 2: the k best of the m candidates, sorted best first. The k-th
 * best overall is at least every block's k-th best, so only candidates at
 * or above the largest block threshold can be among the k: typically a
 * few hundred of the m survive, one per thread, and a radix selection over
 * them finds the k (over all m when more survive than there are threads:
 * many equal logits). Each of the k counts the others before it: its rank.
 * Then one thread walks them: weights exp(l - max), top-p, min-p, the draw
 * at *u. */
__device__ void topk_pick(const cand *in, const unsigned *thr, int nb, int k, float top_p, float min_p,
                          const double *u, int32_t *id, int32_t *id2) {
    __shared__ select_smem sm;
    __shared__ cand list[1024], sel[TERN_CUDA_SAMPLE_MAX_K], c[TERN_CUDA_SAMPLE_MAX_K];
    __shared__ unsigned warp_max[32], n_sel;
    const int m = nb * k, tid = threadIdx.x;
    unsigned key[MERGE_PER], mask = 0;
    int cid[MERGE_PER];
    float v[MERGE_PER];
    unsigned t = 0;
    for (int i = tid; i < nb; i += blockDim.x) t = max(t, thr[i]);
    t = __reduce_max_sync(0xffffffffu, t);
    if ((tid & 31) == 0) warp_max[tid >> 5] = t;
    if (tid == 0) sm.taken = n_sel = 0;
    if (tid < k) sel[tid] = (cand){-INFINITY, 0x7fffffff};
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++) {
        int i = j * 1024 + tid;
        cand x = {-INFINITY, 0x7fffffff};
        if (i < m) x = in[i];
        v[j] = x.v;
        cid[j] = x.id;
        key[j] = x.id == 0x7fffffff ? 0u : key_of(x.v);
        mask |= (unsigned)(i < m) << j;
    }
    __syncthreads();
    t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t = max(t, warp_max[w]);
    unsigned keep = 0, kth;
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++) keep |= (unsigned)((mask >> j & 1u) && key[j] >= t) << j;
    int n_keep = 0;
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++) n_keep += __syncthreads_count(keep >> j & 1u);
    if (n_keep <= (int)blockDim.x) {
        /* the survivors, one per thread, then the k among them */
#pragma unroll
        for (int j = 0; j < MERGE_PER; j++)
            if (keep >> j & 1u) list[atomicAdd(&sm.taken, 1u)] = (cand){v[j], cid[j]};
        __syncthreads();
        cand me = tid < n_keep ? list[tid] : (cand){-INFINITY, 0x7fffffff};
        unsigned k1[1] = {tid < n_keep ? key_of(me.v) : 0u};
        int i1[1] = {me.id};
        if (block_top_k<1>(k1, i1, tid < n_keep, (unsigned)k, &sm, &kth)) {
            unsigned slot = atomicAdd(&n_sel, 1u);
            if (slot < (unsigned)k) sel[slot] = me;
        }
    } else {
        keep = block_top_k<MERGE_PER>(key, cid, mask, (unsigned)k, &sm, &kth);
#pragma unroll
        for (int j = 0; j < MERGE_PER; j++)
            if (keep >> j & 1u) {
                unsigned slot = atomicAdd(&n_sel, 1u);
                if (slot < (unsigned)k) sel[slot] = (cand){v[j], cid[j]};
            }
    }
    __syncthreads();
    if (tid < k) {
        const cand me = sel[tid];
        int rank = 0;
        /* (only padding can repeat: equal entries rank by slot) */
        for (int i = 0; i < k; i++)
            rank += before(sel[i], me) || (i < tid && sel[i].v == me.v && sel[i].id == me.id);
        c[rank] = me;
    }
    __syncthreads();
    if (threadIdx.x) return;
    /* c[0 .. k) are the top-k, best first; weights relative to the best */
    double w[TERN_CUDA_SAMPLE_MAX_K], total = 0.0, cum = 0.0;
    float mx = c[0].v;
    int n = k;
    for (int i = 0; i < k; i++) {
        w[i] = c[i].id == 0x7fffffff ? 0.0 : (double)expf(c[i].v - mx);
        total += w[i];
    }
    if (top_p < 1.0f)
        for (int i = 0; i < n; i++) {
            cum += w[i];
            if (cum >= top_p * total) { n = i + 1; break; }
        }
    if (min_p > 0.0f)
        for (int i = 1; i < n; i++)
            if (w[i] < min_p * w[0]) { n = i; break; }
    double kept = 0.0;
    for (int i = 0; i < n; i++) kept += w[i];
    double target = *u * kept, run = 0.0;
    int pick = c[0].id;
    for (int i = 0; i < n; i++) {
        if (w[i] <= 0) continue;
        run += w[i];
        pick = c[i].id;
        if (target < run) break;
    }
    put_id(pick, id, id2);
}

__global__ void __launch_bounds__(1024) topk_merge(const cand *in, const unsigned *thr, int nb, int k, float top_p,
                                                   float min_p, const double *u, int32_t *id, int32_t *id2) {
    topk_pick(in, thr, nb, k, top_p, min_p, u, id, id2);
}

int tern_cuda_sample(const float *logits, int n_valid, float temperature, int top_k, float top_p, float min_p,
                     const double *u, void *work, int32_t *id, int32_t *id2, tern_stream s, tern_error *err) {
    if (n_valid < 1 || top_k < 1 || top_k > TERN_CUDA_SAMPLE_MAX_K || !(temperature > 0) || !u)
        return tern_fail(err, "sample: top_k %d (1..%d), temperature %g%s", top_k, TERN_CUDA_SAMPLE_MAX_K,
                         temperature, u ? "" : ", no u");
    int nb = ceil_div(n_valid, SLICE), k = top_k < n_valid ? top_k : n_valid;
    if ((int64_t)nb * k > MERGE) return tern_fail(err, "sample: %d ids x top_k %d exceed the merge", n_valid, top_k);
    sample_work t = work_of(work, nb);
    const float inv_t = 1.0f / temperature;
    if (one_launch()) {
        cudaError_t e = launch_pdl(topk_slices<true>, dim3(nb), dim3(1024), 0, s, logits, n_valid, inv_t, k, t.cands,
                                   t.thr, t.done, top_p, min_p, u, id, id2);
        if (e != cudaSuccess) return tern_fail(err, "sample: %s", cudaGetErrorString(e));
        return launch_check("sample", err);
    }
    topk_slices<false><<<nb, 1024, 0, s>>>(logits, n_valid, inv_t, k, t.cands, t.thr, t.done, top_p, min_p, u, id,
                                           NULL);
    if (launch_check("sample top-k", err)) return -1;
    topk_merge<<<1, 1024, 0, s>>>(t.cands, t.thr, nb, k, top_p, min_p, u, id, id2);
    return launch_check("sample merge", err);
}
