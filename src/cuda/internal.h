/* What the op files share beyond the public header: the context's fields. */
#ifndef TERN_CUDA_INTERNAL_H
#define TERN_CUDA_INTERNAL_H

#include <cublas_v2.h>

#include "cuda/cuda_ops.h"

struct tern_cuda_ctx {
    cublasHandle_t blas;
    void *tile;              /* bf16 dequantized rows of a weight */
    size_t tile_bytes;
    void *xb;                /* bf16 activations of a prefill */
    size_t xb_bytes;
};

int ctx_reserve_x(tern_cuda_ctx *c, size_t bytes, tern_error *err);

#endif
