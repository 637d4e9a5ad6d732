/* The scheduler's kept sessions (sched_int.h): the ids each holds, where a
 * prompt starts from (a live session or a prefix-cache checkpoint), and the
 * checkpoints taken of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/pcache.h"
#include "server/sched_int.h"
#include "util/clock.h"

static int toks_reserve(slot *sl, int n) {
    if (n <= sl->cap) return 0;
    int cap = sl->cap ? sl->cap : 1024;
    while (cap < n) cap *= 2;
    int32_t *t = realloc(sl->toks, (size_t)cap * sizeof *t);
    if (!t) return -1;
    sl->toks = t;
    sl->cap = cap;
    return 0;
}

int sched_toks_append(slot *sl, const int32_t *ids, int n) {
    if (toks_reserve(sl, sl->n_toks + n)) return -1;
    memcpy(sl->toks + sl->n_toks, ids, (size_t)n * sizeof *ids);
    sl->n_toks += n;
    return 0;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* How many of the prompt's tokens the live session of sl gives without
 * prefilling them: all it holds when they start the prompt (fewer than n:
 * the last token must be evaluated for its logits), else none. */
static int live_reuse(const slot *sl, const int32_t *prompt, int n) {
    if (!sl->live || sl->n_toks >= n) return 0;
    return common_prefix(sl->toks, sl->n_toks, prompt, n) == sl->n_toks ? sl->n_toks : 0;
}


static slot *lru_slot(srv_sched *s) {
    slot *best = NULL;
    for (int i = 0; i < s->p.n_slots; i++)
        if (!s->slots[i].busy && (!best || s->slots[i].used < best->used)) best = &s->slots[i];
    return best;
}

/* The cache's deepest checkpoint that starts the prompt and reuses more
 * than `beat`, in RAM: one on disk is read back first. A file that fails
 * costs only its checkpoints (dropped): the next deepest is tried. */
pc_node *sched_cached_checkpoint(srv_sched *s, const int32_t *prompt, int n, int beat) {
    pc_node *nd;
    tern_error err;
    while (s->cache && (nd = pcache_lookup(s->cache, prompt, n)) && pc_node_depth(nd) > beat) {
        if (pcache_load(s->cache, nd, &err) == 0) return nd;
        fprintf(stderr, "tern serve: a checkpoint on disk was dropped: %s\n", err.msg);
    }
    return NULL;
}

/* The live session that reuses most (the most recently used on a tie), or
 * the cache's deepest checkpoint when it reuses more (restored into the
 * least recently used slot); else the least recently used slot, empty. */
plan sched_pick(srv_sched *s, const int32_t *prompt, int n) {
    plan p = {0};
    for (int i = 0; i < s->p.n_slots; i++) {
        slot *sl = &s->slots[i];
        int k = sl->busy ? 0 : live_reuse(sl, prompt, n);
        if (k > p.reuse || (k == p.reuse && k > 0 && sl->used > p.sl->used)) {
            p.sl = sl;
            p.reuse = k;
        }
    }
    pc_node *nd = sched_cached_checkpoint(s, prompt, n, p.reuse);
    if (nd) {
        p.sl = NULL;
        p.reuse = pc_node_depth(nd);
        p.ckpt = nd;
    }
    if (!p.sl) p.sl = lru_slot(s);
    return p;
}

/* Brings the slot's session to the first p->reuse tokens of the prompt. */
int sched_slot_prepare(srv_sched *s, const plan *p, const int32_t *prompt, tern_error *err) {
    slot *sl = p->sl;
    sl->live = 0;
    if (p->ckpt) {
        int rc = tern_session_restore(sl->s, pc_node_snapshot(p->ckpt), err);
        /* a checkpoint read back from disk may have taken the RAM tier over
         * its budget: evicted only now, so it could not go before its use */
        pcache_trim(s->cache);
        if (rc) return -1;
        sl->ckpt = pc_node_serial(p->ckpt);
        sl->n_toks = 0;
        if (sched_toks_append(sl, prompt, p->reuse)) {
            snprintf(err->msg, sizeof err->msg, "out of memory");
            return -1;
        }
    } else if (p->reuse == 0) {
        if (tern_session_reset(sl->s, err)) return -1;
        sl->ckpt = 0;
        sl->n_toks = 0;
    }
    sl->live = 1;
    return 0;
}

/* The one place a checkpoint's state is taken, after the tokens the slot
 * holds; base is the checkpoint above it. The new one shares base's KV
 * rows (holding only those after it) when they are the session's own rows,
 * bit for bit: the slot restored base or took it. Otherwise (the same
 * tokens prefilled in other pieces by another session) it is whole, so a
 * restore never joins rows of two computations. */
static tern_snapshot *take_checkpoint(const slot *sl, const pc_node *base, int *shared, tern_error *err) {
    /* (base on disk has no snapshot to share: the new one is whole) */
    *shared = base && pc_node_serial(base) == sl->ckpt && pc_node_snapshot(base);
    return tern_session_snapshot_after(sl->s, *shared ? pc_node_snapshot(base) : NULL, err);
}

/* Adds the slot's state, the first n of its ids, to the cache unless a
 * checkpoint is there already, then evicts (trim) or leaves that to the
 * job's end. A failure costs only the checkpoint. */
void sched_checkpoint_at(srv_sched *s, slot *sl, int n, srv_usage *u, int trim) {
    if (!s->cache || !sl->live || n < 1 || n > sl->n_toks || tern_session_pos(sl->s) != n) return;
    int exact;
    pc_node *base = pcache_base(s->cache, sl->toks, n, &exact);
    if (exact) return;
    double t0 = tern_now_s();
    tern_error err;
    int shared;
    tern_snapshot *snap = take_checkpoint(sl, base, &shared, &err);
    if (!snap) fprintf(stderr, "tern serve: a checkpoint was not taken: %s\n", err.msg);
    else if (pcache_insert(s->cache, sl->toks, n, snap, shared))
        fprintf(stderr, "tern serve: a checkpoint was not kept: out of memory\n");
    pc_node *nd = snap ? pcache_base(s->cache, sl->toks, n, &exact) : NULL;
    /* (a serial is never reused: evicted, it matches no checkpoint later) */
    if (nd && exact) sl->ckpt = pc_node_serial(nd);
    if (trim) pcache_trim(s->cache);
    if (u) u->snapshot_s += tern_now_s() - t0;
}

/* All the tokens the slot holds. */
void sched_checkpoint(srv_sched *s, slot *sl, srv_usage *u, int trim) {
    sched_checkpoint_at(s, sl, sl->n_toks, u, trim);
}
