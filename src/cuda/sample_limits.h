/* The GPU sampler's limits, for host code that does not include the CUDA
 * op header (the generation loop decides where to sample with it). */
#ifndef TERN_CUDA_SAMPLE_LIMITS_H
#define TERN_CUDA_SAMPLE_LIMITS_H

/* The most candidates tern_cuda_sample's top-k keeps (TERN_CUDA_SAMPLE_MAX_K). */
#define TERN_GPU_SAMPLE_MAX_K 64

#endif
