#include "server/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/pcache.h"
#include "server/sched_int.h"
#include "util/clock.h"
#include "util/err.h"

static srv_event *event_new(srv_ev_kind kind) {
    srv_event *ev = calloc(1, sizeof *ev);
    if (ev) ev->kind = kind;
    return ev;
}

static void push_text(srv_job *j, srv_ev_kind kind, const char *text, size_t len) {
    srv_event *ev = srv_event_text(kind, text, len);
    if (ev) srv_job_push(j, ev);
}

static void push_done(srv_job *j, srv_finish finish, int stop_index, const srv_usage *u) {
    srv_event *ev = event_new(SRV_EV_DONE);
    if (!ev) return;   /* the reader's wait ends with the job's release */
    ev->finish = finish;
    ev->stop_index = stop_index;
    if (u) ev->usage = *u;
    srv_job_push(j, ev);
}

/* ---- one generation ---------------------------------------------------- */


static int on_event(void *user, const tern_out_event *ev, tern_error *err) {
    run *r = user;
    if (ev->kind == TERN_OUT_MALFORMED) {
        fprintf(stderr, "tern serve: a tool call could not be parsed (%.*s); passed on as text\n", (int)ev->len,
                ev->text);
        return 0;
    }
    if (ev->kind != TERN_OUT_REASONING) r->answer_began = 1;
    srv_event *e = srv_event_from_output(ev);
    if (!e) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    srv_job_push(r->j, e);
    if (ev->kind == TERN_OUT_TOOL_CALL && r->j->single_tool_call) r->stop_after_call = 1;
    return 0;
}

static int on_text(void *ctx, const char *text, size_t len) {
    run *r = ctx;
    tern_error err;
    if (r->j->raw_text) {
        push_text(r->j, SRV_EV_CONTENT, text, len);
        return 0;
    }
    if (!r->stop_after_call && tern_output_parser_feed(r->parser, text, len, &err)) {
        fprintf(stderr, "tern serve: %s\n", err.msg);
        r->failed = 1;
        return 1;
    }
    return r->stop_after_call;
}

static void on_token(void *ctx, int32_t id) {
    run *r = ctx;
    if (!r->t_first) r->t_first = tern_now_s();
    if (r->j->start_in_reasoning && !r->answer_began) r->n_reasoning++;
    if (sched_toks_append(r->sl, &id, 1)) r->sl->live = 0;
}

static int is_cancelled(void *ctx) {
    run *r = ctx;
    return atomic_load(&r->j->cancel) || r->stop_after_call;
}

static srv_bytes token_bytes(const tern_tokenizer *tok, int32_t id) {
    srv_bytes b = {"", 0};
    const char *p = tern_tokenizer_token_bytes(tok, id, &b.n);
    if (p) b.p = p;
    else b.n = 0;
    return b;
}

static void on_logprobs(void *ctx, const tern_logprobs *lp) {
    run *r = ctx;
    srv_event *e = event_new(SRV_EV_LOGPROBS);
    if (!e) return;
    e->lp = *lp;
    e->token = token_bytes(r->s->tok, lp->id);
    for (int k = 0; k < lp->n_top; k++) e->top[k] = token_bytes(r->s->tok, lp->top_ids[k]);
    srv_job_push(r->j, e);
}

static srv_finish finish_of(const tern_gen_stats *st, const run *r) {
    switch (st->stop_reason) {
    case TERN_STOP_EOS: return SRV_FINISH_EOS;
    case TERN_STOP_STRING: return SRV_FINISH_STOP;
    case TERN_STOP_CALLER: return r->stop_after_call ? SRV_FINISH_TOOL : SRV_FINISH_CANCEL;
    default: return SRV_FINISH_LENGTH;
    }
}

/* Prompt tokens evaluated per call, so a client that leaves during a long
 * prefill is noticed between pieces (a multiple of the DeltaNet chunk). */
#define PREFILL_PIECE 4096

/* Where the prefill from `from` stops next: a piece's end, a boundary,
 * the next multiple of the checkpoint interval (absolute positions, so two
 * prompts sharing a prefix checkpoint at the same places) or the end. */
static int next_stop(const srv_sched *s, const srv_job *j, int from, int end) {
    int to = end - from > PREFILL_PIECE ? from + PREFILL_PIECE : end;
    if (j->boundary > from && j->boundary < to) to = j->boundary;
    if (j->first_boundary > from && j->first_boundary < to) to = j->first_boundary;
    int iv = s->p.checkpoint_interval;
    if (iv > 0 && (from / iv + 1) * iv < to) to = (from / iv + 1) * iv;
    return to;
}

