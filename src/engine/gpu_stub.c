/* The GPU engine's entry points (engine/gpu.h) in a build without CUDA:
 * each fails with a message saying so (make CUDA=1 builds gpu_*.c). */
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
int tern_gpu_session_init(tern_session *s, tern_error *err) { (void)s; return no_cuda(err); }
void tern_gpu_session_free(tern_session *s) { (void)s; }
int tern_gpu_grow(uint8_t **p, size_t o, size_t n, tern_error *err) { (void)p; (void)o; (void)n; return no_cuda(err); }
int tern_gpu_copy(void *h, void *d, size_t n, int to_host, tern_error *err) {
    (void)h; (void)d; (void)n; (void)to_host;
    return no_cuda(err);
}
int tern_gpu_session_reset(tern_session *s, tern_error *err) { (void)s; return no_cuda(err); }
void *tern_gpu_alloc(size_t n, tern_error *err) { (void)n; no_cuda(err); return NULL; }
void tern_gpu_free(void *p) { (void)p; }
int tern_gpu_copy_d2d(void *dst, const void *src, size_t n, tern_error *err) {
    (void)dst; (void)src; (void)n;
    return no_cuda(err);
}
int tern_gpu_wait(tern_error *err) { return no_cuda(err); }
int tern_gpu_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all, tern_error *err) {
    (void)s; (void)tokens; (void)T; (void)logits; (void)all;
    return no_cuda(err);
}
int tern_gpu_sampling_enabled(const tern_session *s) { (void)s; return 0; }
int tern_gpu_sample_fits(int n_valid, int top_k) { (void)n_valid; (void)top_k; return 0; }
int tern_gpu_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                            tern_error *err) {
    (void)s; (void)token; (void)rule; (void)u; (void)next;
    return no_cuda(err);
}
int tern_gpu_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    (void)s; (void)token; (void)rule; (void)u;
    return no_cuda(err);
}
int tern_gpu_sample_wait(tern_session *s, int32_t *next, tern_error *err) {
    (void)s; (void)next;
    return no_cuda(err);
}
int tern_gpu_sample_in_flight(const tern_session *s) { (void)s; return 0; }

#endif
