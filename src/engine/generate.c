/* The generation loop shared by the CLI and the server: prefill, then sample
 * -> stream text -> evaluate, until a stop condition. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/sample_limits.h"   /* TERN_GPU_SAMPLE_MAX_K: the most top-k the GPU sampler keeps */
#include "engine/gen.h"
#include "text/tokenizer.h"
#include "util/err.h"
#include "util/clock.h"

static void gen_free(gen_state *g) {
    tern_sampler_destroy(g->sampler);
    tern_detok_free(g->detok);
    tern_stop_free(g->stop);
    free(g->logits);
    free(g->lp);
    free(g->history);
    tern_spec_free(g);
    tern_matcher_destroy(g->matcher);
    free(g->mask);
}

/* Streams the text of one id through the detokenizer and the stop matcher.
 * Returns 1 when a stop string matched or the caller asked to stop. */
static int emit(gen_state *g, int32_t id, tern_text_fn on_text, void *ctx, int *reason, int *which,
                tern_error *err) {
    if (!g->detok) return 0;
    const char *piece, *out;
    size_t plen, olen;
    if (tern_detok_push(g->detok, id, &piece, &plen, err) != 0) return -1;
    int hit = tern_stop_push(g->stop, piece, plen, &out, &olen, which);
    if (hit < 0) return tern_fail(err, "out of memory matching stop strings");
    if (olen && on_text && on_text(ctx, out, olen)) { *reason = TERN_STOP_CALLER; return 1; }
    if (hit) { *reason = TERN_STOP_STRING; return 1; }
    return 0;
}

static void flush(gen_state *g, tern_text_fn on_text, void *ctx) {
    if (!g->detok) return;
    const char *piece, *out;
    size_t plen, olen;
    tern_detok_flush(g->detok, &piece, &plen);
    if (plen) {
        tern_stop_push(g->stop, piece, plen, &out, &olen, NULL);
        if (olen && on_text) on_text(ctx, out, olen);
    }
    tern_stop_flush(g->stop, &out, &olen);
    if (olen && on_text) on_text(ctx, out, olen);
}

/* The grammar's matcher and mask (the CPU sampler's, and the GPU's draw's). */
static int grammar_init(gen_state *g, const tern_tokenizer *tok, const tern_gen_params *p, int V, tern_error *err) {
    if (!tok) return tern_fail(err, "a grammar needs the tokenizer it was compiled for");
    if (p->ignore_eos) return tern_fail(err, "ignore_eos cannot be combined with a grammar (it ends the generation)");
    const tern_grammar_vocab *v = tern_grammar_vocabulary(p->grammar);
    if (!v) return tern_fail(err, "the grammar was compiled without a vocabulary");
    if (tern_grammar_mask_words(v) * 32 < tern_sampler_n_valid(g->sampler))
        return tern_fail(err, "the grammar's vocabulary has fewer tokens than the model (%d)", V);
    g->matcher = tern_matcher_create(p->grammar, err);
    if (!g->matcher) return -1;
    g->mask = calloc((size_t)tern_grammar_mask_words(v), sizeof *g->mask);
    if (!g->mask) return tern_fail(err, "out of memory");
    tern_sampler_set_mask(g->sampler, g->mask);
    return 0;
}

