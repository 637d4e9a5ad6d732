/* holprobe: does a block's load of a small, L2-resident vector wait behind
 * the weight requests the block issued just before it?
 *
 * Every GEMV of the decode step requests its first weight tiles into shared
 * memory or registers, then (after the previous kernel) loads its input vector, which
 * that kernel has just written and which sits in L2. The phase trace
 * (docs/experiments/cuda-step-timeline.md, rounds 7-8) has the input built ~2-3 us after the
 * release, about the time the SM's share of HBM takes to serve the tiles.
 * This probe runs 3 blocks of 256 threads per SM, each requesting P KB of
 * weights (from a 512 MB buffer, rotated so none are L2 hits), then loading
 * 8 KB of a vector written by the kernel before (L2 hits), and records per
 * block, with %globaltimer: the requests' issue time, the vector's arrival
 * after the requests were issued, and the weights' arrival. Three ways to
 * request the weights: cp.async of 16 bytes per thread (the staged GEMV's
 * way), one cp.async.bulk per block (the TMA unit, completion on an
 * mbarrier), 16-byte loads into registers held until after the vector (the
 * register-tile GEMVs' and the experts' gate/up way), and none (the vector's
 * latency alone). Medians over blocks and 20 launches.
 *
 *   nvcc -O3 -gencode arch=compute_90,code=sm_90 -o holprobe tools/gpu/holprobe.cu && ./holprobe */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PROBE_NAME "holprobe"
#include "probe.cuh"

#define THREADS 256
#define XN 2048          /* the vector: 2048 floats, 8 KB (the model's hidden size) */
#define WBUF (512u << 20)
#define LAUNCHES 20

enum { MODE_NONE, MODE_CPASYNC, MODE_BULK, MODE_REGS };
#define REGS_MAX 12   /* 16-byte loads a thread holds in MODE_REGS: 48 KB a block */

__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__global__ void write_x(float *x, float v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < XN; i += gridDim.x * blockDim.x) x[i] = v + (float)i;
}

/* rec[block] = {issue, x arrived, weights arrived} in ns after the block's start */
__global__ void __launch_bounds__(THREADS) probe(const uint8_t *w, size_t per_block, int mode, const float *x,
                                                 float *sink, unsigned long long *rec) {
    extern __shared__ __align__(128) uint8_t sm[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float red[THREADS / 32];
    const uint8_t *src = w + blockIdx.x * per_block;
    if (threadIdx.x == 0 && mode == MODE_BULK) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar)) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    const unsigned long long t0 = gtime();
    if (mode == MODE_CPASYNC) {
        for (size_t i = 16 * threadIdx.x; i < per_block; i += 16 * THREADS)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(sm + i)), "l"(src + i) : "memory");
        asm volatile("cp.async.commit_group;" ::: "memory");
    } else if (mode == MODE_BULK && threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bar)),
                     "r"((unsigned)per_block)
                     : "memory");
        for (size_t o = 0; o < per_block; o += 16384) {
            unsigned n = (unsigned)(per_block - o < 16384 ? per_block - o : 16384);
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                    smem_u32(sm + o)),
                "l"(src + o), "r"(n), "r"(smem_u32(&bar))
                : "memory");
        }
    }
    uint4 held[REGS_MAX];
    if (mode == MODE_REGS) {
#pragma unroll
        for (int j = 0; j < REGS_MAX; j++) {
            size_t i = 16 * (threadIdx.x + (size_t)j * THREADS);
            held[j] = i < per_block ? __ldcs((const uint4 *)(src + i)) : make_uint4(0, 0, 0, 0);
        }
    }
    const unsigned long long t1 = gtime();
    /* the vector: 2 float4 a thread, then a block sum (the norm's shape) */
    const float4 *x4 = (const float4 *)x;
    float4 a = __ldcg(x4 + threadIdx.x), b = __ldcg(x4 + threadIdx.x + THREADS);
    float s = a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    const unsigned long long t2 = gtime();
    if (mode == MODE_CPASYNC) {
        asm volatile("cp.async.wait_all;" ::: "memory");
    } else if (mode == MODE_REGS) {
        unsigned v = 0;
#pragma unroll
        for (int j = 0; j < REGS_MAX; j++) v ^= held[j].x ^ held[j].y ^ held[j].z ^ held[j].w;
        if (v == 0x9e3779b9u) sm[0] = 1;   /* (keeps the loads) */
    } else if (mode == MODE_BULK) {
        unsigned done = 0;
        while (!done)
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
                         " selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done)
                         : "r"(smem_u32(&bar))
                         : "memory");
    }
    __syncthreads();
    const unsigned long long t3 = gtime();
    if (threadIdx.x == 0) {
        float tot = 0.0f;
        for (int i = 0; i < THREADS / 32; i++) tot += red[i];
        if (mode == MODE_CPASYNC || mode == MODE_BULK) tot += (float)sm[per_block - 1];
        sink[blockIdx.x] = tot;
        rec[3 * blockIdx.x] = t1 - t0;
        rec[3 * blockIdx.x + 1] = t2 - t1;
        rec[3 * blockIdx.x + 2] = t3 - t0;
    }
}

