/* The routed experts of the CPU engine's MoE block (experts_cpu.c): how
 * the experts the router chose are scheduled, given the top-k of every
 * token. forward.c's MoE block calls it between the router and the shared
 * expert. */
#ifndef TERN_ENGINE_EXPERTS_CPU_H
#define TERN_ENGINE_EXPERTS_CPU_H

#include "engine/engine.h"

/* One expert's FFN on n tokens: out[n, H] = (silu(x G^T) * (x U^T)) D^T. */
void tern_expert_ffn(tern_model *m, const tern_expert_w *e, const float *x, int n, float *out);

/* out[T, H] = the routed experts' sum: each token's K experts (idx, wt
 * [T, K]: ids and weights) applied to its row of xn and added in ascending
 * expert order (as the reference's eager loop does), whatever schedule
 * runs them: resident experts grouped into two parallel loops at decode
 * sizes, else one expert at a time; streamed experts in waves through the
 * slot cache. Fails only when an expert read fails. */
int tern_moe_routed(tern_model *m, const tern_moe_w *w, const float *xn, int T, const int *idx, const float *wt,
                    float *out, tern_error *err);

#endif
