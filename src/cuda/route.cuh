/* The router's softmax / top-k of one token by one warp, shared by the
 * router kernel (route.cu), the fused router's last block (gemv_fused.cu)
 * and the experts' one launch when it routes itself (moe_seg.cu), so all
 * give the same ids and weights bit for bit. */
#ifndef TERN_CUDA_ROUTE_CUH
#define TERN_CUDA_ROUTE_CUH

#include <float.h>

#include "cuda/common.cuh"

/* 8 keys of a lane (key[i] of index lane + 32 i, ix[i] = i) sorted larger
 * first, ties to the lower index (Batcher's 19 comparators): the lane's
 * best is then key[0], and taking it is a shift (route_row). */
__device__ __forceinline__ void route_cmpx(uint32_t (&k)[8], int (&ix)[8], int a, int b) {
    const bool keep = k[a] > k[b] || (k[a] == k[b] && ix[a] < ix[b]);
    const uint32_t ka = k[a], kb = k[b];
    const int ia = ix[a], ib = ix[b];
    k[a] = keep ? ka : kb;
    k[b] = keep ? kb : ka;
    ix[a] = keep ? ia : ib;
    ix[b] = keep ? ib : ia;
}

/* A lane's sorted keys after its best is taken: the next one is the head
 * (bk, index lane + 32 bi). */
__device__ __forceinline__ void route_shift8(uint32_t (&k)[8], int (&ix)[8], uint32_t &bk, int &bi) {
#pragma unroll
    for (int i = 0; i < 7; i++) {
        k[i] = k[i + 1];
        ix[i] = ix[i + 1];
    }
    k[7] = 0;
    bk = k[0];
    bi = ix[0];
}

__device__ __forceinline__ void route_sort8(uint32_t (&k)[8], int (&ix)[8]) {
    route_cmpx(k, ix, 0, 1); route_cmpx(k, ix, 2, 3); route_cmpx(k, ix, 4, 5); route_cmpx(k, ix, 6, 7);
    route_cmpx(k, ix, 0, 2); route_cmpx(k, ix, 1, 3); route_cmpx(k, ix, 4, 6); route_cmpx(k, ix, 5, 7);
    route_cmpx(k, ix, 1, 2); route_cmpx(k, ix, 5, 6);
    route_cmpx(k, ix, 0, 4); route_cmpx(k, ix, 1, 5); route_cmpx(k, ix, 2, 6); route_cmpx(k, ix, 3, 7);
    route_cmpx(k, ix, 2, 4); route_cmpx(k, ix, 3, 5);
    route_cmpx(k, ix, 1, 2); route_cmpx(k, ix, 3, 4); route_cmpx(k, ix, 5, 6);
}

/* A logit as a key that orders as the logits (larger first; +0 and -0 one
 * key, v + 0 being +0 for both); finite and infinite logits give keys of
 * at least 0x007fffff, so 0 marks a taken or absent entry. route_logit
 * inverts it. */
