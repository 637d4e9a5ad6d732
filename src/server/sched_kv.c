/* The scheduler's KV budget (sched.h, "The KV budget"): idle slots' rows
 * given back, admission, and the running jobs preempted (parked) and
 * brought back. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/pcache.h"
#include "server/sched_int.h"
#include "util/err.h"

/* The bytes job a's rows reach in the next step: all its tokens while it
 * is prefilled (so no later admission finds it halfway without room), its
 * next position and drafts while it generates, none while it is parked;
 * where jobs run whole, all it may generate. */
static uint64_t job_need(const srv_sched *s, const active *a) {
    if (a->parked) return 0;
    const tern_session *ss = a->r.sl->s;
    int drafts = a->gp.mtp_depth == TERN_MTP_AUTO ? TERN_MTP_MAX_DEPTH : a->gp.mtp_depth;
    int n = a == s->pre ? a->n_src : tern_session_pos(ss) + 1 + drafts;
    if (s->max_seqs == 1) {
        int most = s->kv.max_tokens, gen = a->gp.n_predict;
        n = gen >= 0 && a->n_src + gen < most ? a->n_src + gen : most;
    }
    return tern_session_kv_bytes_at(ss, n, 0);
}

/* The rows the next step needs: the running jobs' and those the idle
 * slots hold (*idle). */
static uint64_t kv_total(const srv_sched *s, uint64_t *idle) {
    uint64_t n = 0;
    *idle = 0;
    for (int i = 0; i < s->n_act; i++) n += job_need(s, s->act[i]);
    for (int i = 0; i < s->p.n_slots; i++)
        if (!s->slots[i].busy) *idle += tern_session_kv_bytes(s->slots[i].s);
    return n + *idle;
}

static void release_slot(slot *sl) {
    tern_error err;
    if (tern_session_release(sl->s, &err)) fprintf(stderr, "tern serve: KV rows not given back: %s\n", err.msg);
    sl->live = 0;
    sl->n_toks = 0;
    sl->ckpt = 0;
}

/* Idle slots give their rows back, least recently used first, while
 * `need` is over the budget (their states are in the prefix cache, taken
 * after each turn); what is left of need. */
static uint64_t free_idle(srv_sched *s, uint64_t need) {
    while (need > s->p.kv_budget) {
        slot *v = NULL;
        for (int i = 0; i < s->p.n_slots; i++) {
            slot *sl = &s->slots[i];
            if (!sl->busy && tern_session_kv_bytes(sl->s) && (!v || sl->used < v->used)) v = sl;
        }
        if (!v) break;
        need -= tern_session_kv_bytes(v->s);
        release_slot(v);
    }
    return need;
}

/* Whether queued job j's prompt fits beside the running jobs, idle rows
 * given back as far as it needs, before its start restores a checkpoint
 * (a prompt within max_tokens fits alone; a longer one start_job
 * refuses). */
int sched_kv_admits(srv_sched *s, const srv_job *j) {
    if (!s->p.kv_budget || j->n_prompt > s->kv.max_tokens) return 1;
    uint64_t idle, need = kv_total(s, &idle) + tern_session_kv_bytes_at(s->slots[0].s, j->n_prompt, 1);
    if (need - idle > s->p.kv_budget) return 0;
    free_idle(s, need);
    return 1;
}

/* Job a steps out until its rows fit again: a checkpoint of its state,
 * the ids it goes on from kept, its rows given back. The job being
 * prefilled (its prompt, or all it held before it was preempted once)
 * goes on from its src. */
