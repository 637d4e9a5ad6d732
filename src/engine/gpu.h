/* The CUDA path of the engine: a packed model's weights uploaded once, a
 * session's state (KV rows, DeltaNet state) in device memory, and the
 * forward pass of forward.c in the same order on the ops of src/cuda. The
 * CPU engine is its reference (tests/gpu/check_engine.c compares them).
 *
 * This header is the model's side; a GPU session is the GPU backend
 * (engine/backend.h's tern_gpu_backend, gpu_session.c), which session.c
 * reaches through the session. Built without CUDA (make CUDA=1), every
 * entry point fails with a message saying so. */
#ifndef TERN_ENGINE_GPU_H
#define TERN_ENGINE_GPU_H

#include "engine/engine.h"

/* Parses "cuda" / "cuda:N"; uploads m's weights (a packed, resident model).
 * params (may be NULL): serial_sessions and the debugging aids (debug). */
int tern_gpu_model_init(tern_model *m, const char *device, const tern_load_params *params, tern_error *err);
void tern_gpu_model_free(tern_model *m);
const char *tern_gpu_name(const tern_model *m);   /* "cuda:N (name)" */
/* Under an expert budget: the slot cache's statistics (hits and misses of
 * the steps counted so far; bytes: with the experts' home in RAM, misses
 * read over the host link plus the promotions' and the prefill staging's
 * copies; on disk, what was read from the files). */
void tern_gpu_stream_stats(const tern_model *m, tern_stream_stats *out);

#endif
