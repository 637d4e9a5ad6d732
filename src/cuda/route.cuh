/* The router's softmax / top-k of one token by one warp, shared by the
 * router kernel (moe.cu) and the fused router's last block (gemv_fused.cu),
 * so both give the same ids and weights bit for bit. */
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

/* V = ceil(E / 32) logits per lane (lane + 32 i): the top K by logit, then
 * their softmax probabilities. A probability is expf(l - max) / sum, which
 * grows with l, so the logits' order is the probabilities' (the CPU twin
 * orders by probability): equal logits give equal probabilities and tie to
 * the lower index in both; only two logits a few ulps apart whose
 * probabilities round to one value could order differently, as the two
 * expf could anyway. Selecting on the logits keeps the softmax (a max, 8
 * expf, a sum, 8 divisions) out of the selection's chain: the max is the
 * first key, and only the K chosen are divided.
 * A round takes the largest key (__reduce_max_sync); the lane holding it
 * (a ballot) writes its index; when several lanes hold it (equal logits)
 * the lowest index among them (__reduce_min_sync). Its owner then moves to
 * its next key. The weights are bit for bit those of dividing every
 * probability first: the same max, the same sum in the same order, the
 * chosen ones' totals in the order chosen. */
template <int V>
__device__ __forceinline__ void route_vals(const float (&v)[V], int E, int K, int renorm, int32_t *ids, float *wts) {
    const int lane = threadIdx.x & 31;
    uint32_t key[V];
#pragma unroll
    for (int i = 0; i < V; i++) key[i] = lane + 32 * i < E ? route_key(v[i]) : 0u;
    /* the lane's best (bk, index lane + 32 bi): with 8 keys the head of its
     * sorted keys, so taking it is a shift; otherwise found by a rescan
     * (the sort's shorter chain per round: docs/PERFORMANCE.md step 35) */
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
    /* the softmax's max and sum (independent of the rounds below) */
    const float m = route_logit(__reduce_max_sync(0xffffffffu, bk));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < V; i++)
        if (lane + 32 * i < E) sum += expf(v[i] - m);
    sum = warp_sum(sum);
    uint32_t mine = 0;   /* lane r: round r's key */
#pragma unroll 1
    for (int r = 0; r < K; r++) {
        const uint32_t top = __reduce_max_sync(0xffffffffu, bk);
        const unsigned hold = __ballot_sync(0xffffffffu, bk == top);
        int owner = __ffs(hold) - 1;
        if (hold & (hold - 1))   /* (warp-uniform) equal logits: the lowest index */
            owner = (int)(__reduce_min_sync(0xffffffffu, bk == top ? (uint32_t)(lane + 32 * bi) : 0xffffffffu) & 31u);
        if (lane == r) mine = top;
        if (lane == owner) {   /* its best is taken: its next one */
            ids[r] = lane + 32 * bi;
            if constexpr (V == 8) {
#pragma unroll
                for (int i = 0; i < 7; i++) {
                    key[i] = key[i + 1];
                    ix[i] = ix[i + 1];
                }
                key[7] = 0;
                bk = key[0];
                bi = ix[0];
            } else {
                const int taken = bi;
                bk = 0;
                bi = 0;
#pragma unroll
                for (int i = 0; i < V; i++) {
                    if (i == taken) key[i] = 0;
                    if (key[i] > bk) {
                        bk = key[i];
                        bi = i;
                    }
                }
            }
        }
    }
    const float p = lane < K ? expf(route_logit(mine) - m) / sum : 0.0f;
    float total = 0.0f;
    for (int r = 0; r < K; r++) total += __shfl_sync(0xffffffffu, p, r);
    if (lane < K) wts[lane] = renorm ? p / total : p;
    __syncwarp();   /* (the ids, written by their owners, before any lane reads them) */
}

template <int V>
__device__ __forceinline__ void route_row(const float *l, int E, int K, int renorm, int32_t *ids, float *wts) {
    float v[V];
    route_load<V>(l, E, v);
    route_vals<V>(v, E, K, renorm, ids, wts);
}

#endif
