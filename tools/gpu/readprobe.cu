/* readprobe: the read floor of one kernel of a given size on this GPU.
 * 24 kernels in one CUDA graph, each reading `MB` megabytes from its own
 * buffer (rotating, so nothing stays in L2) with 16-byte streaming loads,
 * four in flight per thread; the best of 5 replays per size,
 * for 1..8 blocks of 512 threads per SM; with "prefetch-next" each kernel
 * also asks L2 for the next kernel's buffer (cp.async.bulk.prefetch.L2).
 * Last, an empty kernel's cost in a graph. These are the floors quoted in
 * docs/experiments/cuda-gemv.md (round 3).
 *
 *   nvcc -O3 -gencode arch=compute_90,code=sm_90 -o readprobe tools/gpu/readprobe.cu && ./readprobe */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define PROBE_NAME "readprobe"
#include "probe.cuh"

#define NBUF 24
#define UNROLL 4

/* Reads n16 16-byte words; with pf, block b first asks L2 for its slice of
 * pf (pieces of 64 KB). The xor keeps the loads from being removed. */
__global__ void read_kernel(const uint4 *__restrict__ p, size_t n16, unsigned *out, const char *pf, size_t pf_bytes) {
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
    if (pf && threadIdx.x == 0) {
        size_t per = (pf_bytes / gridDim.x + 15) & ~(size_t)15, off = blockIdx.x * per;
        size_t n = off < pf_bytes ? (off + per > pf_bytes ? pf_bytes - off : per) : 0;
        for (size_t o = 0; o < n; o += 65536) {
            unsigned sz = (unsigned)(n - o < 65536 ? n - o : 65536);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pf + off + o), "r"(sz) : "memory");
        }
    }
    unsigned acc = 0;
    for (size_t i = tid; i < n16; i += nt * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            size_t j = i + u * nt;
            v[u] = j < n16 ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

/* Microseconds per kernel of a graph of NBUF launches (best of 5). */
static double time_graph(cudaStream_t s, char **bufs, size_t bytes, int blocks, int prefetch, unsigned *out) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < NBUF; r++)
        read_kernel<<<blocks, 512, 0, s>>>((const uint4 *)bufs[r], bytes / 16, out, prefetch ? bufs[(r + 1) % NBUF] : NULL,
                                          bytes);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaStreamSynchronize(s));
    float best = 1e30f;
    for (int k = 0; k < 5; k++) {
        float ms;
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaGraphLaunch(ge, s));
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return best * 1e3 / NBUF;
}

int main(void) {
    static const size_t mb[] = {1, 3, 5, 10, 14, 28};
    const size_t max_bytes = (size_t)28 << 20;
    char *bufs[NBUF];
    unsigned *out;
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    for (int i = 0; i < NBUF; i++) {
        CHECK(cudaMalloc((void **)&bufs[i], max_bytes));
        CHECK(cudaMemset(bufs[i], i, max_bytes));
    }
    CHECK(cudaMalloc((void **)&out, 4));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    printf("| mode | blocks/SM | MB | us per kernel | GB/s |\n|---|---:|---:|---:|---:|\n");
    for (int prefetch = 0; prefetch < 2; prefetch++)
        for (int per_sm = 1; per_sm <= 8; per_sm *= 2)
            for (size_t i = 0; i < sizeof mb / sizeof mb[0]; i++) {
                size_t bytes = mb[i] << 20;
                double us = time_graph(s, bufs, bytes, sms * per_sm, prefetch, out);
                printf("| %s | %d | %zu | %.2f | %.0f |\n", prefetch ? "prefetch-next" : "plain", per_sm, mb[i], us,
                       bytes / us / 1e3);
            }
    printf("empty kernel in a graph: %.2f us\n", time_graph(s, bufs, 0, sms, 0, out));
    for (int i = 0; i < NBUF; i++) CHECK(cudaFree(bufs[i]));
    CHECK(cudaFree(out));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
