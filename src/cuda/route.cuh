/* The router's softmax / top-k of one token by one warp, shared by the
 * router kernel (moe.cu) and the fused router's last block (gemv_fused.cu),
 * so both give the same ids and weights bit for bit. */
#ifndef TERN_CUDA_ROUTE_CUH
#define TERN_CUDA_ROUTE_CUH

#include <float.h>

#include "cuda/common.cuh"

/* V = ceil(E / 32) logits per lane (lane + 32 i): softmax, then K rounds of
 * a warp argmax over each lane's best. Keys are the probabilities' bits + 1
 * (probabilities are >= 0, so their bits order as the values; 0 marks a
 * taken or absent entry); a round takes the largest key
 * (__reduce_max_sync), then the lowest index holding it
 * (__reduce_min_sync): larger first, ties to the lower index. The logits
 * are read through L2 (__ldcg): the fused router's other blocks wrote them. */
template <int V>
__device__ __forceinline__ void route_row(const float *l, int E, int K, int renorm, int32_t *ids, float *wts) {
    const int lane = threadIdx.x & 31;
    float v[V];
    float m = -FLT_MAX;
#pragma unroll
    for (int i = 0; i < V; i++) {
        int e = lane + 32 * i;
        v[i] = e < E ? __ldcg(l + e) : -FLT_MAX;
        m = fmaxf(m, v[i]);
    }
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
    uint32_t bk = 0;
    int bi = 0;
#pragma unroll
    for (int i = 0; i < V; i++)
        if (key[i] > bk) {
            bk = key[i];
            bi = i;
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
        if ((int)(e & 31) == lane) {   /* the owner drops it and finds its next best */
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
    if (lane < K) {
        ids[lane] = my_id;
        wts[lane] = renorm ? mine / total : mine;
    }
}

#endif