static int gen_init(gen_state *g, tern_session *s, tern_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                    const tern_gen_params *p, tern_error *err) {
    memset(g, 0, sizeof *g);
    g->model = s->m;
    int V = tern_model_vocab_size(s->m);
    int n_valid = tok ? tern_tokenizer_vocab_size(tok) : V;
    if (n_valid > V) n_valid = V;
    if (p->on_logprobs && (p->top_logprobs < 0 || p->top_logprobs > TERN_MAX_TOP_LOGPROBS))
        return tern_fail(err, "top_logprobs must be in [0, %d], got %d", TERN_MAX_TOP_LOGPROBS, p->top_logprobs);
    if ((p->mtp_depth < 0 && p->mtp_depth != TERN_MTP_AUTO) || p->mtp_depth > TERN_MTP_MAX_DEPTH)
        return tern_fail(err, "mtp_depth must be in [0, %d] or TERN_MTP_AUTO, got %d", TERN_MTP_MAX_DEPTH,
                         p->mtp_depth);
    if (p->mtp_depth && tern_session_set_mtp(s, 1, err)) return -1;
    int max_new = s->max_ctx - s->pos - (int)n_prompt;
    size_t n_before = p->history ? p->n_history : 0;
    size_t hist_cap = n_before + n_prompt + (size_t)(max_new > 0 ? max_new : 0) + 1 + TERN_MTP_MAX_DEPTH;
    g->logits = malloc((size_t)V * sizeof(float));
    g->history = malloc(hist_cap * sizeof(int32_t));
    g->lp = p->on_logprobs ? malloc((size_t)V * sizeof(float)) : NULL;
    if (!g->logits || !g->history || (p->on_logprobs && !g->lp)) return tern_fail(err, "out of memory");
    if (n_before) memcpy(g->history, p->history, n_before * sizeof(int32_t));
    memcpy(g->history + n_before, prompt, n_prompt * sizeof(int32_t));
    g->n_history = (int)(n_before + n_prompt);
    g->sampler = tern_sampler_create(&p->sampling, V, n_valid, err);
    if (!g->sampler) return -1;
    if (p->grammar && grammar_init(g, tok, p, V, err)) return -1;
    tern_gpu_rule *r = &g->gpu.r;
    r->n_valid = tern_sampler_n_valid(g->sampler);
    /* (a vocabulary too large for the GPU sampler's merge at this top-k: the CPU sampler) */
    if (tern_spec_init(g, s, p->mtp_depth, err)) return -1;
    r->mask = g->mask;
    g->gpu.on = !p->on_logprobs && !p->mtp_depth &&
                tern_sampler_gpu_rule(g->sampler, TERN_GPU_SAMPLE_MAX_K, &r->greedy, &r->temperature, &r->top_k,
                                      &r->top_p, &r->min_p) &&
                tern_session_sample_ok(s, r);
    if (!tok) return 0;
    g->detok = tern_detok_create(tok, 1, err);
    if (!g->detok) return -1;
    g->stop = tern_stop_create(p->stop, (size_t)p->n_stop, err);
    return g->stop ? 0 : -1;
}

/* The GPU sampler's random number: the CPU sampler's next one (the GPU
 * draws one for every sampled token; the CPU sampler skips it when one
 * candidate is left). */
static double next_u(gen_state *g) { return g->gpu.r.greedy ? 0.0 : tern_sampler_next_uniform(g->sampler); }

/* The GPU's next id: the one it drew with the last step. */
static int32_t next_id(int32_t drawn, tern_error *err) {
    return drawn >= 0 ? drawn : tern_fail(err, "GPU sampling: no id was drawn");
}

/* Under a grammar, the mask of a draw made n tokens on from the session's
 * position, when the loop will take that draw (as take_id would make it
 * after evaluating those tokens); a draw it drops reads an older mask. */
static int draw_mask(tern_gen *g, int n, tern_error *err) {
    int why, pos = tern_session_pos(g->s) + n;
    if (!g->g.matcher || g->last || tern_gen_limit(&g->p, g->s, g->st.n_generated, pos, &why)) return 0;
    return tern_gen_mask(g, g->st.n_generated, pos, err);
}

/* Evaluates one token on the GPU, whose step always draws the next id
 * too: one launch per token, and always the same captured graphs (a step
 * without the draw would be another graph, captured anew whenever the loop
 * switched between them); a draw the loop does not take is dropped. The
 * step is only launched: the loop waits for its draw (gen_wait). */
