/* A speculative step of the generation (tern_gen_params.mtp_depth): the
 * MTP head drafts N tokens, the model evaluates the taken token and the
 * drafts in one verify pass (engine/mtp.c), and the tokens after each
 * verified position are taken in order, each as the plain loop takes the
 * token after an evaluated one: its checks first (the last id was in, the
 * caller cancelled, a limit), then the next id. A draft the rule keeps is
 * the next position's token; any other id ends the step and is evaluated
 * by the next one. The session then holds exactly the tokens taken.
 *
 * The rule: greedy keeps a draft when it is the model's own choice there
 * (so the ids are those decoding without drafts gives); sampling keeps a
 * draft x with probability min(1, p(x) / q(x)) and otherwise draws from
 * max(0, p - q) renormalised, p and q the model's and the head's
 * distributions after the same sampler steps, the penalties seeing the
 * same earlier tokens; past the last draft the id is drawn from p. The
 * ids then have the model's distribution (Leviathan et al. 2023,
 * "Fast Inference from Transformers via Speculative Decoding").
 *
 * Under a grammar, each draft is drawn under the mask the grammar gives
 * after the drafts before it (the matcher is saved, advanced over the
 * drafts, and restored), and each verified row under the mask after the
 * ids taken before it; a draft the grammar would end after is the last
 * one. p and q then share their mask wherever a draft is checked. */
#include <stdlib.h>
#include <string.h>

#include "engine/gen.h"
#include "util/clock.h"
#include "util/err.h"

int tern_spec_init(gen_state *g, const tern_session *s, int depth, tern_error *err) {
    if (depth == 0) return 0;
    if (depth == TERN_MTP_AUTO) depth = TERN_MTP_MAX_DEPTH;
    size_t V = (size_t)s->m->cfg.vocab, H = (size_t)s->m->cfg.hidden, D = (size_t)depth;
    spec_buf *b = &g->spec;
    mtp_auto_init(&b->ctl);
    b->q = malloc(D * V * sizeof(float));
    b->qp = malloc(D * V * sizeof(float));
    b->pp = malloc(V * sizeof(float));
    b->logits = malloc((D + 1) * V * sizeof(float));
    b->hidden = malloc((D + 1) * H * sizeof(float));
    b->h = malloc(2 * H * sizeof(float));
    if (!b->q || !b->qp || !b->pp || !b->logits || !b->hidden || !b->h)
        return tern_fail(err, "out of memory for speculative decoding buffers");
    return 0;
}

void tern_spec_free(gen_state *g) {
    spec_buf *b = &g->spec;
    free(b->q);
    free(b->qp);
    free(b->pp);
    free(b->logits);
    free(b->hidden);
    free(b->h);
    memset(b, 0, sizeof *b);
}

/* Drafts this step, of n wanted: none past what the generation may still
 * take, nor past the context (the verify holds them and the taken token). */
static int depth_now(const tern_gen *g, int n) {
    int room = g->s->max_ctx - tern_session_pos(g->s) - 1;
    if (n > room) n = room;
    if (g->p.n_predict >= 0 && n > g->p.n_predict - g->st.n_generated) n = g->p.n_predict - g->st.n_generated;
    return n > 0 ? n : 0;
}

/* (the mask covers the sampler's valid ids: the lm_head's rows past them are padding) */
static int mask_empty(const gen_state *gs) {
    int n = tern_sampler_n_valid(gs->sampler);
    for (int w = 0; w * 32 < n; w++) {
        uint32_t bits = gs->mask[w];
        if (n - w * 32 < 32) bits &= (1u << (n - w * 32)) - 1;
        if (bits) return 0;
    }
    return 1;
}

/* Draft i's draw from the head's logits q (its distribution into qp when
 * sampling): under the grammar's mask after the drafts before it, which
 * it then advances. 0 and *d = -1: the grammar allows nothing more. */
static int draw_draft(tern_gen *g, int i, const float *q, float *qp, int32_t *d, tern_error *err) {
    gen_state *gs = &g->g;
    int V = tern_model_vocab_size(g->s->m), n_hist = gs->n_history + i;
    *d = -1;
    if (gs->matcher) {
        if (tern_gen_mask(g, g->st.n_generated + i, tern_session_pos(g->s) + 1 + i, err)) return -1;
        if (mask_empty(gs)) return 0;
    }
    if (tern_sampler_greedy(gs->sampler)) *d = tern_sampler_sample(gs->sampler, q, gs->history, n_hist, err);
    else if (tern_sampler_probs(gs->sampler, q, gs->history, n_hist, qp, err)) return -1;
    else if ((*d = tern_sampler_draw_probs(gs->sampler, qp, V)) < 0)
        return tern_fail(err, "the MTP draft's distribution is empty");
    if (*d < 0) return -1;
    return gs->matcher ? tern_matcher_accept(gs->matcher, *d, err) : 0;
}

/* tok[1..*N]: the head's drafts, the first from the model's last state and
 * tok[0], each next one from the head's own output and the draft before
 * it, drawn under the generation's sampler (whose penalties see the
 * drafts before it, written after the history); fewer (*N lowered) where
 * the grammar allows nothing more. */
static int draft(tern_gen *g, int *N, int32_t *tok, tern_error *err) {
    gen_state *gs = &g->g;
    spec_buf *b = &gs->spec;
    tern_session *s = g->s;
    size_t V = (size_t)s->m->cfg.vocab, H = (size_t)s->m->cfg.hidden;
    if (gs->matcher && tern_matcher_save(gs->matcher, err)) return -1;
    tern_mtp_align(s);
    const float *in = s->hidden;
    int rc = 0;
    for (int i = 0; i < *N; i++) {
        float *out = b->h + (size_t)(i % 2) * H, *q = b->q + (size_t)i * V, *qp = b->qp + (size_t)i * V;
        int32_t d;
        if ((rc = tern_mtp_forward(s, in, &tok[i], 1, q, out, err)) || (rc = draw_draft(g, i, q, qp, &d, err))) break;
        if (d < 0) {
            *N = i;
            break;
        }
        tok[i + 1] = gs->history[gs->n_history + i] = d;
        in = out;
    }
    if (gs->matcher) tern_matcher_restore(gs->matcher);
    return rc;
}

