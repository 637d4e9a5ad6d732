/* The CUDA op library: the GPU kernels of tern's forward pass behind a C
 * API. Every op takes device pointers and a stream, enqueues its kernels
 * and returns at once (0, or -1 with err set if the arguments are outside
 * what the kernels handle or the launch failed); nothing synchronises, so a
 * sequence of ops can be captured in a CUDA graph. Each op has a CPU twin
 * in src/cpu/ (or, where tern has none, a reference in tests/cuda/) and is
 * checked against it by `make test-cuda`; docs/CUDA.md lists the ops, the
 * layouts, the checker's results and the timings.
 *
 * Layouts are the CPU engine's (src/engine/forward.c): activations fp32
 * row-major [T, n]; weights tern_mat (model/weights.h) with device
 * pointers in data/scales/biases; the KV cache rows of cpu/kvquant.h.
 *
 * Ops that need scratch take a caller-owned device workspace whose size a
 * *_workspace() function gives, so the same buffers serve every step of a
 * captured graph.
 *
 * One header per op family, included here: cuda_device.h (memory, streams,
 * graphs, timing), cuda_gemv.h, cuda_moe.h, cuda_norm.h, cuda_attention.h,
 * cuda_gdn.h, cuda_sample.h. */
#ifndef TERN_CUDA_OPS_H
#define TERN_CUDA_OPS_H

#include "cuda/cuda_attention.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_gdn.h"
#include "cuda/cuda_gemv.h"
#include "cuda/cuda_moe.h"
#include "cuda/cuda_norm.h"
#include "cuda/cuda_sample.h"

#endif