static int eval_id(tern_gen *g, int32_t id, tern_error *err) {
    if (draw_mask(g, 1, err)) return -1;
    return tern_session_sample_launch(g->s, id, &g->g.gpu.r, next_u(&g->g), err);
}

/* The prompt; its last token goes through eval_id's step, whose draw is
 * the first id. */
static int eval_prompt(tern_gen *g, tern_error *err) {
    int n = g->n_prompt;
    if (n > 1 && tern_session_eval(g->s, g->prompt, n - 1, NULL, 0, err)) return -1;
    return eval_id(g, g->prompt[n - 1], err);
}

/* The log-probabilities of id under the sampler's distribution before
 * truncation, and the best top_logprobs ids (ties by id). */
int tern_gen_logprobs(tern_gen *gen, const float *logits, int32_t id, tern_error *err) {
    gen_state *g = &gen->g;
    const tern_gen_params *p = &gen->p;
    int V = tern_model_vocab_size(g->model);
    if (tern_sampler_logits(g->sampler, logits, g->history, g->n_history, g->lp, err)) return -1;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) if (g->lp[i] > mx) mx = g->lp[i];
    for (int i = 0; i < V; i++) sum += isfinite(g->lp[i]) ? exp((double)g->lp[i] - mx) : 0.0;
    double lse = mx + log(sum);
    tern_logprobs out = {.id = id, .logprob = (float)(g->lp[id] - lse)};
    /* one pass keeping the best n sorted; ids ascend, so a tie goes after */
    int n = p->top_logprobs;
    for (int i = 0; i < V && n > 0; i++) {
        float v = g->lp[i];
        if (!isfinite(v) || (out.n_top == n && v <= out.top_logprobs[n - 1])) continue;
        int at = out.n_top < n ? out.n_top++ : n - 1;
        while (at > 0 && out.top_logprobs[at - 1] < v) {
            out.top_logprobs[at] = out.top_logprobs[at - 1];
            out.top_ids[at] = out.top_ids[at - 1];
            at--;
        }
        out.top_logprobs[at] = v;
        out.top_ids[at] = i;
    }
    for (int k = 0; k < out.n_top; k++) out.top_logprobs[k] = (float)(out.top_logprobs[k] - lse);
    p->on_logprobs(gen->ctx, &out);
    return 0;
}

/* Whether the loop may not take another id (n generated, the session at
 * pos), and why (*reason). */
int tern_gen_limit(const tern_gen_params *p, const tern_session *s, int n, int pos, int *reason) {
    if (p->n_predict >= 0 && n >= p->n_predict) *reason = TERN_STOP_LENGTH;
    else if (pos >= s->max_ctx) *reason = TERN_STOP_CONTEXT;
    else return 0;
    return 1;
}

/* The GPU's next id: the draw of the oldest step in flight. Before waiting
 * for it, the step that evaluates it is launched (its token the device's
 * copy of the draw) when the loop is sure to take and evaluate it: every
 * taken id is evaluated, EOS and stop included, unless a limit ends the
 * loop first, and both limits are known a step ahead. The host's turn
 * between steps (its wake-up, the stop checks, the launch) then overlaps
 * the GPU's next step. Not under a grammar: the next draw's mask depends on
 * this draw. *ahead: launched. */
static int gen_wait(tern_gen *g, int32_t *drawn, int *ahead, tern_error *err) {
    int why;
    *ahead = 0;
    if (!g->g.matcher && !tern_gen_limit(&g->p, g->s, g->st.n_generated, tern_session_pos(g->s), &why)) {
        if (eval_id(g, -1, err)) return -1;
        *ahead = 1;
    }
    return tern_session_sample_wait(g->s, drawn, err);
}

/* The steps still in flight when the loop ends: their draws are dropped. */
static void gen_drain(tern_session *s) {
    int32_t id;
    tern_error e;
    while (tern_session_sample_in_flight(s) > 0 && tern_session_sample_wait(s, &id, &e) == 0) {}
}