__device__ __forceinline__ uint32_t route_key(float v) {
    const uint32_t b = __float_as_uint(v + 0.0f);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float route_logit(uint32_t k) {
    return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

/* The lane's logits v[i] = l[lane + 32 i] (-FLT_MAX past E). The logits
 * are read through L2 (__ldcg): the fused router's other blocks wrote
 * them. */
template <int V>
__device__ __forceinline__ void route_load(const float *l, int E, float (&v)[V]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < V; i++) v[i] = lane + 32 * i < E ? __ldcg(l + lane + 32 * i) : -FLT_MAX;
}

/* What the selection leaves for the weights: lane r < K holds the r-th
 * choice's key, every lane the softmax's max and sum. */
struct route_pick {
    uint32_t key;
    int id;
    float m, sum;
};

/* V = ceil(E / 32) logits per lane (lane + 32 i): the top K by logit
 * (route_select), then their softmax probabilities (route_weight). A
 * probability is expf(l - max) / sum, which grows with l, so the logits'
 * order is the probabilities' (the CPU twin orders by probability): equal
 * logits give equal probabilities and tie to the lower index in both; only
 * two logits a few ulps apart whose probabilities round to one value could
 * order differently, as the two expf could anyway. Selecting on the logits
 * takes the softmax out of the selection's chain: its max is one reduce of
 * the keys, its exps overlap the selection, and only the K chosen are
 * divided, in route_weight, which a caller may run later, off the chain
 * to its first expert weight.
 * A round takes the largest key (__reduce_max_sync), then the lowest index
 * holding it (__reduce_min_sync): larger first, ties to the lower index
 * (one reduce and a ballot, with the second reduce only on a tie, and a
 * bitonic merge of the lanes' sorted keys both measured slower:
 * tools/gpu/routeprobe.cu, docs/experiments/cuda-router.md, step 85). Its owner then
 * moves to its next key.
 * The weights are bit for bit those of dividing every probability first:
 * the same max, the same sum in the same order, the chosen ones' total in
 * the order chosen. */
template <int V>
__device__ __forceinline__ route_pick route_select(const float (&v)[V], int E, int K) {
    const int lane = threadIdx.x & 31;
    uint32_t key[V];
#pragma unroll
    for (int i = 0; i < V; i++) key[i] = lane + 32 * i < E ? route_key(v[i]) : 0u;
    /* the softmax's max and sum, from the unsorted keys: independent of
     * the selection below, so their latencies overlap */
    uint32_t kmax = 0;
#pragma unroll
    for (int i = 0; i < V; i++) kmax = max(kmax, key[i]);
    route_pick pk;
    pk.m = route_logit(__reduce_max_sync(0xffffffffu, kmax));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < V; i++)
        if (lane + 32 * i < E) sum += expf(v[i] - pk.m);
    pk.key = 0;
    pk.id = 0;
    /* the lane's best (bk, index lane + 32 bi): with 8 keys the head of its
     * sorted keys, so taking it is a shift; otherwise found by a rescan
     * (the sort's shorter chain per round: docs/experiments/cuda-router.md, step 35) */
    int ix[V];
#pragma unroll
    for (int i = 0; i < V; i++) ix[i] = i;
    uint32_t bk = 0;
    int bi = 0;
    if constexpr (V == 8) {
        route_sort8(key, ix);
        bk = key[0];
        bi = ix[0];
    } else {
#pragma unroll
        for (int i = 0; i < V; i++)
            if (key[i] > bk) {
                bk = key[i];
                bi = i;
            }
    }
    int lvl = 16;        /* the sum's next butterfly offset (warp_sum's order), one a round */
#pragma unroll 1
    for (int r = 0; r < K; r++) {
        const float other = lvl ? __shfl_xor_sync(0xffffffffu, sum, lvl) : 0.0f;
        const uint32_t top = __reduce_max_sync(0xffffffffu, bk);
        const uint32_t e = __reduce_min_sync(0xffffffffu, bk == top ? (uint32_t)(lane + 32 * bi) : 0xffffffffu);
        if (lane == r) {
            pk.key = top;
            pk.id = (int)e;
        }
        if ((int)(e & 31) == lane) {   /* the owner's best is taken: its next one */
            if constexpr (V == 8) {
                route_shift8(key, ix, bk, bi);
            } else {
                bk = 0;
                bi = 0;
#pragma unroll
                for (int i = 0; i < V; i++) {
                    if (i == (int)(e >> 5)) key[i] = 0;
                    if (key[i] > bk) {
                        bk = key[i];
                        bi = i;
                    }
                }
            }
        }
        if (lvl) {
            sum += other;
            lvl >>= 1;
        }
    }
    for (; lvl; lvl >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, lvl);
    pk.sum = sum;
    return pk;
}

/* Lane r < K's weight (every lane of the warp calls it: shuffles): its
 * probability, divided by the chosen ones' total in the order chosen when
 * renorm. */
__device__ __forceinline__ float route_weight(const route_pick &pk, int K, int renorm) {
    const int lane = threadIdx.x & 31;
    const float p = lane < K ? expf(route_logit(pk.key) - pk.m) / pk.sum : 0.0f;
    /* lanes past K add +0, which leaves the total as it is (the shuffles
     * all issued before the adds) */
    float total = 0.0f;
    if (K <= 8) {
        float q[8];
#pragma unroll
        for (int r = 0; r < 8; r++) q[r] = __shfl_sync(0xffffffffu, p, r);
#pragma unroll
        for (int r = 0; r < 8; r++) total += q[r];
    } else {
        for (int r = 0; r < K; r++) total += __shfl_sync(0xffffffffu, p, r);
    }
    return renorm ? p / total : p;
}

/* The selection and the weights at once: ids[r] and wts[r] for r < K. */
template <int V>
__device__ __forceinline__ void route_vals(const float (&v)[V], int E, int K, int renorm, int32_t *ids, float *wts) {
    const route_pick pk = route_select<V>(v, E, K);
    const float w = route_weight(pk, K, renorm);
    const int lane = threadIdx.x & 31;
    if (lane < K) {
        ids[lane] = pk.id;
        wts[lane] = w;
    }
}

template <int V>
__device__ __forceinline__ void route_row(const float *l, int E, int K, int renorm, int32_t *ids, float *wts) {
    float v[V];
    route_load<V>(l, E, v);
    route_vals<V>(v, E, K, renorm, ids, wts);
}

#endif
