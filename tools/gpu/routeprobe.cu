/* routeprobe: the latency of one warp's top k (src/cuda/route.cuh's
 * route_vals, the chain every routed block of the experts' launch runs
 * before it can request a weight). One warp per SM calls it N times in a
 * row on logits already in registers, each call's input depending on the
 * last one's output, and thread 0 times the loop with clock64 and
 * %globaltimer; the median block's cycles and ns per call are printed for
 * 256 experts, top 8 (the model's) and for other shapes, and route_select
 * alone (the ids, the experts' chain when the weights come later). Then route_vals'
 * parts, each timed alone the same way at 256 experts, top 8: the loop's
 * own dependency, the keys and the softmax's max and exps, the sort, the
 * eight rounds, the sum's butterfly and the tail (the chosen ones' weights).
 * Build it against two trees' route.cuh to compare their top k (the parts
 * use this tree's route.cuh helpers):
 *
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Isrc -Iinclude -o routeprobe tools/gpu/routeprobe.cu
 *   ./routeprobe */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define PROBE_NAME "routeprobe"
#include "probe.cuh"

#include "cuda/route.cuh"

#define CALLS 200

template <int V, bool SEL>
__global__ void __launch_bounds__(32) route_loop(const float *logits, int E, int K, unsigned long long *out,
                                                 int32_t *ids_out) {
    __shared__ int32_t ids[32];
    __shared__ float wts[32];
    float v[V];
    route_load<V>(logits + (size_t)blockIdx.x * E, E, v);
    unsigned long long c0 = clock64(), t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (int n = 0; n < CALLS; n++) {
        if (SEL) {   /* the ids alone (route_select: what a caller needs before its first weight) */
            const route_pick pk = route_select<V>(v, E, K);
            if ((int)(threadIdx.x & 31) < K) ids[threadIdx.x & 31] = pk.id;
            wts[0] = 0.0f;
        } else {
            route_vals<V>(v, E, K, 1, ids, wts);
        }
        /* the next call waits for this one's result: ids[0] >> 30 is 0 (ids < 2^30), unknown to the compiler */
        const float dep = (float)(ids[0] >> 30) + wts[0] * 0.0f;
#pragma unroll
        for (int i = 0; i < V; i++) v[i] += dep;
        __syncwarp();
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    const unsigned long long c1 = clock64();
    if (threadIdx.x < K) ids_out[blockIdx.x * 32 + threadIdx.x] = ids[threadIdx.x];
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = c1 - c0;
        out[2 * blockIdx.x + 1] = t1 - t0;
    }
}

/* A rejected selection, kept to time it (docs/experiments/cuda-router.md, step 85): a
 * key and its index as one 64-bit word (the larger key first, ties to the
 * lower index), each lane's 8 sorted, then five merges with the partner at
 * distance 1, 2, .., 16: the larger of c[i] and the partner's c[7 - i] are
 * the top 8 of the 16 as a bitonic sequence, which three rounds of
 * compare-exchange sort; after the fifth every lane holds the warp's top 8.
 * It took 3,167 cycles against the sort and rounds' 1,836. */
__device__ __forceinline__ unsigned long long route_pack(uint32_t k, int i) {
    return (unsigned long long)k << 32 | (uint32_t)~i;
}

__device__ __forceinline__ void route_cx64(unsigned long long (&c)[8], int a, int b) {
    const unsigned long long x = c[a], y = c[b];
    c[a] = x > y ? x : y;
    c[b] = x > y ? y : x;
}

__device__ __forceinline__ void route_merge8(unsigned long long (&c)[8]) {
    route_cx64(c, 0, 1); route_cx64(c, 2, 3); route_cx64(c, 4, 5); route_cx64(c, 6, 7);
    route_cx64(c, 0, 2); route_cx64(c, 1, 3); route_cx64(c, 4, 6); route_cx64(c, 5, 7);
    route_cx64(c, 1, 2); route_cx64(c, 5, 6);
    route_cx64(c, 0, 4); route_cx64(c, 1, 5); route_cx64(c, 2, 6); route_cx64(c, 3, 7);
    route_cx64(c, 2, 4); route_cx64(c, 3, 5);
    route_cx64(c, 1, 2); route_cx64(c, 3, 4); route_cx64(c, 5, 6);
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        unsigned long long p[8];
#pragma unroll
        for (int i = 0; i < 8; i++) p[i] = __shfl_xor_sync(0xffffffffu, c[7 - i], s);
#pragma unroll
        for (int i = 0; i < 8; i++) c[i] = c[i] > p[i] ? c[i] : p[i];
        route_cx64(c, 0, 4); route_cx64(c, 1, 5); route_cx64(c, 2, 6); route_cx64(c, 3, 7);
        route_cx64(c, 0, 2); route_cx64(c, 1, 3); route_cx64(c, 4, 6); route_cx64(c, 5, 7);
        route_cx64(c, 0, 1); route_cx64(c, 2, 3); route_cx64(c, 4, 5); route_cx64(c, 6, 7);
    }
}

/* route_vals' parts (PART 1..6, above), each as route_vals does it; PART 7
 * the rejected merge above */