static int cmp_u64(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

static double median_of(unsigned long long *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_u64);
    return v[n / 2] / 1000.0;
}

int main(void) {
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int blocks = 3 * sms;
    uint8_t *w;
    float *x, *sink;
    unsigned long long *rec;
    CHECK(cudaMalloc(&w, WBUF));
    CHECK(cudaMemset(w, 1, WBUF));
    CHECK(cudaMalloc(&x, XN * sizeof(float)));
    CHECK(cudaMalloc(&sink, blocks * sizeof(float)));
    CHECK(cudaMalloc(&rec, 3 * (size_t)blocks * sizeof *rec));
    CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    unsigned long long *h = (unsigned long long *)malloc(3 * (size_t)blocks * LAUNCHES * sizeof *h);
    unsigned long long *col = (unsigned long long *)malloc((size_t)blocks * LAUNCHES * sizeof *col);
    static const char *names[] = {"none", "cp.async 16 B a thread", "cp.async.bulk (TMA) a block",
                                  "16 B loads into registers"};
    printf("%d blocks of %d threads (3 a SM); medians over blocks and %d launches, us after the block's start\n\n",
           blocks, THREADS, LAUNCHES);
    printf("| weights a block | requested by | issue | vector in, after the issue | weights in |\n");
    printf("|---:|---|---:|---:|---:|\n");
    const size_t sizes[] = {16 << 10, 32 << 10, 48 << 10};
    for (int si = 0; si < 3; si++)
        for (int mode = 0; mode < 4; mode++) {
            size_t per = sizes[si], span = per * blocks, off = 0;
            if (mode == MODE_NONE && si > 0) continue;
            for (int l = 0; l < LAUNCHES + 2; l++) {
                if (off + span > WBUF) off = 0;
                write_x<<<4, 256>>>(x, (float)l);
                probe<<<blocks, THREADS, (unsigned)per>>>(w + off, per, mode, x, sink, rec);
                CHECK(cudaGetLastError());
                CHECK(cudaDeviceSynchronize());
                if (l >= 2)
                    CHECK(cudaMemcpy(h + 3 * (size_t)blocks * (l - 2), rec, 3 * (size_t)blocks * sizeof *h,
                                     cudaMemcpyDeviceToHost));
                off += span;
            }
            double m[3];
            for (int c = 0; c < 3; c++) {
                for (size_t i = 0; i < (size_t)blocks * LAUNCHES; i++) col[i] = h[3 * i + c];
                m[c] = median_of(col, (size_t)blocks * LAUNCHES);
            }
            printf("| %zu KB | %s | %.2f | %.2f | %.2f |\n", mode == MODE_NONE ? 0 : per >> 10, names[mode], m[0], m[1],
                   mode == MODE_NONE ? 0.0 : m[2]);
        }
    return 0;
}
