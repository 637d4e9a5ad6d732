/* The generation's state, shared by the loop (generate.c) and its
 * speculative steps (speculate.c). */
#ifndef TERN_ENGINE_GEN_H
#define TERN_ENGINE_GEN_H

#include "engine/engine.h"
#include "engine/mtp_auto.h"
#include "engine/sampler.h"
#include "text/detok.h"
#include "text/stop.h"

/* Sampling on the GPU (a GPU session, unless debug.cpu_sampling, and a rule
 * the kernels take): logits stay on the device and only the id comes back. */
typedef struct {
    int on;
    tern_gpu_rule r;
} gpu_rule;

/* A speculative step's buffers (mtp_depth not 0), sized for the depth
 * (the most for TERN_MTP_AUTO, whose choice is ctl's). */
typedef struct {
    float *q;                 /* [depth, vocab] the head's logits per draft */
    float *qp;                /* [depth, vocab] the distributions the drafts were drawn from (sampling) */
    float *pp;                /* [vocab] the model's distribution at a position (sampling) */
    float *logits;            /* [depth + 1, vocab] the verify's rows */
    float *hidden;            /* [depth + 1, hidden] the verify's states */
    float *h;                 /* [2, hidden] the head's outputs, each the next draft's input */
    mtp_auto ctl;
} spec_buf;

typedef struct {
    tern_model *model;
    tern_sampler *sampler;
    gpu_rule gpu;
    tern_detok *detok;
    tern_stop *stop;
    float *logits;
    float *lp;                /* on_logprobs: the sampler's logits, then their log-softmax */
    int32_t *history;         /* prompt + generated (+ room for a step's drafts): the penalties' window */
    int n_history;
    tern_matcher *matcher;    /* the grammar's state, or NULL */
    uint32_t *mask;           /* the tokens it allows next */
    spec_buf spec;
} gen_state;

enum { GEN_PROMPT, GEN_NEXT, GEN_DONE };

struct tern_gen {
    gen_state g;
    tern_session *s;
    tern_gen_params p;
    tern_text_fn on_text;
    void *ctx;
    const int32_t *prompt;
    int n_prompt, phase;
    int32_t next;             /* the sampled id to evaluate next */
    int last;                 /* next ended the generation: evaluated, then done */
    int reason;
    double t0, t1;
    tern_gen_stats st;
};

/* generate.c: a drawn id taken (counted, announced, streamed; 1 when it
 * ends the generation, -1 on an error); the log-probabilities of id in a
 * row of logits, reported; whether a limit stops the loop with n
 * generated and the session at pos (*reason: why). */
int tern_gen_accept(tern_gen *g, int32_t id, tern_error *err);
int tern_gen_logprobs(tern_gen *g, const float *logits, int32_t id, tern_error *err);
int tern_gen_limit(const tern_gen_params *p, const tern_session *s, int n, int pos, int *reason);
/* The grammar's mask (g->g.matcher's, into g->g.mask) for the draw of the
 * id at position pos, with n_generated ids before it: the limits leave
 * n_predict - n_generated ids and the context's room past pos. */
int tern_gen_mask(tern_gen *g, int n_generated, int pos, tern_error *err);

/* speculate.c: the step buffers for p->mtp_depth (none for 0), freed; one
 * speculative step of g (phase GEN_NEXT, its next id not the last), at
 * the depth asked or, for TERN_MTP_AUTO, chosen. */
int tern_spec_init(gen_state *g, const tern_session *s, int depth, tern_error *err);
void tern_spec_free(gen_state *g);
int tern_spec_step(tern_gen *g, tern_error *err);

#endif
