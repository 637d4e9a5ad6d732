/* Internals of the model and session objects shared by the engine's files
 * (the public view is tern.h). */
#ifndef TERN_ENGINE_ENGINE_H
#define TERN_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdlib.h>

#include "cpu/kvquant.h"
#include "engine/backend.h"
#include "experts/cache.h"
#include "model/config.h"
#include "model/manifest.h"
#include "model/tensors.h"
#include "model/weights.h"
#include "tern.h"
#include "util/err.h"
#include "util/pool.h"

struct tern_model {
    char *dir;
    tern_config cfg;
    tern_tensor_set ts;
    tern_weights w;
    tern_pool *pool;
    float *inv_freq;          /* [rope_dim / 2] RoPE frequencies (model/rope.h) */
    int fast;                 /* SIMD kernels for decode-sized products */
    int mtp_recompute;        /* tern_load_params.debug.mtp_recompute */
    double mtp_force_accept;  /* tern_load_params.debug.mtp_force_accept */
    int isa;                  /* tern_isa chosen at load */
    /* packed models */
    int packed;
    tern_manifest man;
    tern_expert_cache *experts;   /* streaming: the slot cache */
    void **expert_maps;           /* resident: one mapping per expert file */
    size_t expert_map_size;
    uint64_t gpu_expert_budget;   /* a GPU model's expert budget: experts mapped, the GPU streams them */
    int gpu_expert_policy;        /* its slot cache's ranking (enum tern_expert_policy_kind) */
    int gpu_expert_home;          /* where its other experts live (enum tern_expert_home_kind) */
    void *gpu;                    /* engine/gpu_model.c: the weights on the GPU (NULL: the CPU engine) */
    /* tern_model_identity, worked out at its first call (identity.c) */
    pthread_mutex_t identity_mu;
    char identity[65];            /* "" until then */
};

/* A model with its thread pool and kernel choice, nothing loaded yet, and
 * the step after the weights are bound (params' RoPE scaling, the RoPE
 * tables). model.c. */
tern_model *tern_model_alloc(const tern_load_params *params, tern_error *err);
int tern_model_finish(tern_model *m, const tern_load_params *params, tern_error *err);
/* An expert budget on the GPU: params' budget and policy checked and kept
 * in m. model.c. */
int tern_gpu_budget_set(tern_model *m, const tern_load_params *p, tern_error *err);
/* A reader of a packed model's first n_files expert files (decoder
 * layers, then the MTP layer's) through `slots` host slots per file.
 * model.c. */
tern_expert_cache *tern_model_expert_reader(const tern_model *m, int n_files, int slots, int policy, int io_threads,
                                            tern_error *err);

/* Moves the model to params->device (engine/gpu.h) when one is named. */
int tern_model_place(tern_model *m, const tern_load_params *params, tern_error *err);

/* y[T, W.rows] = x[T, W.cols] @ W^T for the CPU engine: the SIMD kernels
 * (cpu/qmatvec.h) when the model runs them, else the reference product
 * tern_matmul. forward.c. */
void tern_mm(tern_model *m, float *y, const float *x, int64_t T, const tern_mat *W);

/* Scratch of n floats for a forward step, which must not fail midway: an
 * allocation failure there is not a recoverable input error, so it aborts. */
static inline float *tern_scratch_f(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) abort();
    return p;
}

/* KV cache of one full-attention layer: one row of n_kv_heads * head_dim
 * values per position (k after q/k-norm and RoPE, v as projected), stored
 * as fp32 (the reference) or quantized rows (cpu/kvquant.h). */
typedef struct tern_kv {
    uint8_t *k, *v;
} tern_kv;

typedef struct tern_kv_format {
    int bits;                 /* 32 = fp32 rows; 16, 8, 4 = tern_kvq rows */
    tern_kvq q;               /* the quantized layout (bits < 32) */
    size_t row_bytes;
} tern_kv_format;

