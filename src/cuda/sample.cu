/* Token choice on the GPU, so only the id crosses the bus: argmax, and
 * temperature / top-k / top-p / min-p sampling with the rules of
 * engine/sampler.h.
 *
 * Both work in two stages. Stage 1: each block takes a slice of the
 * vocabulary (SLICE ids) and keeps its best candidates (argmax: one; sample:
 * the top_k of the slice, found by a radix selection on the values' bits,
 * not a sort). Stage 2: one block selects the top_k of the candidates the
 * same way, ranks those few, and one warp draws (draw_top): weights exp(l -
 * max), top-p over what top-k kept, min-p against the best, then the draw
 * at u, its sums in the CPU sampler's order. Order: larger logit first,
 * lower id first among equals; NaN counts as -inf, and so does an id a
 * grammar's mask leaves out (the CPU sampler's step 1).
 *
 * One launch: stage 2 runs in the stage-1 block
 * that finishes last (an acquire-release count in the workspace, left zero
 * for the next call), and the launch is a programmatic dependent one that
 * waits for the logits' kernel before reading them, so neither stage pays a
 * launch after the lm_head ends.
 *
 * Both stages first try a selection without radix passes (fast_top_k): a
 * lower bound of the k-th best from the
 * maxima of small groups of threads, then a rank count among the few keys
 * at or above it. Where more than FAST_CAP keys pass the bound (many equal
 * logits, the best ones in neighbouring ids) the radix selection runs. */
#include <float.h>

#include "cuda/common.cuh"
#include "cuda/trace.cuh"

#define SLICE 4096            /* ids per stage-1 block: 1024 threads x 4 */
#define MERGE 4096            /* stage-2 capacity: ceil(248320 / 4096) x 64 = 3904 fits */

typedef struct {
    float v;
    int id;
} cand;