/* ---- generation in steps (tern_gen) ---------------------------------------- */

tern_gen *tern_gen_create(tern_session *s, tern_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                          const tern_gen_params *p, tern_text_fn on_text, void *ctx, tern_error *err) {
    if (n_prompt == 0) {
        tern_fail(err, "generation needs at least one prompt token");
        return NULL;
    }
    tern_gen *g = calloc(1, sizeof *g);
    if (!g) {
        tern_fail(err, "out of memory");
        return NULL;
    }
    *g = (tern_gen){.s = s, .p = *p, .on_text = on_text, .ctx = ctx, .prompt = prompt, .n_prompt = (int)n_prompt,
                    .reason = TERN_STOP_LENGTH, .t0 = tern_now_s()};
    g->st = (tern_gen_stats){.n_prompt = (int)n_prompt, .last_token = -1, .stop_index = -1};
    if (gen_init(&g->g, s, tok, prompt, n_prompt, p, err)) {
        gen_free(&g->g);
        free(g);
        return NULL;
    }
    return g;
}

int tern_gen_input(const tern_gen *g, const int32_t **tokens) {
    if (g->phase == GEN_PROMPT) *tokens = g->prompt;
    else if (g->phase == GEN_NEXT) *tokens = &g->next;
    else return 0;
    return g->phase == GEN_PROMPT ? g->n_prompt : 1;
}

/* A generated id: counted, announced, its text streamed. 1 when it ends
 * the generation (an EOS id: reason EOS; a stop string or the caller:
 * emit's reason), 0 when not, -1 on an error. Every generated id still
 * enters the session (the EOS too), so the next turn continues exactly
 * what was generated. */
int tern_gen_accept(tern_gen *g, int32_t id, tern_error *err) {
    gen_state *gs = &g->g;
    const tern_gen_params *p = &g->p;
    gs->history[gs->n_history++] = id;
    g->st.n_generated++;
    g->st.last_token = id;
    if (p->on_token) p->on_token(g->ctx, id);
    /* EOS ids from generation_config.json, else the model's config.json */
    int eos = !p->ignore_eos && (p->sampling.n_eos ? tern_sampler_is_eos(&p->sampling, id)
                                                   : tern_model_is_eos(g->s->m, id));
    if (eos) {
        g->reason = TERN_STOP_EOS;
        return 1;
    }
    return emit(gs, id, g->on_text, g->ctx, &g->reason, &g->st.stop_index, err);
}

/* A drawn id taken: accepted, and the next token to evaluate. */
static int take_next(tern_gen *g, int32_t id, tern_error *err) {
    int end = tern_gen_accept(g, id, err);
    if (end < 0) return -1;
    g->next = id;
    g->last = end;
    g->phase = GEN_NEXT;
    return 0;
}

int tern_gen_mask(tern_gen *g, int n_generated, int pos, tern_error *err) {
    long long budget = g->p.n_predict >= 0 ? g->p.n_predict - n_generated : -1;
    long long room = g->s->max_ctx - pos;
    if (budget < 0 || room < budget) budget = room;
    return tern_matcher_fill_mask(g->g.matcher, g->g.mask, (int)budget, err);
}

/* The next id from the host's logits, with its log-probabilities. */
static int take_id(tern_gen *g, tern_error *err) {
    gen_state *gs = &g->g;
    if (gs->matcher && tern_gen_mask(g, g->st.n_generated, tern_session_pos(g->s), err)) return -1;
    int32_t id = tern_sampler_sample(gs->sampler, gs->logits, gs->history, gs->n_history, err);
    if (id < 0) return -1;
    if (gs->matcher && tern_matcher_accept(gs->matcher, id, err)) return -1;
    if (g->p.on_logprobs && tern_gen_logprobs(g, gs->logits, id, err)) return -1;
    return take_next(g, id, err);
}