/* Gated DeltaNet state of one layer. */
typedef struct tern_gdn_state {
    float *conv;              /* [kernel - 1, conv_dim]: the last pre-conv qkv rows, oldest first */
    float *S;                 /* [v_heads, k_dim, v_dim] fp32 recurrent state */
} tern_gdn_state;

/* Called after each decoder layer with the residual stream [T, hidden]
 * (tests compare it with the reference's per-layer hidden states). */
typedef void (*tern_layer_hook)(void *ctx, int layer, const float *x, int T);

struct tern_session {
    tern_model *m;
    const tern_backend *be;   /* chosen at creation: runs the steps and holds `state` */
    void *state;              /* the backend's session state */
    int gdn_mode;
    int max_ctx;
    tern_kv_format kvf;
    int pos;                  /* tokens held */
    /* The MTP head's KV rows: row r holds the pair (hidden state at
     * position mtp_base + r, the token after it), at RoPE position r;
     * mtp_pos rows. mtp_track: every evaluation keeps them in step
     * (engine/mtp.c). */
    tern_kv mtp_kv;
    int mtp_pos, mtp_cap, mtp_base, mtp_track;
    float *hidden;            /* [hidden] final-normed state of the last token (MTP input) */
    const float *hidden_dev;  /* where the backend's memory holds it now (a GPU session's last step
                               * leaves it on the device; snapshots copy it from there), NULL when
                               * `hidden` is current; never a per-token copy */
    int has_hidden;
    int broken;               /* a step failed midway (an expert read): state is inconsistent */
    tern_layer_hook hook;
    void *hook_ctx;
    tern_route_fn route_fn;   /* tern_session_set_route_observer */
    void *route_ud;
};

/* The KV rows to allocate for `needed` positions when `cap` are held:
 * capacity doubles from 256, so a long prefill does not reallocate per
 * token, up to max_ctx; -1 past it. */
static inline int tern_kv_next_cap(int cap, int needed, int max_ctx, tern_error *err) {
    if (needed > max_ctx)
        return tern_fail(err, "context full: %d tokens exceed the session's max context of %d", needed, max_ctx);
    int n = cap < 256 ? 256 : cap;
    while (n < needed) n = n > max_ctx / 2 ? max_ctx : n * 2;
    return n > max_ctx ? max_ctx : n;
}

/* Host KV rows (the CPU's, the MTP head's) grown to hold `needed`
 * positions, *cap updated. cpu_backend.c. */
int tern_kv_reserve_host(tern_kv *kv, int *cap, int needed, int max_ctx, size_t row_bytes, tern_error *err);

/* One piece of a session's layer state: n bytes at p (host or device
 * memory, the backend's). */
typedef struct tern_span {
    uint8_t *p;
    size_t n;
} tern_span;

/* The pieces of the layers' state a snapshot holds, in backend.h's order:
 * every attention layer's K then V rows [from, pos), then, with recurrent,
 * every DeltaNet layer's conv window then state. Empty pieces are left
 * out (an empty cache may have no buffer). Returns how many went into
 * out (at most 2 * n_layers). engine_state.c. */
int tern_state_spans(const tern_config *c, const tern_kv *kv, const tern_gdn_state *gdn, size_t row_bytes, int from,
                     int pos, int recurrent, tern_span *out);
/* Their total size. */
size_t tern_state_bytes(const tern_config *c, size_t row_bytes, int from, int pos, int recurrent);

/* The KV rows' layout for bits (0: 32, fp32 rows; 16, 8, 4 quantized).
 * session.c. */
int tern_kv_format_init(tern_kv_format *f, const tern_config *c, int bits, tern_error *err);

/* KV rows for `needed` positions, refused past the session's context
 * (session.c). */
int tern_session_reserve_rows(tern_session *s, int needed, tern_error *err);

/* Runs T tokens through the model at positions pos..pos+T-1 and advances
 * pos. logits: T rows if all_logits, else the last row (may be NULL).
 * hidden_out: [T, hidden] final-normed states (may be NULL). session.c:
 * the checks, the KV caches' growth, then the session's backend. */
