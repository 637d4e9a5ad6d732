/* The CPU sampler's cost per draw over Qwen 3.6's vocabulary (248,320
 * logits): full-vocabulary sampling (temperature 1, no top-k/top-p) and
 * Qwen's recommended top-k 20 / top-p 0.95. `make bench &&
 * build/bench/bench_sampler`. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "util/clock.h"

static double per_draw_ms(const tern_sampler_params *p, const float *logits, int V) {
    tern_error err;
    tern_sampler *s = tern_sampler_create(p, V, V, &err);
    if (!s) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    int32_t hist[4] = {1, 2, 3, 4};
    long acc = 0;
    int n = 200;
    double t0 = tern_now_s();
    for (int i = 0; i < n; i++) acc += tern_sampler_sample(s, logits, hist, 4, &err);
    double ms = (tern_now_s() - t0) / n * 1e3;
    tern_sampler_destroy(s);
    return acc >= 0 ? ms : -1;
}

int main(void) {
    int V = 248320;
    float *logits = malloc((size_t)V * sizeof *logits);
    srand(1);
    for (int i = 0; i < V; i++) logits[i] = (float)(rand() % 1000) / 300.0f;
    tern_sampler_params p;
    tern_sampler_params_default(&p);
    p.do_sample = 1;
    p.temperature = 1;
    p.top_k = 0;
    p.top_p = 1;
    printf("full vocabulary (temperature 1):  %.3f ms per draw\n", per_draw_ms(&p, logits, V));
    p.top_k = 20;
    p.top_p = 0.95f;
    printf("top-k 20, top-p 0.95:             %.3f ms per draw\n", per_draw_ms(&p, logits, V));
    free(logits);
    return 0;
}