__device__ __forceinline__ bool before(cand a, cand b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

__device__ __forceinline__ float clean(float x) { return x != x ? -INFINITY : x; }

/* Whether a grammar's mask (bit i of word i / 32; NULL: every id) allows id. */
__device__ __forceinline__ bool allowed(const uint32_t *mask, int id) {
    return !mask || (mask[id >> 5] >> (id & 31) & 1u);
}

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

__global__ void argmax_slices(const float *l, const uint32_t *mask, int n, cand *out, unsigned *done, int32_t *id,
                              int32_t *id2) {
    __shared__ cand red[32];
    pdl_wait();   /* the logits (a no-op in an ordinary launch) */
    pdl_trigger();
    cand m = {-INFINITY, 0x7fffffff};
    int end = min(n, (blockIdx.x + 1) * SLICE);
    for (int i = blockIdx.x * SLICE + threadIdx.x; i < end; i += blockDim.x) {
        cand c = {allowed(mask, i) ? clean(l[i]) : -INFINITY, i};
        if (before(c, m)) m = c;
    }
    cand b = block_best(m, red);
    if (threadIdx.x == 0) out[blockIdx.x] = b;
    if (grid_last_block(done)) argmax_pick(out, gridDim.x, id, id2, red);
}

size_t tern_cuda_sample_workspace(int n_valid) {
    int nb = ceil_div(n_valid, SLICE);
    return WORK_HEAD + (size_t)nb * (TERN_CUDA_SAMPLE_MAX_K * sizeof(cand) + sizeof(unsigned));
}

int tern_cuda_argmax(const float *logits, const uint32_t *mask, int n_valid, void *work, int32_t *id, int32_t *id2,
                     tern_stream s, tern_error *err) {
    if (n_valid < 1) return tern_fail(err, "argmax: no logits");
    int nb = ceil_div(n_valid, SLICE);
    sample_work t = work_of(work, nb);
    cudaError_t e = launch_pdl(argmax_slices, dim3(nb), dim3(256), 0, s, logits, mask, n_valid, t.cands, t.done, id, id2);
    if (e != cudaSuccess) return tern_fail(err, "argmax: %s", cudaGetErrorString(e));
    return launch_check("argmax", err);
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

/* ---- the selection without radix passes ------------------------------- */

/* Slots in a shared list for the lanes of a warp with `want` (in lane
 * order), by one shared add a warp instead of one a lane (the sampler's
 * span measured the same either way: docs/experiments/cuda-sampler.md). All 32
 * lanes call it. */
__device__ __forceinline__ unsigned warp_slot(unsigned *count, bool want) {
    const unsigned b = __ballot_sync(0xffffffffu, want);
    if (!b) return 0;
    const int lane = threadIdx.x & 31, leader = __ffs(b) - 1;
    unsigned base = 0;
    if (lane == leader) base = atomicAdd(count, (unsigned)__popc(b));
    return __shfl_sync(0xffffffffu, base, leader) + (unsigned)__popc(b & ((1u << lane) - 1u));
}

#define FAST_GROUPS 128   /* group maxima a block ranks */
#define FAST_CAP 128      /* keys at or above their bound the rank count takes: at most */

/* A key's order with its id: larger key first, then lower id. */
__device__ __forceinline__ unsigned long long order_of(unsigned key, int id) {
    return (unsigned long long)key << 32 | (unsigned)~id;
}

typedef struct {
    __align__(16) unsigned gmax[FAST_GROUPS];
    __align__(16) unsigned long long ord[FAST_CAP];   /* order_of, 0 past n */
    float v[FAST_CAP];
    int id[FAST_CAP];
    unsigned t, n;   /* the bound; the keys at or above it */
} fast_smem;

/* The top k of a block's keys (N per thread, bit j of `mask` says key[j]
 * takes part; keys of real values are above 0, ids unique but for
 * padding), sorted best first into out[0 .. k) (larger key first, then
 * lower id, then lower slot), the k-th key into *kth (when given). The first
 * FAST_GROUPS 2^gsh threads form FAST_GROUPS groups of 2^gsh lanes (the
 * keys of any threads beyond must be masked out); the k-th largest of the
 * groups' maxima is a lower bound t of the k-th best key, as the k groups
 * with the largest maxima hold k distinct keys at or above it. The keys at
 * or above t, typically k and a few more, are gathered in shared memory and
 * each counts the gathered keys before it: its rank. Four barriers and no
 * radix passes (radix_select: sixteen barriers and as many warp-wide
 * matches). Returns false (the same in every thread; nothing written) when
 * more than FAST_CAP keys or fewer than k pass the bound: many equal keys,
 * or the best ones in neighbouring threads of one group; the caller then
 * selects by radix passes. */
template <int N>
__device__ bool fast_top_k(const unsigned (&key)[N], const int (&id)[N], const float (&v)[N], unsigned mask, int gsh,
                           unsigned k, fast_smem *f, cand *out, unsigned *kth) {
    const int tid = threadIdx.x;
    unsigned m = 0;
#pragma unroll
    for (int j = 0; j < N; j++)
        if (mask >> j & 1u) m = max(m, key[j]);
    for (int o = 1; o < 1 << gsh; o <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((tid & ((1 << gsh) - 1)) == 0 && tid >> gsh < FAST_GROUPS) f->gmax[tid >> gsh] = m;
    if (tid < FAST_CAP) f->ord[tid] = 0;
    if (tid == 0) f->t = f->n = 0;
    __syncthreads();
    if (tid < FAST_GROUPS) {
        /* t: the group maximum with fewer than k above it and k or more at
         * or above it (the threads that find it write the same value) */
        const unsigned me = f->gmax[tid];
        unsigned gt = 0, ge = 0;
        const uint4 *g4 = (const uint4 *)f->gmax;
#pragma unroll 8
        for (int q = 0; q < FAST_GROUPS / 4; q++) {
            const uint4 x = g4[q];
            gt += (x.x > me) + (x.y > me) + (x.z > me) + (x.w > me);
            ge += (x.x >= me) + (x.y >= me) + (x.z >= me) + (x.w >= me);
        }
        if (gt < k && k <= ge) f->t = me;
    }
    __syncthreads();
    const unsigned t = f->t;   /* (0, every key, when fewer than k groups hold keys) */
#pragma unroll
    for (int j = 0; j < N; j++) {
        const bool want = (mask >> j & 1u) && key[j] >= t;
        const unsigned s = warp_slot(&f->n, want);
        if (want && s < FAST_CAP) {
            f->ord[s] = order_of(key[j], id[j]);
            f->v[s] = v[j];
            f->id[s] = id[j];
        }
    }
    __syncthreads();
    const unsigned n = f->n;
    if (n > FAST_CAP || n < k) return false;
    if (tid < (int)n) {
        /* entries past n are 0: below every key's order */
        const unsigned long long me = f->ord[tid];
        const ulonglong2 *o2 = (const ulonglong2 *)f->ord;
        unsigned r = 0;
#pragma unroll 4
        for (int q = 0; q < ((int)n + 1) >> 1; q++) {
            const ulonglong2 x = o2[q];
            r += (x.x > me || (x.x == me && 2 * q < tid)) + (x.y > me || (x.y == me && 2 * q + 1 < tid));
        }
        if (r < k) out[r] = (cand){f->v[tid], f->id[tid]};
        if (kth && r == k - 1) *kth = (unsigned)(me >> 32);
    }
    __syncthreads();
    return true;
}

#define SLICE_PER (SLICE / 1024)
#define MERGE_PER (MERGE / 1024)

__device__ void topk_pick(const cand *in, const unsigned *thr, int nb, int k, float top_p, float min_p,
                          const double *u, int32_t *id, int32_t *id2, unsigned long long *tm);

/* Stage 1: each block's k best of its SLICE ids (padding past n as {-inf,
 * 0x7fffffff}; sorted best first when fast_top_k took them, else in no
 * order), and the key of its k-th best in thr. The block that finishes
 * last then runs stage 2 (topk_pick). */
__global__ void __launch_bounds__(1024) topk_slices(const float *l, const uint32_t *mask, int n, float inv_t, int k,
                                                    cand *out,
                                                    unsigned *thr, unsigned *done, float top_p, float min_p,
                                                    const double *u, int32_t *pick, int32_t *pick2) {
    __shared__ select_smem sm;
    __shared__ fast_smem fs;
    __shared__ cand best[TERN_CUDA_SAMPLE_MAX_K];
    __shared__ unsigned best_kth;
    unsigned key[SLICE_PER];
    int id[SLICE_PER];
    float v[SLICE_PER];
    TRACE_DECL;
    TRACE_MARK(0);
    pdl_wait();   /* the logits (a no-op in an ordinary launch) */
    pdl_trigger();
    TRACE_MARK(1);
#pragma unroll
    for (int j = 0; j < SLICE_PER; j++) {
        id[j] = blockIdx.x * SLICE + j * 1024 + threadIdx.x;
        v[j] = id[j] < n && allowed(mask, id[j]) ? clean(l[id[j]]) * inv_t : -INFINITY;
        key[j] = id[j] < n ? key_of(v[j]) : 0u;
    }
    TRACE_MARK_AFTER(TRACE_PTR, 2, v[0]);
    const unsigned all = (1u << SLICE_PER) - 1;
    const bool ok = fast_top_k<SLICE_PER>(key, id, v, all, 3, (unsigned)k, &fs, best, &best_kth);
    if (threadIdx.x == 0) sm.taken = 0;
    if (ok) {
        TRACE_MARK(3);
        if (threadIdx.x == 0) thr[blockIdx.x] = best_kth;
        if ((int)threadIdx.x < k) out[(size_t)blockIdx.x * k + threadIdx.x] = best[threadIdx.x];
    } else {
        unsigned kth;
        unsigned top = block_top_k<SLICE_PER>(key, id, all, (unsigned)k, &sm, &kth);
        TRACE_MARK(3);
        if (threadIdx.x == 0) thr[blockIdx.x] = kth;
#pragma unroll
        for (int j = 0; j < SLICE_PER; j++)
            if (top >> j & 1u) {
                unsigned slot = atomicAdd(&sm.taken, 1u);
                cand c = {-INFINITY, 0x7fffffff};
                if (key[j]) { c.v = v[j]; c.id = id[j]; }
                out[(size_t)blockIdx.x * k + slot] = c;
            }
    }
    TRACE_MARK(4);
    const bool last = grid_last_block(done);
    if (last) {
        TRACE_MARK(5);
        topk_pick(out, thr, gridDim.x, k, top_p, min_p, u, pick, pick2, TRACE_PTR);
    }
    TRACE_END(TRACE_SAMPLE, last ? 1u : 0u);
}

/* The draw from c[0 .. k), the top k best first (k <= 64), by one warp:
 * the weights exp(l - max), top-p over them, min-p against the best, then
 * the first id whose running sum passes u times the kept sum. Lane i holds
 * the weights of c[i] and c[i + 32]; the sums run in index order, every
 * lane adding each weight as it comes round by shuffle, so they are the
 * same doubles, in the same order, as the CPU sampler's walk; the
 * comparisons against them are ballots. */
__device__ void draw_top(const cand *c, int k, float top_p, float min_p, double u, int32_t *id, int32_t *id2) {
    const int lane = threadIdx.x & 31;
    const float mx = c[0].v;
    double w[2], cum[2] = {0.0, 0.0};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = lane + 32 * h;
        w[h] = i < k && c[i].id != 0x7fffffff ? (double)expf(c[i].v - mx) : 0.0;
    }
    double total = 0.0;
    for (int i = 0; i < k; i++) {
        total += __shfl_sync(0xffffffffu, i < 32 ? w[0] : w[1], i & 31);
        if (i == lane) cum[0] = total;
        if (i == lane + 32) cum[1] = total;
    }
    /* the running sums: cum[h] for the entry lane + 32 h; then n, the kept */
    int n = k;
    if (top_p < 1.0f) {
        const double lim = top_p * total;
        const unsigned b0 = __ballot_sync(0xffffffffu, lane < k && cum[0] >= lim),
                       b1 = __ballot_sync(0xffffffffu, lane + 32 < k && cum[1] >= lim);
        if (b0 | b1) n = (b0 ? __ffs(b0) - 1 : 32 + __ffs(b1) - 1) + 1;
    }
    if (min_p > 0.0f) {
        const double lim = min_p * __shfl_sync(0xffffffffu, w[0], 0);
        const unsigned b0 = __ballot_sync(0xffffffffu, lane >= 1 && lane < n && w[0] < lim),
                       b1 = __ballot_sync(0xffffffffu, lane + 32 < n && w[1] < lim);
        if (b0 | b1) n = b0 ? __ffs(b0) - 1 : 32 + __ffs(b1) - 1;
    }
    /* the kept sum is the running sum at n - 1 (the same adds), and the
     * draw's running sum over the positive weights is the running sum
     * itself (adding a zero weight leaves a sum as it is) */
    const double kept = __shfl_sync(0xffffffffu, n - 1 < 32 ? cum[0] : cum[1], (n - 1) & 31);
    const double target = u * kept;
    const unsigned p0 = __ballot_sync(0xffffffffu, lane < n && !(w[0] <= 0)),
                   p1 = __ballot_sync(0xffffffffu, lane + 32 < n && !(w[1] <= 0)),
                   a0 = __ballot_sync(0xffffffffu, lane < n && !(w[0] <= 0) && target < cum[0]),
                   a1 = __ballot_sync(0xffffffffu, lane + 32 < n && !(w[1] <= 0) && target < cum[1]);
    /* the first entry not at or below zero past the target, else the last
     * such entry, else the best (a NaN weight counts, as in the walk) */
    const int at = a0 ? __ffs(a0) - 1 : a1 ? 32 + __ffs(a1) - 1 : p1 ? 63 - __clz(p1) : p0 ? 31 - __clz(p0) : 0;
    if (lane == 0) put_id(c[at].id, id, id2);
}

/* Stage 2: the k best of the m candidates, sorted best first. The k-th
 * best overall is at least every block's k-th best, so only candidates at
 * or above the largest block threshold can be among the k: typically a
 * few hundred of the m survive, one per thread, and fast_top_k (groups of
 * up to 8 survivors, as many as make at most 128 groups) or a radix
 * selection over them finds the k (a radix selection over all m when more
 * survive than there are threads: many equal logits). With the radix
 * selection each of the k then counts the others before it: its rank.
 * Then one warp draws (draw_top). */
__device__ void topk_pick(const cand *in, const unsigned *thr, int nb, int k, float top_p, float min_p,
                          const double *u, int32_t *id, int32_t *id2, unsigned long long *tm) {
    __shared__ select_smem sm;
    __shared__ fast_smem fs;
    __shared__ cand list[1024], sel[TERN_CUDA_SAMPLE_MAX_K], c[TERN_CUDA_SAMPLE_MAX_K];
    __shared__ __align__(16) unsigned warp_max[32];   /* (1024 threads: both kernels launch that many) */
    __shared__ unsigned n_sel;
    const int m = nb * k, tid = threadIdx.x;
    unsigned key[MERGE_PER], mask = 0;
    int cid[MERGE_PER];
    float v[MERGE_PER];
    /* the candidates and the thresholds requested together (one round trip) */
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++) {
        int i = j * 1024 + tid;
        cand x = {-INFINITY, 0x7fffffff};
        if (i < m) x = in[i];
        v[j] = x.v;
        cid[j] = x.id;
        mask |= (unsigned)(i < m) << j;
    }
    unsigned t = 0;
    for (int i = tid; i < nb; i += 1024) t = max(t, thr[i]);
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++) key[j] = cid[j] == 0x7fffffff ? 0u : key_of(v[j]);
    t = __reduce_max_sync(0xffffffffu, t);
    if ((tid & 31) == 0) warp_max[tid >> 5] = t;
    if (tid == 0) sm.taken = n_sel = 0;
    if (tid < k) sel[tid] = (cand){-INFINITY, 0x7fffffff};
    __syncthreads();
    const uint4 *wm = (const uint4 *)warp_max;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const uint4 x = wm[q];
        t = max(t, max(max(x.x, x.y), max(x.z, x.w)));
    }
    unsigned keep = 0, kth;
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++) keep |= (unsigned)((mask >> j & 1u) && key[j] >= t) << j;
    /* the survivors into the list (up to its size), counted by the same adds */
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++) {
        const bool want = keep >> j & 1u;
        const unsigned slot = warp_slot(&sm.taken, want);
        if (want && slot < 1024u) list[slot] = (cand){v[j], cid[j]};
    }
    __syncthreads();
    const int n_keep = (int)sm.taken;
    bool sorted = false;
    if (n_keep <= (int)blockDim.x) {
        /* the survivors, one per thread, then the k among them */
        TRACE_MARK_AT(tm, 6);
        cand me = tid < n_keep ? list[tid] : (cand){-INFINITY, 0x7fffffff};
        unsigned k1[1] = {tid < n_keep ? key_of(me.v) : 0u};
        int i1[1] = {me.id};
        float v1[1] = {me.v};
        /* groups of 1, 2, 4 or 8 survivors: at most FAST_GROUPS of them */
        const int gsh = n_keep <= 128 ? 0 : n_keep <= 256 ? 1 : n_keep <= 512 ? 2 : 3;
        sorted = fast_top_k<1>(k1, i1, v1, tid < n_keep, gsh, (unsigned)k, &fs, c, NULL);
        if (!sorted && block_top_k<1>(k1, i1, tid < n_keep, (unsigned)k, &sm, &kth)) {
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
    if (!sorted) {
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
    }
    TRACE_MARK_AT(tm, 7);
    if (tid < 32) draw_top(c, k, top_p, min_p, *u, id, id2);
    TRACE_MARK_AT(tm, 8);
}

int tern_cuda_sample_fits(int n_valid, int top_k) {
    const int k = top_k < n_valid ? top_k : n_valid;
    return n_valid >= 1 && top_k >= 1 && top_k <= TERN_CUDA_SAMPLE_MAX_K && (int64_t)ceil_div(n_valid, SLICE) * k <= MERGE;
}

int tern_cuda_sample(const float *logits, const uint32_t *mask, int n_valid, float temperature, int top_k, float top_p,
                     float min_p, const double *u, void *work, int32_t *id, int32_t *id2, tern_stream s,
                     tern_error *err) {
    if (n_valid < 1 || top_k < 1 || top_k > TERN_CUDA_SAMPLE_MAX_K || !(temperature > 0) || !u)
        return tern_fail(err, "sample: top_k %d (1..%d), temperature %g%s", top_k, TERN_CUDA_SAMPLE_MAX_K,
                         temperature, u ? "" : ", no u");
    if (!tern_cuda_sample_fits(n_valid, top_k))
        return tern_fail(err, "sample: %d ids x top_k %d exceed the merge (%d candidates)", n_valid, top_k, MERGE);
    int nb = ceil_div(n_valid, SLICE), k = top_k < n_valid ? top_k : n_valid;
    sample_work t = work_of(work, nb);
    const float inv_t = 1.0f / temperature;
    cudaError_t e = launch_pdl(topk_slices, dim3(nb), dim3(1024), 0, s, logits, mask, n_valid, inv_t, k, t.cands, t.thr,
                               t.done, top_p, min_p, u, id, id2);
    if (e != cudaSuccess) return tern_fail(err, "sample: %s", cudaGetErrorString(e));
    return launch_check("sample", err);
}

TRACE_DUMP_FN(tern_cuda_trace_dump_sample)