static int park(srv_sched *s, active *a, tern_error *err) {
    slot *sl = a->r.sl;
    int held = tern_session_pos(sl->s);
    if (a == s->pre) {
        s->pre = NULL;
    } else {
        /* a generating job holds all its ids but the last drawn, which its
         * next step evaluates */
        if (!sl->live || held != sl->n_toks - 1)
            return tern_fail(err, "the request's tokens were lost (out of memory)");
        int32_t *t = malloc((size_t)sl->n_toks * sizeof *t);
        if (!t) return tern_fail(err, "out of memory");
        memcpy(t, sl->toks, (size_t)sl->n_toks * sizeof *t);
        free(a->redo);
        a->src = a->redo = t;
        a->n_src = sl->n_toks;
    }
    sched_checkpoint_at(s, sl, held, &a->u, 1);
    release_slot(sl);
    a->parked = 1;
    a->parked_at = held;
    s->n_parked++;
    pthread_mutex_lock(&s->mu);
    s->kv.preemptions++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The parked job back: its checkpoint restored (or the deepest that
 * starts its ids), the rest prefilled in the next steps. */
static int unpark(srv_sched *s, active *a, tern_error *err) {
    slot *sl = a->r.sl;
    a->parked = 0;
    s->n_parked--;
    plan p = {.sl = sl};
    pc_node *nd = sched_cached_checkpoint(s, a->src, a->n_src, 0);
    if (nd) {
        p.ckpt = nd;
        p.reuse = pc_node_depth(nd);
    }
    if (sched_slot_prepare(s, &p, a->src, err)) return -1;
    pthread_mutex_lock(&s->mu);
    if (p.reuse >= a->parked_at) s->kv.resumed_exact++;
    else s->kv.resumed_tokens += (unsigned long long)(a->parked_at - p.reuse);
    pthread_mutex_unlock(&s->mu);
    if (sl->n_toks < a->n_src - 1) {
        s->pre = a;
        return 0;
    }
    return sched_begin_gen(s, a, err);
}

static active *first_parked(const srv_sched *s) {
    active *f = NULL;
    for (int i = 0; i < s->n_act; i++)
        if (s->act[i]->parked && (!f || s->act[i]->order < f->order)) f = s->act[i];
    return f;
}

/* The job admitted last among those that step. */
static active *newest(const srv_sched *s) {
    active *v = NULL;
    for (int i = 0; i < s->n_act; i++)
        if (!s->act[i]->parked && (!v || s->act[i]->order > v->order)) v = s->act[i];
    return v;
}

/* Before a step: parked jobs whose client left end, parked jobs come
 * back while their rows fit (the first parked first; none while another
 * is prefilled), then idle rows are given back and the newest jobs parked
 * until the step fits. A job that cannot be moved fails with the reason. */
void sched_kv_balance(srv_sched *s) {
    uint64_t budget = s->p.kv_budget, idle, need;
    if (!budget) return;
    active *a;
    tern_error err = {{0}};
    for (int i = s->n_act - 1; i >= 0; i--) {
        if (!s->act[i]->parked || !atomic_load(&s->act[i]->j->cancel)) continue;
        s->n_parked--;
        sched_end_early(s, s->act[i], 1, NULL);
        sched_retire(s, i);
    }
    while (!s->pre && (a = first_parked(s))) {
        need = kv_total(s, &idle) + tern_session_kv_bytes_at(a->r.sl->s, a->n_src, 1);
        if (need - idle > budget && s->n_act > s->n_parked) break;
        free_idle(s, need);
        if (unpark(s, a, &err)) {
            sched_end_early(s, a, -1, &err);
            sched_retire(s, sched_index_of(s, a));
        }
    }
    need = free_idle(s, kv_total(s, &idle));
    while (need > budget && s->n_act - s->n_parked > 1) {
        a = newest(s);
        if (park(s, a, &err)) {
            sched_end_early(s, a, -1, &err);
            sched_retire(s, sched_index_of(s, a));
        }
        need = free_idle(s, kv_total(s, &idle));
    }
}

/* The sessions' rows as they stand (the metrics' gauge). */
void sched_kv_note(srv_sched *s) {
    uint64_t held = 0;
    for (int i = 0; i < s->p.n_slots; i++) held += s->slots[i].s ? tern_session_kv_bytes(s->slots[i].s) : 0;
    pthread_mutex_lock(&s->mu);
    s->kv.held = held;
    pthread_mutex_unlock(&s->mu);
}
