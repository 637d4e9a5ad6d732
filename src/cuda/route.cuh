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

/* V = ceil(E / 32) logits per lane (lane + 32 i): softmax, then K rounds of
 * a warp argmax over each lane's best. Keys are the probabilities' bits + 1
 * (probabilities are >= 0, so their bits order as the values; 0 marks a
 * taken or absent entry); a round takes the largest key
 * (__reduce_max_sync), then the lowest index holding it
 * (__reduce_min_sync): larger first, ties to the lower index. The logits
 * are read through L2 (__ldcg): the fused router's other blocks wrote them. */
/* The lane's logits v[i] = l[lane + 32 i] (-FLT_MAX past E). */
template <int V>
__device__ __forceinline__ void route_load(const float *l, int E, float (&v)[V]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < V; i++) v[i] = lane + 32 * i < E ? __ldcg(l + lane + 32 * i) : -FLT_MAX;
}

/* route_row from the lane's logits (route_load's) */
template <int V>
__device__ __forceinline__ void route_vals(float (&v)[V], int E, int K, int renorm, int32_t *ids, float *wts) {
    const int lane = threadIdx.x & 31;
    float m = -FLT_MAX;
#pragma unroll
    for (int i = 0; i < V; i++) m = fmaxf(m, v[i]);
    m = warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < V; i++)
        if (lane + 32 * i < E) {
            v[i] = expf(v[i] - m);
            sum += v[i];
        }
    sum = warp_sum(sum);
    uint32_t key[V];
#pragma unroll
    for (int i = 0; i < V; i++) key[i] = lane + 32 * i < E ? __float_as_uint(v[i] / sum) + 1u : 0u;
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
    float mine = 0.0f, total = 0.0f;
    int my_id = 0;
#pragma unroll 1
    for (int r = 0; r < K; r++) {
        const uint32_t top = __reduce_max_sync(0xffffffffu, bk);
        const uint32_t e = __reduce_min_sync(0xffffffffu, bk == top ? (uint32_t)(lane + 32 * bi) : 0xffffffffu);
        const float p = __uint_as_float(top - 1u);
        total += p;
        if (lane == r) {
            mine = p;
            my_id = (int)e;
        }
        if ((int)(e & 31) == lane) {   /* the owner's best is taken: its next one */
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
    }
    if (lane < K) {
        ids[lane] = my_id;
        wts[lane] = renorm ? mine / total : mine;
    }
}

template <int V>
__device__ __forceinline__ void route_row(const float *l, int E, int K, int renorm, int32_t *ids, float *wts) {
    float v[V];
    route_load<V>(l, E, v);
    route_vals<V>(v, E, K, renorm, ids, wts);
}

#endif
