/* The sparse MoE block's reference math (../shared/docs/qwen36-model.md
 * §2.6): the router's top-k rule and the SwiGLU activation. The expert
 * products themselves are tern_matmul (or the SIMD kernels); the engine
 * (engine/forward.c, engine/experts_cpu.c) and the CUDA checkers call
 * these, so there is one rule to match. */
#ifndef TERN_CPU_MOE_H
#define TERN_CPU_MOE_H

#include <stddef.h>

/* Router: probs [E] holds the router's logits and becomes their softmax;
 * idx and wt [K] get the top k (largest first, ties to the lower index)
 * and their probabilities, renormalised to sum 1 over the k if renorm. */
void tern_moe_topk(float *probs, int E, int K, int renorm, int *idx, float *wt);

/* The SwiGLU activation: h[i] = silu(gate[i]) * up[i], i < n. h may be
 * gate or up. */
void tern_swiglu(float *h, const float *gate, const float *up, size_t n);

#endif