static void count_reuse(srv_sched *s, const plan *p) {
    pthread_mutex_lock(&s->mu);
    if (p->ckpt) {
        s->cs.hits_restored++;
        s->cs.restored_tokens += (unsigned long long)p->reuse;
    } else if (p->reuse > 0) {
        s->cs.hits_live++;
    } else {
        s->cs.misses++;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Whether the model drafts with an MTP head (the CPU engine): a request's
 * mtp field on a model that cannot was refused already where the model
 * was known; loaded lazily, such a request runs without drafts. */
static int can_draft(const tern_model *m) {
    return tern_model_has_mtp(m) && !strcmp(tern_model_device(m), "cpu");
}


/* The slot's session has evaluated prompt[from..to): its ids, and a
 * checkpoint at a message boundary, at each interval and at the end of
 * the prefill (whose eviction waits for the generation's end, so the first
 * token does not wait for it). */
static int prefill_advance(srv_sched *s, active *a, int from, int to, tern_error *err) {
    slot *sl = a->r.sl;
    const srv_job *j = a->j;
    int end = a->n_src - 1, iv = s->p.checkpoint_interval;
    if (sched_toks_append(sl, a->src + from, to - from)) {
        sl->live = 0;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    if (to == j->boundary || to == j->first_boundary || to == end || (iv > 0 && to % iv == 0))
        sched_checkpoint(s, sl, &a->u, end - to > PREFILL_PIECE);
    return 0;
}

/* Prefills all but the prompt's last token (the generation evaluates that
 * one with its first draw) in pieces. Returns 1 when the job was cancelled
 * on the way. */
static int prefill(srv_sched *s, active *a, tern_error *err) {
    slot *sl = a->r.sl;
    const srv_job *j = a->j;
    int end = j->n_prompt - 1;
    while (sl->n_toks < end) {
        if (atomic_load(&j->cancel)) return 1;
        int from = sl->n_toks, to = next_stop(s, j, from, end);
        double t0 = tern_now_s();
        if (tern_session_eval(sl->s, j->prompt + from, to - from, NULL, 0, err)) return -1;
        a->u.eval_s += tern_now_s() - t0;
        if (prefill_advance(s, a, from, to, err)) return -1;
    }
    return 0;
}

/* A request's own mtp field turned the head's tracking on (or auto off)
 * for its generation only: the slot's later prompts go as the server
 * says. */
static void mtp_as_served(srv_sched *s, const active *a) {
    tern_error e;
    if (a->gp.mtp_depth) tern_session_set_mtp(a->r.sl->s, s->p.mtp_track, &e);
}

/* A job that ends before its generation, or preempted before it is back
 * (rc 1: cancelled, else failed with err): the generation and the parser
 * go, the slot is freed (and dropped on a failure), the job's last event
 * is pushed. */
void sched_end_early(srv_sched *s, active *a, int rc, const tern_error *err) {
    slot *sl = a->r.sl;
    if (a->gen) {   /* preempted mid-generation, on its way back */
        tern_gen_stats st;
        tern_gen_end(a->gen, 0, &st);
        a->gen = NULL;
        a->u.completion_tokens = st.n_generated;
    }
    mtp_as_served(s, a);
    tern_output_parser_destroy(a->r.parser);
    a->r.parser = NULL;
    sl->busy = 0;
    if (rc == 1) {
        push_done(a->j, SRV_FINISH_CANCEL, -1, &a->u);
        return;
    }
    sl->live = 0;
    sl->n_toks = 0;
    push_text(a->j, SRV_EV_ERROR, err->msg, strlen(err->msg));
}

/* The job's start (a zeroed but for its job): a slot brought to the
 * longest prefix it can reuse, the output parser, the generation's
 * parameters. Its prefill follows (whole in run_one, in chunks in
 * step_all). 1: the job ended here (cancelled or failed, its events
 * pushed). */
static int start_job(srv_sched *s, active *a, srv_job *j) {
    a->t0 = tern_now_s();
    a->u = (srv_usage){.prompt_tokens = j->n_prompt, .queue_s = a->t0 - j->t_submit};
    a->src = j->prompt;
    a->n_src = j->n_prompt;
    if (atomic_load(&j->cancel)) { push_done(j, SRV_FINISH_CANCEL, -1, &a->u); return 1; }
    tern_error err = {{0}};
    int most = s->kv.max_tokens;   /* (0: no budget) */
    if (most && j->n_prompt > most) {
        char msg[200];
        snprintf(msg, sizeof msg, "the prompt is %d tokens; the server's KV budget holds %d for one request (tern "
                 "serve --kv-budget)", j->n_prompt, most);
        srv_event *ev = srv_event_text(SRV_EV_ERROR, msg, strlen(msg));
        if (ev) {
            ev->status = 400;
            srv_job_push(j, ev);
        }
        return 1;
    }
    plan p = sched_pick(s, j->prompt, j->n_prompt);
    slot *sl = p.sl;   /* (one is free: max_seqs <= n_slots) */
    sl->used = ++s->clock;
    sl->busy = 1;
    a->r = (run){.s = s, .j = j, .sl = sl};
    tern_output_params op = {j->start_in_reasoning, j->parse_tool_calls, j->tools_json};
    a->r.parser = tern_output_parser_create(&op, on_event, &a->r, &err);
    int rc = a->r.parser ? 0 : -1;
    if (rc == 0) rc = sched_slot_prepare(s, &p, j->prompt, &err);
    a->u.restore_s = tern_now_s() - a->t0;
    a->u.cached_tokens = rc == 0 ? sl->n_toks : 0;
    if (rc == 0) count_reuse(s, &p);
    a->gp = (tern_gen_params){.sampling = j->sampling, .n_predict = j->max_tokens,
                              .stop = (const char *const *)j->stop, .n_stop = j->n_stop, .ignore_eos = j->ignore_eos,
                              .on_token = on_token, .cancelled = is_cancelled,
                              .history = j->prompt, .n_history = (size_t)(j->n_prompt - 1),
                              .grammar = j->grammar, .mtp_depth = can_draft(s->m) ? j->mtp : 0};
    if (j->logprobs) { a->gp.on_logprobs = on_logprobs; a->gp.top_logprobs = j->top_logprobs; }
    /* alone, a job's rows stay within the budget: its tokens end there */
    if (most && (a->gp.n_predict < 0 || a->gp.n_predict > most - j->n_prompt)) a->gp.n_predict = most - j->n_prompt;
    if (rc == 0) return 0;
    sched_end_early(s, a, rc, &err);
    return 1;
}

/* The prefill is done: the prompt's last token joins the slot's ids (the
 * generation evaluates it with its first draw). */
static int prefilled(active *a, tern_error *err) {
    if (sched_toks_append(a->r.sl, a->src + a->n_src - 1, 1) == 0) return 0;
    snprintf(err->msg, sizeof err->msg, "out of memory");
    return -1;
}

/* The job's end after its generation (rc, st): the parser's last events,
 * the usage, DONE or the error, the checkpoint after the generated turn,
 * the evictions its checkpoints call for. */
static void finish_job(srv_sched *s, active *a, int rc, const tern_gen_stats *st, tern_error *err) {
    run *r = &a->r;
    slot *sl = r->sl;
    srv_job *j = a->j;
    if (rc == 0 && !r->stop_after_call && tern_output_parser_finish(r->parser, err)) rc = -1;
    if (rc == 0 && r->failed) { rc = -1; snprintf(err->msg, sizeof err->msg, "the output parser failed"); }
    tern_output_parser_destroy(r->parser);
    sl->busy = 0;
    if (tern_session_pos(sl->s) != sl->n_toks) sl->live = 0;
    if (rc != 0) {
        sl->live = 0;
        sl->n_toks = 0;
        push_text(j, SRV_EV_ERROR, err->msg, strlen(err->msg));
    } else {
        a->u.completion_tokens = st->n_generated;
        a->u.mtp_drafted = st->n_drafted;
        a->u.mtp_accepted = st->n_accepted;
        a->u.reasoning_tokens = r->n_reasoning;
        a->u.prefill_s = (r->t_first ? r->t_first : tern_now_s()) - a->t0;
        a->u.decode_s = r->t_first ? tern_now_s() - r->t_first : 0;
        if (s->on_done) s->on_done(s->ud, &a->u, r->t_first ? r->t_first - j->t_submit : 0);
        push_done(j, finish_of(st, r), st->stop_index, &a->u);
        /* after the answer went out: the state after the generated turn, for
         * a next prompt that continues it as generated */
        if (st->stop_reason != TERN_STOP_CALLER || r->stop_after_call) sched_checkpoint(s, sl, NULL, 0);
    }
    mtp_as_served(s, a);
    if (s->cache) pcache_trim(s->cache);
}

/* ---- the thread and the queue ------------------------------------------ */

/* The next queued job (the lock held), or NULL. */
static srv_job *dequeue(srv_sched *s) {
    srv_job *j = s->qhead;
    if (!j) return NULL;
    s->qhead = j->qnext;
    if (!s->qhead) s->qtail = NULL;
    s->n_queued--;
    j->queued = 0;
    return j;
}

/* Ends the running job at index i (the lock not held). */
void sched_retire(srv_sched *s, int i) {
    active *a = s->act[i];
    srv_job *j = a->j;
    pthread_mutex_lock(&s->mu);
    s->act[i] = s->act[--s->n_act];
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(a->redo);
    free(a);
    srv_job_release(j);
}

/* The index of running job a. */
int sched_index_of(const srv_sched *s, const active *a) {
    int i = 0;
    while (s->act[i] != a) i++;
    return i;
}

/* The generation's start in a batched scheduler, once the prefill is
 * done. */
int sched_begin_gen(srv_sched *s, active *a, tern_error *err) {
    srv_job *j = a->j;
    if (prefilled(a, err)) return -1;
    if (a->gen) return 0;   /* preempted and back: it goes on */
    a->gen = tern_gen_create(a->r.sl->s, s->tok, j->prompt + j->n_prompt - 1, 1, &a->gp, on_text, &a->r, err);
    return a->gen ? 0 : -1;
}

/* One job at a time, its prefill and generation whole (tern_generate: on
 * a GPU the draw stays on the device). */
static void run_one(srv_sched *s, int i) {
    active *a = s->act[i];
    tern_error err = {{0}};
    int rc = prefill(s, a, &err);
    if (rc == 0) rc = prefilled(a, &err);
    if (rc) {
        sched_end_early(s, a, rc, &err);
        sched_retire(s, i);
        return;
    }
    tern_gen_stats st = {0};
    const int32_t *last = a->j->prompt + a->j->n_prompt - 1;
    rc = tern_generate(a->r.sl->s, s->tok, last, 1, &a->gp, on_text, &a->r, &st, &err);
    finish_job(s, a, rc, &st, &err);
    sched_retire(s, i);
}

/* The job being prefilled (s->pre): its next chunk, [*from, *to) of the
 * prompt, at most s->chunk tokens while others decode (so none waits for
 * more than a chunk), a whole piece otherwise. 0: it was cancelled, and
 * has left. */
static int pre_chunk(srv_sched *s, int *from, int *to) {
    active *a = s->pre;
    int i = sched_index_of(s, a);
    if (atomic_load(&a->j->cancel)) {
        s->pre = NULL;
        sched_end_early(s, a, 1, NULL);
        sched_retire(s, i);
        return 0;
    }
    int end = a->n_src - 1, chunk = s->n_act - s->n_parked > 1 ? s->chunk : PREFILL_PIECE;
    *from = a->r.sl->n_toks;
    *to = next_stop(s, a->j, *from, end);
    if (*to - *from > chunk) *to = *from + chunk;
    return 1;
}

/* After a step: the prefilled job's chunk is in (rc 0) or the step failed;
 * its generation begins once the prompt is in, and a failure ends it. */
static void pre_advance(srv_sched *s, int i, int from, int to, int rc, tern_error *err) {
    active *a = s->act[i];
    if (rc == 0) rc = prefill_advance(s, a, from, to, err);
    if (rc == 0 && a->r.sl->n_toks < a->n_src - 1) return;
    s->pre = NULL;
    if (rc == 0 && sched_begin_gen(s, a, err) == 0) return;
    sched_end_early(s, a, -1, err);
    sched_retire(s, i);
}

/* One step of every running job together (tern_gen_step_many): each
 * generating job's next token and a chunk of the prefilled one's prompt;
 * the jobs whose generation ended leave. */
static void step_all(srv_sched *s) {
    int pfrom = 0, pto = 0;
    if (s->pre && !pre_chunk(s, &pfrom, &pto)) return;
    int B = s->n_act, n_gen = 0, pre_at = -1, at[SRV_MAX_SEQS], rc[SRV_MAX_SEQS], took[SRV_MAX_SEQS];
    tern_gen *gens[SRV_MAX_SEQS];
    for (int i = 0; i < B; i++) {
        active *a = s->act[i];
        if (a == s->pre) {
            pre_at = i;
        } else if (!a->parked) {
            at[n_gen] = i;
            gens[n_gen++] = a->gen;
        }
    }
    if (n_gen == 0 && pre_at < 0) return;   /* (all parked: cannot be, the budget lets one run) */
    tern_session *extra = pre_at >= 0 ? s->act[pre_at]->r.sl->s : NULL;
    const int32_t *ptok = pre_at >= 0 ? s->act[pre_at]->src + pfrom : NULL;
    int pn = pto - pfrom;
    tern_error err = {{0}};
    double t0 = tern_now_s();
    /* speculative decoding only while one job runs: alone, its step is its
     * own (drafts, one verify); with others, a step of them all pays more */
    int failed = 0;
    if (n_gen == 1 && pre_at < 0 && s->act[at[0]]->gp.mtp_depth) rc[0] = tern_gen_step(gens[0], &err);
    else failed = tern_gen_step_many(gens, n_gen, &extra, &ptok, &pn, pre_at >= 0, s->logits, rc, &err);
    if (s->pre) s->pre->u.eval_s += tern_now_s() - t0;
    for (int k = 0; k < n_gen; k++) took[at[k]] = rc[k];
    /* from the last: a job that leaves takes the last one's place */
    for (int i = B - 1; i >= 0; i--) {
        active *a = s->act[i];
        tern_error e = err;
        if (i == pre_at) {
            pre_advance(s, i, pfrom, pto, failed ? -1 : 0, &e);
            continue;
        }
        if (a->parked) continue;
        const int32_t *next;
        if (took[i] == 0 && tern_gen_input(a->gen, &next) > 0) continue;
        tern_gen_stats st;
        tern_gen_end(a->gen, took[i] == 0, &st);
        finish_job(s, a, took[i], &st, &e);
        sched_retire(s, i);
    }
}

/* Admits queued jobs while a place is free and no job is being prefilled,
 * then runs: one job whole when the model steps sessions one at a time,
 * else one step of them all. Jobs that find no model loaded wait for it. */
static void *sched_main(void *arg) {
    srv_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (sched_wait_work(s)) break;
        if (s->rs.state != SRV_MODEL_LOADED) {   /* (then nothing runs: the model is freed only when idle) */
            pthread_mutex_unlock(&s->mu);
            sched_load_for_queue(s);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        while (s->qhead && s->n_act < s->max_seqs && !s->pre && !s->n_parked && sched_kv_admits(s, s->qhead)) {
            srv_job *j = dequeue(s);
            active *a = calloc(1, sizeof *a);
            if (!a) {
                push_text(j, SRV_EV_ERROR, "out of memory", 13);
                pthread_mutex_unlock(&s->mu);
                srv_job_release(j);
                pthread_mutex_lock(&s->mu);
                continue;
            }
            a->j = j;   /* before other threads see it (srv_sched_cancel_all) */
            a->order = ++s->admitted;
            s->act[s->n_act++] = a;
            pthread_mutex_unlock(&s->mu);
            int ended = start_job(s, a, j);
            tern_error err = {{0}};
            if (!ended && s->max_seqs > 1) {
                if (a->r.sl->n_toks < a->n_src - 1) {
                    s->pre = a;
                } else if (sched_begin_gen(s, a, &err)) {
                    sched_end_early(s, a, -1, &err);
                    ended = 1;
                }
            }
            pthread_mutex_lock(&s->mu);
            if (ended) {
                s->n_act--;   /* it was the last */
                pthread_cond_broadcast(&s->cv);
                pthread_mutex_unlock(&s->mu);
                free(a);
                srv_job_release(j);
                pthread_mutex_lock(&s->mu);
            }
        }
        pthread_mutex_unlock(&s->mu);
        if (s->n_act) sched_kv_balance(s);
        if (s->n_act && s->max_seqs == 1) run_one(s, 0);
        else if (s->n_act) step_all(s);
        if (s->p.kv_budget) sched_kv_note(s);
        s->idle_since = tern_now_s();
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* What create made, before the thread starts or after it ended. */
static void sched_free(srv_sched *s) {
    sched_free_resident(s);   /* (the slots' sessions and ids too) */
    free(s->slots);
    free(s->act);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

srv_sched *srv_sched_create(tern_tokenizer *tok, const srv_sched_params *p, srv_done_fn on_done, void *ud,
                            tern_error *err) {
    if (p->n_slots < 1) {
        snprintf(err->msg, sizeof err->msg, "n_slots must be at least 1");
        return NULL;
    }
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    *s = (srv_sched){.tok = tok, .p = *p, .on_done = on_done, .ud = ud};
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* sessions step together where the engine runs them in one pass (the
     * model says at its load): at most this many */
    s->cap_seqs = p->max_seqs < 1 ? 1 : p->max_seqs;
    if (s->cap_seqs > p->n_slots) s->cap_seqs = p->n_slots;
    if (s->cap_seqs > SRV_MAX_SEQS) s->cap_seqs = SRV_MAX_SEQS;
    s->max_seqs = s->cap_seqs;
    s->chunk = p->prefill_chunk > 0 ? p->prefill_chunk : SRV_PREFILL_CHUNK;
    s->slots = calloc((size_t)p->n_slots, sizeof *s->slots);
    s->act = calloc((size_t)s->cap_seqs, sizeof *s->act);
    if (!s->slots || !s->act) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        sched_free(s);
        return NULL;
    }
    if (!p->lazy && sched_load(s, err)) {
        sched_free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        snprintf(err->msg, sizeof err->msg, "could not start the scheduler thread");
        sched_free(s);
        return NULL;
    }
    return s;
}

void srv_sched_destroy(srv_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->closed = s->quit = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    sched_free(s);
}

int srv_sched_submit(srv_sched *s, srv_job *j) {
    pthread_mutex_lock(&s->mu);
    int rc = SRV_SUBMIT_OK;
    if (s->closed) rc = SRV_SUBMIT_CLOSED;
    else if (s->n_queued >= s->p.queue_limit && (s->n_act >= s->max_seqs || s->n_queued > 0)) rc = SRV_SUBMIT_FULL;
    if (rc == SRV_SUBMIT_OK) {
        srv_job_retain(j);
        j->t_submit = tern_now_s();
        j->queued = 1;
        j->qnext = NULL;
        if (s->qtail) s->qtail->qnext = j;
        else s->qhead = j;
        s->qtail = j;
        s->n_queued++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Takes a queued job out of the queue (the lock held); 1 if it was there. */
static int unqueue(srv_sched *s, srv_job *j) {
    if (!j->queued) return 0;
    srv_job **pp = &s->qhead, *prev = NULL;
    while (*pp && *pp != j) { prev = *pp; pp = &(*pp)->qnext; }
    if (!*pp) return 0;
    *pp = j->qnext;
    if (s->qtail == j) s->qtail = prev;
    s->n_queued--;
    j->queued = 0;
    return 1;
}

int sched_in_use(srv_sched *s) {
    if (s->qhead || s->rs.state == SRV_MODEL_LOADING) return 1;
    for (int i = 0; i < s->n_act; i++)
        if (!srv_job_ended(s->act[i]->j)) return 1;
    return 0;
}

srv_job *sched_take_queue(srv_sched *s) {
    srv_job *list = s->qhead;
    for (srv_job *j = list; j; j = j->qnext) j->queued = 0;
    s->qhead = s->qtail = NULL;
    s->n_queued = 0;
    pthread_cond_broadcast(&s->cv);
    return list;
}

/* A job that left the queue before it ran: its end. */
static void cancel_queued(srv_job *j) {
    srv_usage u = {.prompt_tokens = j->n_prompt};
    push_done(j, SRV_FINISH_CANCEL, -1, &u);
    srv_job_release(j);   /* the queue's reference */
}

void srv_sched_cancel(srv_sched *s, srv_job *j) {
    atomic_store(&j->cancel, 1);
    pthread_mutex_lock(&s->mu);
    int was_queued = unqueue(s, j);
    if (was_queued) pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (was_queued) cancel_queued(j);
}

void srv_sched_drain(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    while (s->qhead || s->n_act) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_cancel_all(srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    srv_job *queued = sched_take_queue(s);
    for (int i = 0; i < s->n_act; i++) atomic_store(&s->act[i]->j->cancel, 1);
    pthread_mutex_unlock(&s->mu);
    for (srv_job *j = queued, *next; j; j = next) {
        next = j->qnext;
        atomic_store(&j->cancel, 1);
        cancel_queued(j);
    }
}

void srv_sched_load(srv_sched *s, int *queued, int *running) {
    pthread_mutex_lock(&s->mu);
    *queued = s->n_queued;
    *running = s->n_act;
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_kv_stats(srv_sched *s, srv_kv_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->kv;
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_cache_stats(srv_sched *s, srv_cache_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->cs;
    pcache *c = s->cache;
    pthread_mutex_unlock(&s->mu);
    if (c) pcache_stats_get(c, &out->tiers);
}
