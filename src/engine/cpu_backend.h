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
    /* A verify's kept states (backend.h): for each DeltaNet layer in turn,
     * the conv window then the recurrent state after each of its first
     * keep_T - 1 tokens; keep_T 0 when none is kept (any other step drops
     * them). */
    float *keep;
    size_t keep_cap;          /* floats allocated */
    int keep_T;
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
    /* the DeltaNet recurrence token by token, each as a one-token step runs
     * it; keep: the state after each token also goes to the state's keep
     * (one sequence only) */
    int step, keep;
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
                         float *hidden_out, tern_error *err);
/* The backend's verify (backend.h); its rollback is cpu_backend.c's. */
int tern_cpu_verify(tern_session *s, const int32_t *tokens, int T, float *logits, float *hidden_out, int keep,
                    tern_error *err);
/* Floats one DeltaNet layer's kept state takes per token. */
size_t tern_cpu_keep_floats(const tern_config *c);

#endif