template <int PART>
__device__ __forceinline__ float route_part(const float (&v)[8], int E, int K) {
    const int lane = threadIdx.x & 31;
    uint32_t key[8];
    int ix[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        key[i] = lane + 32 * i < E ? route_key(v[i]) : 0u;
        ix[i] = i;
    }
    if constexpr (PART == 1) return 0.0f;
    if constexpr (PART == 2) {
        uint32_t kmax = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) kmax = max(kmax, key[i]);
        const float m = route_logit(__reduce_max_sync(0xffffffffu, kmax));
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (lane + 32 * i < E) sum += expf(v[i] - m);
        return sum;
    }
    if constexpr (PART == 3) {
        route_sort8(key, ix);
        return (float)(key[0] >> 31) + (float)ix[0];
    }
    if constexpr (PART == 4) {   /* the rounds on keys sorted by lane (their order, not their values) */
        uint32_t bk = key[0];
        int bi = 0, my_id = 0;
#pragma unroll 1
        for (int r = 0; r < K; r++) {
            const uint32_t top = __reduce_max_sync(0xffffffffu, bk);
            const uint32_t e = __reduce_min_sync(0xffffffffu, bk == top ? (uint32_t)(lane + 32 * bi) : 0xffffffffu);
            if (lane == r) my_id = (int)e;
            if ((int)(e & 31) == lane) route_shift8(key, ix, bk, bi);
        }
        return (float)my_id;
    }
    if constexpr (PART == 5) return warp_sum(v[0]);
    if constexpr (PART == 6) {   /* the tail: a chosen one's weight, the total, the renormalised weight */
        const float p = lane < K ? expf(v[1] - v[0]) / v[2] : 0.0f;
        float q[8], total = 0.0f;
#pragma unroll
        for (int r = 0; r < 8; r++) q[r] = __shfl_sync(0xffffffffu, p, r);
#pragma unroll
        for (int r = 0; r < 8; r++) total += q[r];
        return p / total;
    }
    if constexpr (PART == 7) {   /* the packed sort and the five merges */
        unsigned long long c[8];
#pragma unroll
        for (int i = 0; i < 8; i++) c[i] = route_pack(key[i], lane + 32 * i);
        route_merge8(c);
        return (float)(uint32_t)(c[0] ^ c[7]);
    }
    return 0.0f;
}

template <int PART>
__global__ void __launch_bounds__(32) part_loop(const float *logits, int E, int K, unsigned long long *out,
                                                int32_t *ids_out) {
    __shared__ float res[32];
    float v[8];
    route_load<8>(logits + (size_t)blockIdx.x * E, E, v);
    const unsigned long long c0 = clock64();
    for (int n = 0; n < CALLS; n++) {
        res[threadIdx.x] = route_part<PART>(v, E, K);
        __syncwarp();
        const float dep = (float)(__float_as_uint(res[0]) >> 31) * 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] += dep;
        __syncwarp();
    }
    const unsigned long long c1 = clock64();
    ids_out[blockIdx.x * 32 + threadIdx.x] = (int32_t)res[threadIdx.x];
    if (threadIdx.x == 0) out[2 * blockIdx.x] = c1 - c0;
}

static int cmp_ull(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

template <int V, int PART = 0, bool SEL = false>
static void probe(int sms, int E, int K) {
    float *h = (float *)malloc((size_t)sms * E * sizeof(float));
    srand(7);
    for (size_t i = 0; i < (size_t)sms * E; i++) h[i] = (float)rand() / RAND_MAX * 4.0f - 2.0f;
    float *d;
    unsigned long long *dout, *hout = (unsigned long long *)malloc((size_t)sms * 2 * sizeof *hout);
    int32_t *dids;
    CHECK(cudaMalloc(&d, (size_t)sms * E * sizeof(float)));
    CHECK(cudaMalloc(&dout, (size_t)sms * 2 * sizeof *dout));
    CHECK(cudaMalloc(&dids, (size_t)sms * 32 * sizeof(int32_t)));
    CHECK(cudaMemcpy(d, h, (size_t)sms * E * sizeof(float), cudaMemcpyHostToDevice));
    for (int rep = 0; rep < 2; rep++) {   /* the first run warms the code */
        if (PART) part_loop<PART><<<sms, 32>>>(d, E, K, dout, dids);
        else route_loop<V, SEL><<<sms, 32>>>(d, E, K, dout, dids);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    CHECK(cudaMemcpy(hout, dout, (size_t)sms * 2 * sizeof *hout, cudaMemcpyDeviceToHost));
    unsigned long long *cyc = (unsigned long long *)malloc(sms * sizeof *cyc), *ns = (unsigned long long *)malloc(sms * sizeof *ns);
    for (int b = 0; b < sms; b++) {
        cyc[b] = hout[2 * b];
        ns[b] = hout[2 * b + 1];
    }
    qsort(cyc, sms, sizeof *cyc, cmp_ull);
    qsort(ns, sms, sizeof *ns, cmp_ull);
    static const char *part[] = {"route_vals", "the loop alone (keys made)", "keys, max, exps", "keys, sort",
                                 "keys, rounds", "keys, butterfly", "keys, tail", "keys, a bitonic merge (rejected)"};
    printf("%5d experts top %2d: %7.1f cycles %7.1f ns a call (median of %d warps, %d calls each): %s\n", E, K,
           (double)cyc[sms / 2] / CALLS, PART ? 0.0 : (double)ns[sms / 2] / CALLS, sms, CALLS,
           SEL ? "route_select (the ids alone)" : part[PART]);
    CHECK(cudaFree(d));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(dids));
    free(h);
    free(hout);
    free(cyc);
    free(ns);
}

int main(void) {
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    probe<8>(sms, 256, 8);
    probe<8, 0, true>(sms, 256, 8);
    probe<8>(sms, 256, 1);
    probe<8>(sms, 128, 8);
    probe<32>(sms, 1000, 10);
    probe<8, 1>(sms, 256, 8);
    probe<8, 2>(sms, 256, 8);
    probe<8, 3>(sms, 256, 8);
    probe<8, 4>(sms, 256, 8);
    probe<8, 5>(sms, 256, 8);
    probe<8, 6>(sms, 256, 8);
    probe<8, 7>(sms, 256, 8);
    return 0;
}