/* Whether the step just evaluated ends the generation before a draw (the
 * last id was in, the caller cancelled, a limit): 1, the phase DONE. */
static int take_ends(tern_gen *g) {
    if (g->phase == GEN_PROMPT) g->t1 = tern_now_s();
    int last = g->last;
    g->phase = GEN_DONE;
    if (last) return 1;
    if (g->p.cancelled && g->p.cancelled(g->ctx)) {
        g->reason = TERN_STOP_CALLER;
        return 1;
    }
    return tern_gen_limit(&g->p, g->s, g->st.n_generated, tern_session_pos(g->s), &g->reason);
}

int tern_gen_take(tern_gen *g, const float *logits, tern_error *err) {
    if (g->phase == GEN_DONE) return tern_fail(err, "the generation is over");
    if (take_ends(g)) return 0;
    if (logits != g->g.logits) memcpy(g->g.logits, logits, (size_t)tern_model_vocab_size(g->s->m) * sizeof(float));
    return take_id(g, err);
}

int tern_gen_step(tern_gen *g, tern_error *err) {
    const int32_t *tokens;
    int n = tern_gen_input(g, &tokens);
    if (n < 1) return tern_fail(err, "the generation is over");
    if (g->phase == GEN_NEXT && g->p.mtp_depth && !g->last) return tern_spec_step(g, err);
    return tern_session_eval(g->s, tokens, n, g->g.logits, 0, err) || tern_gen_take(g, g->g.logits, err) ? -1 : 0;
}

/* An id drawn in the step (tern_gen_step_many). */
static int take_drawn(tern_gen *g, int32_t id, tern_error *err) {
    if (take_ends(g)) return 0;
    if (g->g.matcher && tern_matcher_accept(g->g.matcher, id, err)) return -1;
    return take_next(g, id, err);
}

int tern_gen_step_many(tern_gen *const *g, int n_gen, tern_session *const *extra, const int32_t *const *extra_tokens,
                       const int *extra_n, int n_extra, float *logits, int *rc, tern_error *err) {
    int B = n_gen + n_extra;
    if (n_gen < 0 || n_extra < 0 || B < 1) return tern_fail(err, "no generations or sessions to step");
    if (!logits || (n_gen && (!g || !rc))) return tern_fail(err, "logits, and with generations g and rc, are needed");
    if (n_extra && (!extra || !extra_tokens || !extra_n))
        return tern_fail(err, "%d extra sessions without their sessions, tokens or counts", n_extra);
    for (int i = 0; i < n_gen; i++)
        if (!g[i]) return tern_fail(err, "generation %d is NULL", i);
    for (int i = 0; i < n_extra; i++)
        if (!extra[i]) return tern_fail(err, "extra session %d is NULL", i);
    tern_session **s = malloc((size_t)B * sizeof *s);
    const int32_t **tokens = malloc((size_t)B * sizeof *tokens);
    int *n = malloc((size_t)B * sizeof *n);
    int32_t *id = malloc((size_t)B * sizeof *id);
    tern_row_draw *draw = calloc((size_t)B, sizeof *draw);
    int V = tern_model_vocab_size(n_gen ? g[0]->s->m : extra[0]->m);
    int ret = s && tokens && n && id && draw ? 0 : tern_fail(err, "out of memory");
    for (int i = 0; ret == 0 && i < n_gen; i++) {
        s[i] = g[i]->s;
        if ((n[i] = tern_gen_input(g[i], &tokens[i])) < 1) ret = tern_fail(err, "generation %d is over", i);
    }
    /* drawn in the step where the rule and the session allow (the random
     * numbers taken only once every input is known good) */
    for (int i = 0; ret == 0 && i < n_gen; i++) {
        if (!(draw[i].on = g[i]->g.gpu.on)) continue;
        tern_error own;
        /* (a mask that cannot be made: that row's logits come back, and the
         * host's draw meets the error again, for that generation alone) */
        if (draw_mask(g[i], n[i], &own)) { draw[i].on = 0; continue; }
        draw[i].r = g[i]->g.gpu.r;
        draw[i].u = next_u(&g[i]->g);
    }
    for (int i = 0; ret == 0 && i < n_extra; i++) {
        s[n_gen + i] = extra[i];
        tokens[n_gen + i] = extra_tokens[i];
        n[n_gen + i] = extra_n[i];
    }
    if (ret == 0) ret = tern_session_eval_many_draw(s, tokens, n, B, draw, id, logits, err);
    for (int i = 0; i < n_gen; i++) {
        tern_error e = *err;
        rc[i] = ret ? -1 : id[i] >= 0 ? take_drawn(g[i], id[i], &e) : tern_gen_take(g[i], logits + (size_t)i * V, &e);
        if (rc[i] && !ret) *err = e;
    }
    free(s);
    free(tokens);
    free(n);
    free(id);
    free(draw);
    return ret;
}

