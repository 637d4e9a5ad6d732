/* Picks the next token from a row of logits.
 *
 * Order of operations (that of llama.cpp's default chain and vLLM, with
 * temperature before truncation):
 *
 *   1. mask      ids >= n_valid (padding rows of the lm_head) never count,
 *                nor ids a grammar's mask leaves out (tern_sampler_set_mask)
 *   2. penalties over the token history:
 *                repetition (HF/CTRL): l > 0 ? l / r : l * r   for seen ids
 *                frequency and presence (OpenAI): l -= count * f + (count > 0) * p
 *   3. greedy    if do_sample == 0 or temperature <= 0: the argmax
 *                (lowest id on ties), nothing below applies
 *   4. temperature l /= T
 *   5. top-k     keep the k most likely ids
 *   6. top-p     keep the fewest most likely ids whose probability
 *                (renormalised over what top-k kept) reaches p
 *   7. min-p     keep ids with probability >= min_p * (largest probability)
 *   8. draw      from what is left, renormalised, with the sampler's own
 *                xoshiro256** generator (same seed, same logits -> same ids)
 *
 * Ties in probability are ordered by id, so truncation is deterministic.
 * The history is whatever the caller passes (vLLM penalises generated
 * tokens for presence/frequency and prompt + generated for repetition;
 * llama.cpp the last 64 tokens): the sampler does not keep one.
 */
#ifndef TERN_ENGINE_SAMPLER_H
#define TERN_ENGINE_SAMPLER_H

#include <stdint.h>

#include "tern.h"



typedef struct tern_sampler tern_sampler;

/* n_vocab: entries in a logits row; n_valid <= n_vocab: the tokenizer's
 * vocabulary (248077 for Qwen3.6 against 248320 lm_head rows). */
tern_sampler *tern_sampler_create(const tern_sampler_params *p, int n_vocab, int n_valid,
                                  tern_error *err);
void tern_sampler_destroy(tern_sampler *s);

/* A token mask (tern_grammar_mask_words words, bit set: allowed) the
 * next calls apply in step 1, until set again; NULL: none. Borrowed. */
void tern_sampler_set_mask(tern_sampler *s, const uint32_t *mask);

/* Restarts the random sequence. */
void tern_sampler_seed(tern_sampler *s, uint64_t seed);

/* The next token id, or -1 (err set) if no id has a finite logit. */
int32_t tern_sampler_sample(tern_sampler *s, const float *logits, const int32_t *history,
                            int n_history, tern_error *err);

/* The distribution step 8 draws from, as n_vocab probabilities (zero for
 * everything truncated; one-hot when greedy). For logprobs and tests. */
int tern_sampler_probs(tern_sampler *s, const float *logits, const int32_t *history,
                       int n_history, float *probs, tern_error *err);

/* The logits after steps 1, 2 and 4 (masked ids -inf; no temperature when
 * greedy). */
int tern_sampler_logits(tern_sampler *s, const float *logits, const int32_t *history,
                        int n_history, float *out, tern_error *err);

/* Sampling on the GPU (engine/gpu_decode.c) follows these rules too. 1 when the
 * GPU kernels can: no penalties, and greedy or 1 <= top_k <= max_k; the
 * rule's parameters are written out. */
int tern_sampler_gpu_rule(const tern_sampler *s, int max_k, int *greedy, float *temperature, int *top_k,
                          float *top_p, float *min_p);
/* The next number of the sampler's random sequence, in [0, 1): the draw's u. */
double tern_sampler_next_uniform(tern_sampler *s);
/* 1 when the sampler takes the argmax (step 3). */
int tern_sampler_greedy(const tern_sampler *s);
/* An id drawn from n probabilities (any total > 0) with the sampler's next
 * random number, or -1 when none is positive. */
int32_t tern_sampler_draw_probs(tern_sampler *s, const float *probs, int n);
int tern_sampler_n_valid(const tern_sampler *s);

#endif
