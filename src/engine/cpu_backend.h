/* The CPU backend's session state and its forward pass (forward.c): the
 * host KV rows and DeltaNet state that tern_cpu_forward reads and
 * advances. cpu_backend.c makes and grows them and holds the backend's
 * table (engine/backend.h). */
#ifndef TERN_ENGINE_CPU_BACKEND_H
#define TERN_ENGINE_CPU_BACKEND_H

#include "engine/engine.h"

typedef struct tern_cpu_state {
    int cap;                  /* KV rows allocated */
    tern_kv *kv;              /* per layer; NULL arrays for DeltaNet layers */
    tern_gdn_state *gdn;      /* per layer; NULL arrays for attention layers */
} tern_cpu_state;

/* One sequence of a forward call: n tokens of session s at s->pos, the
 * logits of its last row (all rows with all_logits; none when NULL) and
 * its final hidden states (NULL: none). */
typedef struct tern_cpu_seq {
    tern_session *s;
    const int32_t *tokens;
    int n;
    float *logits;
    int all_logits;
    float *hidden_out;
} tern_cpu_seq;

/* forward.c: tern_forward's step once the tokens are checked and the
 * caches hold them, for one session or for several sessions of the model
 * at once (each at its own position: the projections and the experts run
 * over all their rows together, each token's result the same as alone);
 * tern_mtp_forward's head. */
int tern_cpu_forward_many(const tern_cpu_seq *q, int n_seq, tern_error *err);
int tern_cpu_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                     float *hidden_out, tern_error *err);
int tern_cpu_mtp_forward(tern_session *s, const float *hidden, const int32_t *next, int n, float *logits,
                         tern_error *err);

#endif