/* The id after verified row i: the draft tok[i + 1] when the rule keeps it
 * (*kept), else the model's (the residual's draw when sampling). */
static int32_t choose(tern_gen *g, int i, int N, const int32_t *tok, int *kept, tern_error *err) {
    gen_state *gs = &g->g;
    spec_buf *b = &gs->spec;
    int V = tern_model_vocab_size(g->s->m);
    const float *row = b->logits + (size_t)i * V;
    *kept = 0;
    double force = g->s->m->mtp_force_accept;
    if (force > 0 && i < N) {   /* (debug.mtp_force_accept: a benchmark's set acceptance) */
        *kept = tern_sampler_next_uniform(gs->sampler) < force;
        return *kept ? tok[i + 1] : tern_sampler_sample(gs->sampler, row, gs->history, gs->n_history, err);
    }
    if (i == N || tern_sampler_greedy(gs->sampler)) {
        int32_t t = tern_sampler_sample(gs->sampler, row, gs->history, gs->n_history, err);
        *kept = i < N && t == tok[i + 1];
        return t;
    }
    float *p = b->pp;
    const float *q = b->qp + (size_t)i * V;
    if (tern_sampler_probs(gs->sampler, row, gs->history, gs->n_history, p, err)) return -1;
    int32_t d = tok[i + 1];
    double ratio = (double)p[d] / q[d];   /* q[d] > 0: d was drawn from q */
    if (ratio >= 1 || (ratio > 0 && tern_sampler_next_uniform(gs->sampler) < ratio)) {
        *kept = 1;
        return d;
    }
    double left = 0;
    for (int v = 0; v < V; v++) {
        p[v] = p[v] > q[v] ? p[v] - q[v] : 0;
        left += p[v];
    }
    /* (nothing left only when p equals q to rounding, where the draft is
     * kept but for rounding: p itself is the residual then) */
    if (!(left > 0) && tern_sampler_probs(gs->sampler, row, gs->history, gs->n_history, p, err)) return -1;
    int32_t t = tern_sampler_draw_probs(gs->sampler, p, V);
    return t >= 0 ? t : tern_fail(err, "the model's distribution is empty");
}

/* The ids after verified rows 0, 1, ... taken in order (speculate.c's
 * head comment); *k: the verified tokens the session keeps. */
static int take_rows(tern_gen *g, int p, int N, const int32_t *tok, int *k, tern_error *err) {
    size_t V = (size_t)tern_model_vocab_size(g->s->m);
    int ended = 0;
    for (int i = 0;; i++) {
        *k = i + 1;
        int stop = ended;
        if (!stop && g->p.cancelled && g->p.cancelled(g->ctx)) {
            g->reason = TERN_STOP_CALLER;
            stop = 1;
        }
        if (stop || tern_gen_limit(&g->p, g->s, g->st.n_generated, p + i + 1, &g->reason)) {
            g->phase = GEN_DONE;
            return 0;
        }
        int kept;
        if (g->g.matcher && tern_gen_mask(g, g->st.n_generated, p + i + 1, err)) return -1;
        int32_t t = choose(g, i, N, tok, &kept, err);
        if (t < 0 || (g->g.matcher && tern_matcher_accept(g->g.matcher, t, err))) return -1;
        if (g->p.on_logprobs && tern_gen_logprobs(g, g->g.spec.logits + (size_t)i * V, t, err)) return -1;
        int end = tern_gen_accept(g, t, err);
        if (end < 0) return -1;
        if (kept) {
            g->st.n_accepted++;
            ended = end;
            continue;
        }
        g->next = t;
        g->last = end;
        g->phase = GEN_NEXT;
        return 0;
    }
}

static int step_at(tern_gen *g, int depth, tern_error *err) {
    gen_state *gs = &g->g;
    tern_session *s = g->s;
    int N = depth_now(g, depth);
    int32_t tok[TERN_MTP_MAX_DEPTH + 1] = {g->next};
    if (N > 0 && draft(g, &N, tok, err)) return -1;
    if (N == 0)
        return tern_session_eval(s, &g->next, 1, gs->logits, 0, err) || tern_gen_take(g, gs->logits, err) ? -1 : 0;
    tern_spec_verify v;
    if (tern_mtp_verify(s, tok, N + 1, gs->spec.logits, gs->spec.hidden, &v, err)) return -1;
    g->st.n_verify++;
    g->st.n_drafted += N;
    int k = 1, rc = take_rows(g, v.p, N, tok, &k, err);
    tern_error e;
    if (tern_mtp_keep(s, &v, k, gs->spec.hidden, rc ? &e : err)) return -1;
    return rc;
}

int tern_spec_step(tern_gen *g, tern_error *err) {
    if (g->p.mtp_depth != TERN_MTP_AUTO) return step_at(g, g->p.mtp_depth, err);
    mtp_auto *ctl = &g->g.spec.ctl;
    int depth = mtp_auto_depth(ctl), n0 = g->st.n_generated;
    if (ctl->settled && g->s->mtp_track && tern_session_set_mtp(g->s, 0, err)) return -1;
    double t0 = tern_now_s();
    int rc = step_at(g, depth, err);
    if (rc == 0) mtp_auto_record(ctl, depth, g->st.n_generated - n0, tern_now_s() - t0);
    return rc;
}
