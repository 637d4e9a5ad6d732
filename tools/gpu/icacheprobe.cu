/* icacheprobe: what running cold code costs on this GPU. A kernel of one
 * warp per SM runs N x 8 independent FMAs as straight-line code (N x 128
 * bytes of SASS); thread 0 of each block times the run with %globaltimer.
 * "warm": the same kernel again right after itself; "cold": right after a
 * different kernel of the same size (other code, same work), so its
 * instructions come from L2 or memory. The difference over the code size
 * is the price of a cold instruction byte, the figure behind keeping the
 * one-token kernels' executed code small (docs/experiments/cuda-moe.md, step 56).
 *
 *   nvcc -O3 -gencode arch=compute_90,code=sm_90 -o icacheprobe tools/gpu/icacheprobe.cu && ./icacheprobe */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define PROBE_NAME "icacheprobe"
#include "probe.cuh"

/* SALT makes each instance's code its own (a different constant). */
template <int N, int SALT>
__global__ void straight(float *out, unsigned long long *ns, float a) {
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = threadIdx.x + j;
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = fmaf(v[j], a, (float)(SALT + 1));
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) s += v[j];
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) ns[blockIdx.x] = t1 - t0;
}

template <int N>
static void probe(int sms, float *out, unsigned long long *ns) {
    unsigned long long *h = (unsigned long long *)malloc(sms * sizeof *h);
    double warm = 0, cold = 0;
    const int reps = 20;
    for (int r = 0; r < reps; r++) {
        /* cold: A after B; warm: A after A */
        straight<N, 1><<<sms, 32>>>(out, ns, 0.999f);
        straight<N, 0><<<sms, 32>>>(out, ns, 0.999f);
        CHECK(cudaMemcpy(h, ns, sms * sizeof *h, cudaMemcpyDeviceToHost));
        unsigned long long m = 0;
        for (int i = 0; i < sms; i++) m = h[i] > m ? h[i] : m;
        cold += m;
        straight<N, 0><<<sms, 32>>>(out, ns, 0.999f);
        CHECK(cudaMemcpy(h, ns, sms * sizeof *h, cudaMemcpyDeviceToHost));
        m = 0;
        for (int i = 0; i < sms; i++) m = h[i] > m ? h[i] : m;
        warm += m;
    }
    cold /= reps;
    warm /= reps;
    const double kb = N * 8 * 16 / 1024.0;
    printf("%6d FMAs (%6.0f KB of code): warm %8.2f us, cold %8.2f us, cold extra %7.2f us = %5.1f ns per KB\n",
           N * 8, kb, warm / 1e3, cold / 1e3, (cold - warm) / 1e3, (cold - warm) / kb);
    free(h);
}

int main(void) {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float *out;
    unsigned long long *ns;
    CHECK(cudaMalloc(&out, sms * 32 * sizeof(float)));
    CHECK(cudaMalloc(&ns, sms * sizeof(unsigned long long)));
    probe<16>(sms, out, ns);
    probe<64>(sms, out, ns);
    probe<256>(sms, out, ns);
    probe<1024>(sms, out, ns);
    probe<2048>(sms, out, ns);
    return 0;
}