int tern_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                 float *hidden_out, tern_error *err);
/* Every id within the vocabulary (forward.c). */
int tern_check_tokens(const tern_config *c, const int32_t *tokens, int T, tern_error *err);

/* Whether the session's steps can draw the next id with rule (a GPU
 * session's, unless debug.cpu_sampling, with a rule its sampler takes). */
int tern_session_sample_ok(const tern_session *s, const tern_gpu_rule *rule);
/* A GPU session's decode step and the draw of the next id in one go: token
 * at s->pos, then the rule at u over its logits; *next gets the id (the
 * only bytes that come back). tern_session_eval's checks first. */
int tern_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                        tern_error *err);
int tern_forward_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err);
int tern_session_eval_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                             tern_error *err);
/* The same step in two halves, so that the next one can be enqueued before
 * the host has read this one's draw: _launch enqueues the step (s->pos
 * counts it at once; token -1 evaluates the draw of the step launched
 * before it, read on the device), _wait waits for the oldest step in
 * flight and gives its draw. At most two steps are in flight; other
 * evaluations and snapshots need none (wait for them first). */
int tern_session_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err);
int tern_session_sample_wait(tern_session *s, int32_t *next, tern_error *err);
int tern_session_sample_in_flight(const tern_session *s);

/* tern_session_eval_many where rows may be drawn in the step: a row with
 * draw[i].on gets its id in id[i] when the backend draws in the step
 * (else -1 and its logits, as every other row's, in logits + i * vocab). */
int tern_session_eval_many_draw(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                                const tern_row_draw *draw, int32_t *id, float *logits, tern_error *err);

/* The MTP head over n (hidden state, next token) pairs at its next n
 * positions; logits [n, vocab] and its final-normed output [n, hidden]
 * (each may be NULL). */
int tern_mtp_forward(tern_session *s, const float *hidden, const int32_t *next, int n, float *logits,
                     float *hidden_out, tern_error *err);

/* ---- the MTP head in step with the sequence, speculative steps (mtp.c) ---- */

/* Brings the head's rows in step with the sequence before an evaluation:
 * they must end at the last evaluated position (whose pair waits for the
 * token after it; at the session's position where it has no last state:
 * new, or filled). Rows past it are dropped; rows that fall short (tokens
 * evaluated while the head was not tracked) restart there, the head then
 * seeing the sequence from that position on. */
void tern_mtp_align(tern_session *s);
/* tern_forward; with the head tracked, also its rows for the pairs the
 * tokens complete. */
int tern_forward_tracked(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                         tern_error *err);
/* tern_session_eval_many_draw's pass (checked) where some sessions track
 * the head. */
int tern_forward_many_tracked(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                              const tern_row_draw *draw, int32_t *id, float *logits, tern_error *err);

/* A speculative step's verify: where it started and how to go back. */
typedef struct tern_spec_verify {
    int p, T;                 /* the session's position before it; tokens verified */
    int keep;                 /* the backend kept each token's state (its rollback) */
    uint8_t *ckpt;            /* else: the recurrent state at p (the backend's memory) */
    const int32_t *tokens;
} tern_spec_verify;

/* Evaluates T tokens (the last taken token, then the drafts) at s->pos
 * with tern_session_eval's checks, each as a one-token step computes it:
 * logits [T, vocab] and hidden [T, hidden] of every row. */
int tern_mtp_verify(tern_session *s, const int32_t *tokens, int T, float *logits, float *hidden, tern_spec_verify *v,
                    tern_error *err);
/* Keeps the first k (1..T) verified tokens: the layer state, position and
 * hidden state as if only they had been evaluated, the MTP head's rows in
 * step again (its draft rows replaced by the verified pairs). Frees v's
 * checkpoint. */
int tern_mtp_keep(tern_session *s, tern_spec_verify *v, int k, const float *hidden, tern_error *err);
/* Frees v's checkpoint when the step ends early. */
void tern_mtp_verify_free(tern_session *s, tern_spec_verify *v);

#endif
