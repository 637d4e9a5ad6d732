/* The GPU engine's entry points (engine/gpu.h) and backend in a build
 * without CUDA: each fails with a message saying so (make CUDA=1 builds
 * gpu_*.c). No model is ever placed on a GPU here, so no GPU session
 * exists: the backend needs only to refuse to make one. */
#include "engine/gpu.h"

#include "util/err.h"

#ifndef TERN_CUDA

static int no_cuda(tern_error *err) {
    return tern_fail(err, "this tern was built without CUDA (make CUDA=1 builds the GPU engine)");
}
int tern_gpu_model_init(tern_model *m, const char *device, const tern_load_params *params, tern_error *err) {
    (void)m; (void)device; (void)params;
    return no_cuda(err);
}
void tern_gpu_model_free(tern_model *m) { (void)m; }
const char *tern_gpu_name(const tern_model *m) { (void)m; return "cpu"; }
void tern_gpu_stream_stats(const tern_model *m, tern_stream_stats *out) { (void)m; (void)out; }

static int session_create(tern_session *s, tern_error *err) { (void)s; return no_cuda(err); }
static void session_destroy(tern_session *s) { (void)s; }

const tern_backend tern_gpu_backend = {.kv_bits = 16, .create = session_create, .destroy = session_destroy};

#endif
