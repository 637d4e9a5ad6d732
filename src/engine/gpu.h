/* The CUDA path of the engine: a packed model's weights uploaded once, a
 * session's state (KV rows, DeltaNet state) in device memory, and the
 * forward pass of forward.c in the same order on the ops of src/cuda. The
 * CPU engine is its reference (tests/cuda/check_engine.c compares them).
 *
 * A GPU session keeps the CPU session's struct: its kv[l].k/v and
 * gdn[l].conv/S fields hold device pointers, so snapshots walk the same
 * state in the same order with device copies. Built without CUDA
 * (make CUDA=1), every entry point fails with a message saying so. */
#ifndef TERN_ENGINE_GPU_H
#define TERN_ENGINE_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/sample_limits.h"   /* TERN_GPU_SAMPLE_MAX_K: the most top-k the GPU sampler keeps */
#include "engine/engine.h"

/* Parses "cuda" / "cuda:N"; uploads m's weights (a packed, resident model).
 * params (may be NULL): serial_sessions and the debugging aids (debug). */
int tern_gpu_model_init(tern_model *m, const char *device, const tern_load_params *params, tern_error *err);
void tern_gpu_model_free(tern_model *m);
const char *tern_gpu_name(const tern_model *m);   /* "cuda:N (name)" */

/* Device state and scratch of a session on a GPU model (kv bits 16/8/4). */
int tern_gpu_session_init(tern_session *s, tern_error *err);
void tern_gpu_session_free(tern_session *s);
/* A session's device state back to a new session's (no step in flight). */
int tern_gpu_session_reset(tern_session *s, tern_error *err);

/* Device KV rows: a new buffer of new_bytes holding the first old_bytes of
 * *p (NULL: nothing yet), the old one freed. */
int tern_gpu_grow(uint8_t **p, size_t old_bytes, size_t new_bytes, tern_error *err);
/* Copies between a device pointer and host memory (to_host picks the way). */
int tern_gpu_copy(void *host, void *dev, size_t n, int to_host, tern_error *err);
/* Device memory for a GPU session's snapshots (taking and restoring one are
 * device copies), and copies between device pointers: enqueued in order on
 * the default stream, done once tern_gpu_wait returns. They read state the
 * session's last piece or step left, which ends synchronised. */
void *tern_gpu_alloc(size_t n, tern_error *err);
void tern_gpu_free(void *p);
int tern_gpu_copy_d2d(void *dst, const void *src, size_t n, tern_error *err);
int tern_gpu_wait(tern_error *err);

/* tern_forward on the GPU: T tokens at s->pos; logits as tern_forward. */
int tern_gpu_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                     tern_error *err);

/* Sampling on the GPU (unless tern_load_params.debug.cpu_sampling):
 * tern_gpu_forward_sample is a decode step and the draw of the next id with
 * the sampler's rule (tern_sampler_gpu_rule) at u, together: one captured
 * graph, the token and u go up, only the id comes back, one
 * synchronisation. */
int tern_gpu_sampling_enabled(const tern_session *s);
/* Whether the GPU sampler takes n_valid ids at top_k (its merge's size). */
int tern_gpu_sample_fits(int n_valid, int top_k);
int tern_gpu_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                            tern_error *err);
/* The same step in two halves (tern_session_sample_launch): the launch
 * enqueues it, its input in the block the step in flight does not read
 * and its id into that block's word, and grows the KV caches first when
 * they must (after waiting for the steps in flight); the wait gives the
 * oldest step's draw. */
int tern_gpu_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err);
int tern_gpu_sample_wait(tern_session *s, int32_t *next, tern_error *err);
int tern_gpu_sample_in_flight(const tern_session *s);

#endif
