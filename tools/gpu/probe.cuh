/* What the single-file GPU probes (readprobe.cu, holprobe.cu,
 * icacheprobe.cu) share: CHECK(call) ends the probe with the failing call
 * and CUDA's message. Define PROBE_NAME (the probe's name, for the message)
 * before including this. */
#ifndef TERN_TOOLS_GPU_PROBE_CUH
#define TERN_TOOLS_GPU_PROBE_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                       \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s: %s: %s\n", PROBE_NAME, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

#endif