void tern_gen_end(tern_gen *g, int ok, tern_gen_stats *stats) {
    if (!g) return;
    if (ok && g->reason != TERN_STOP_STRING && g->reason != TERN_STOP_CALLER) flush(&g->g, g->on_text, g->ctx);
    double now = tern_now_s(), t1 = g->t1 ? g->t1 : now;
    g->st.prefill_s = t1 - g->t0;
    g->st.decode_s = now - t1;
    g->st.stop_reason = g->reason;
    if (g->reason != TERN_STOP_STRING) g->st.stop_index = -1;
    if (stats) *stats = g->st;
    gen_free(&g->g);
    free(g);
}

/* ---- the loops ------------------------------------------------------------------ */

/* Host logits: tern_gen's steps, one session. */
static int step_loop(tern_gen *g, tern_error *err) {
    const int32_t *tokens;
    while (tern_gen_input(g, &tokens) > 0)
        if (tern_gen_step(g, err)) return -1;
    return 0;
}

/* Sampling on the GPU: the next id drawn in the step, one step launched
 * ahead where the loop is sure to evaluate it. */
static int gpu_loop(tern_gen *g, tern_error *err) {
    tern_session *s = g->s;
    const tern_gen_params *p = &g->p;
    tern_gen_stats *stats = &g->st;
    tern_matcher *grammar = g->g.matcher;
    int rc = eval_prompt(g, err);
    g->t1 = tern_now_s();
    while (rc == 0) {
        if (p->cancelled && p->cancelled(g->ctx)) { g->reason = TERN_STOP_CALLER; break; }
        int32_t drawn = -1;   /* the next id, drawn by the step in flight */
        int ahead = 0;        /* and the step evaluating it launched already */
        if (gen_wait(g, &drawn, &ahead, err)) { rc = -1; break; }
        if (tern_gen_limit(p, s, stats->n_generated, tern_session_pos(s) - ahead, &g->reason)) break;
        int32_t id = next_id(drawn, err);
        int end = id < 0 || (grammar && tern_matcher_accept(grammar, id, err)) ? -1 : tern_gen_accept(g, id, err);
        if (end < 0) { rc = -1; break; }
        g->last = end;
        if (!ahead) rc = eval_id(g, id, err);
        if (rc != 0 || end) break;
    }
    gen_drain(s);
    return rc;
}

int tern_generate(tern_session *s, tern_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                  const tern_gen_params *p, tern_text_fn on_text, void *ctx, tern_gen_stats *stats,
                  tern_error *err) {
    memset(stats, 0, sizeof *stats);
    stats->last_token = -1;
    stats->stop_index = -1;
    tern_gen *g = tern_gen_create(s, tok, prompt, n_prompt, p, on_text, ctx, err);
    if (!g) return -1;
    int rc = g->g.gpu.on ? gpu_loop(g, err) : step_loop(g, err);
    tern_gen_end(g, rc == 0, stats);
    return rc;
}
