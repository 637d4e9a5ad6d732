/* A session's backend: the engine that holds the session's sequence state
 * (the attention layers' KV rows, the DeltaNet layers' conv window and
 * recurrent state) and runs its steps. tern_session_create picks one for
 * the model (the CPU's, cpu_backend.c; the GPU's, gpu_session.c) and keeps
 * it for the session's life, with the backend's own state struct in
 * s->state. session.c checks each call (tokens, context, a broken session)
 * and keeps what no backend owns (position, the MTP head's KV rows, the
 * hidden state, snapshots' headers), then calls the backend; backends never
 * call back into session.c. */
#ifndef TERN_ENGINE_BACKEND_H
#define TERN_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "tern.h"

/* The sampler's rule for a draw inside the step (engine/sampler.h's, as
 * tern_sampler_gpu_rule gives it) over the first n_valid logits; mask: a
 * grammar's allowed ids (bit i of word i / 32, host memory the backend
 * copies at the launch), or NULL. */
typedef struct tern_gpu_rule {
    int n_valid, greedy, top_k;
    float temperature, top_p, min_p;
    const uint32_t *mask;
} tern_gpu_rule;

/* A row of a pass drawn in the step: the rule at u (on: this row). */
typedef struct tern_row_draw {
    int on;
    tern_gpu_rule r;
    double u;
} tern_row_draw;

/* Where a copy's ends are: host memory or the backend's memory (a GPU's
 * device memory; host memory again on the CPU). */
typedef enum tern_copy_kind {
    TERN_COPY_TO_BE,          /* host -> backend */
    TERN_COPY_TO_HOST,        /* backend -> host */
    TERN_COPY_IN_BE           /* backend -> backend */
} tern_copy_kind;

typedef struct tern_backend {
    int kv_bits;              /* the KV rows' precision when the session asks none (kv_bits 0) */
    int eval_piece;           /* tokens per forward call of an evaluation; 0: the whole run at once */
    /* A server steps its requests together (tern_model_batches): the CPU's.
     * Not yet the GPU's, whose forward_many is slower than one request's
     * captured step with the next one launched before the last id is read
     * (docs/PERFORMANCE.md, "Many sequences at once"). */
    int server_batches;

    /* s->state: made once s->kvf and s->max_ctx are set (after a failure,
     * destroy frees what was made), freed, and back to a new session's
     * (nothing in flight). */
    int (*create)(tern_session *s, tern_error *err);
    void (*destroy)(tern_session *s);
    int (*reset)(tern_session *s, tern_error *err);
    /* KV rows for `needed` positions; fails past s->max_ctx. */
    int (*reserve)(tern_session *s, int needed, tern_error *err);
    /* The positions of KV rows allocated, and their memory given back
     * (after reset: nothing in flight; the next reserve allocates anew). */
    int (*kv_cap)(const tern_session *s);
    void (*release_rows)(tern_session *s);

    /* tern_forward's step: T checked tokens at s->pos, the rows reserved. */
    int (*forward)(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                   float *hidden_out, tern_error *err);
    /* Several sessions' steps in one pass (tern_session_eval_many_draw,
     * each checked and its rows reserved). draw and id may be NULL: a row
     * with draw[i].on is drawn in the step by its own rule, into id[i],
     * where the backend draws there (the GPU); every other row's id is -1
     * and its logits go to logits + i * vocab (logits may be NULL).
     * hidden (may be NULL): hidden[i], where not NULL, gets session i's
     * n[i] final-normed hidden states (the CPU's; the GPU refuses). */
    int (*forward_many)(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                        const tern_row_draw *draw, int32_t *id, float *logits, float *const *hidden,
                        tern_error *err);
    /* tern_mtp_forward's head (fails where it does not run). */
    int (*mtp_forward)(tern_session *s, const float *hidden, const int32_t *next, int n, float *logits,
                       float *hidden_out, tern_error *err);
    /* A speculative step's verify (engine/speculate.c): T checked tokens at
     * s->pos, the rows reserved, each computed as a one-token step computes
     * it (so that greedy decoding with drafts gives the tokens it gives
     * without), with the logits and final-normed hidden states of every
     * row. keep: also keep the state after each token, for rollback. NULL
     * where speculative decoding does not run (the GPU, not yet). */
    int (*verify)(tern_session *s, const int32_t *tokens, int T, float *logits, float *hidden_out, int keep,
                  tern_error *err);
    /* Brings the layer state back to the first k (1..T) tokens of the
     * verify just run with keep (the session's position and hidden state
     * are the engine's). NULL: the engine saves the recurrent state before
     * the verify (save/load) and evaluates the kept tokens again. */
    int (*rollback)(tern_session *s, int k, tern_error *err);

    /* Sampling in the step (engine.h's tern_session_sample_*): whether rule
     * can be drawn there, and the step with its draw, whole or in two
     * halves (token checked; these fail where the step cannot sample). */
    int (*sample_ok)(const tern_session *s, const tern_gpu_rule *rule);
    int (*forward_sample)(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                          tern_error *err);
    int (*sample_launch)(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err);
    int (*sample_wait)(tern_session *s, int32_t *next, tern_error *err);
    int (*sample_in_flight)(const tern_session *s);

    /* Snapshots. A snapshot's layer state is the pieces tern_state_spans
     * lists (engine.h): every attention layer's K then V rows [from, pos),
     * then, with recurrent, every DeltaNet layer's conv window and state;
     * tern_state_bytes of it. save copies it into buf, load back from buf
     * (buffers from snap_alloc, in the backend's memory). Copies may be only
     * enqueued: they are done once wait returns. */
    int (*save)(const tern_session *s, uint8_t *buf, int from, int pos, int recurrent, tern_error *err);
    int (*load)(tern_session *s, const uint8_t *buf, int from, int pos, int recurrent, tern_error *err);
    int (*copy)(void *dst, const void *src, size_t n, tern_copy_kind kind, tern_error *err);
    void *(*snap_alloc)(size_t n, tern_error *err);
    void (*snap_free)(void *p);
    int (*wait)(tern_error *err);
    /* Host memory a snapshot may move to (tern_snapshot_to_host) and still
     * be saved from and loaded by the ops above: page-locked on the GPU, so
     * its copies run at the link's speed. NULL where snap_alloc's memory is
     * the host's already (the CPU). */
    void *(*host_alloc)(size_t n, tern_error *err);
    void (*host_free)(void *p);
} tern_backend;

extern const tern_backend tern_cpu_backend;   /* cpu_backend.c */
extern const tern_backend tern_gpu_backend;   /* gpu_session.c; gpu_stub.c's create fails without CUDA */

#endif
