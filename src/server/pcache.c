#include "server/pcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct pc_node {
    pc_node *parent, *child, *next;   /* the tree: first child, next sibling */
    int32_t *edge;                    /* the ids from the parent to here */
    int n_edge, depth;
    /* the checkpoint (snap != NULL) */
    tern_snapshot *snap;
    size_t bytes;
    pc_node *base;                    /* the checkpoint this one holds; NULL: none above */
    int holders;                      /* checkpoints whose base this is */
    double prio;                      /* GreedyDual-Size priority */
    uint64_t used;                    /* last insert or hit: LRU among equal priorities */
    uint64_t serial;                  /* the checkpoint's number, never reused (pc_node_serial) */
    pc_node *lprev, *lnext;           /* the list of checkpoints */
};

struct pcache {
    pc_node root;                     /* depth 0, never a checkpoint */
    pc_node *list;                    /* every checkpoint */
    double L;                         /* GreedyDual-Size's inflation: the last victim's priority */
    uint64_t clock;
    pthread_mutex_t mu;               /* guards st (read by other threads) */
    pcache_stats st;
};

pcache *pcache_create(size_t budget) {
    pcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->st.budget = budget;
    return c;
}

static void free_subtree(pc_node *nd) {
    while (nd) {
        pc_node *next = nd->next;
        free_subtree(nd->child);
        tern_snapshot_free(nd->snap);
        free(nd->edge);
        free(nd);
        nd = next;
    }
}

void pcache_destroy(pcache *c) {
    if (!c) return;
    free_subtree(c->root.child);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const tern_snapshot *pc_node_snapshot(const pc_node *nd) { return nd->snap; }
int pc_node_depth(const pc_node *nd) { return nd->depth; }
uint64_t pc_node_serial(const pc_node *nd) { return nd->serial; }

void pcache_stats_get(pcache *c, pcache_stats *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}

/* ---- the tree ---------------------------------------------------------- */

static pc_node *find_child(const pc_node *nd, int32_t first) {
    pc_node *ch = nd->child;
    while (ch && ch->edge[0] != first) ch = ch->next;
    return ch;
}

/* Follows tokens[0..n) down from the root as far as whole edges match
 * (*at: the last node reached); returns the deepest checkpoint on the way
 * no deeper than limit. */
static pc_node *walk(pcache *c, const int32_t *t, int n, int limit, pc_node **at) {
    pc_node *nd = &c->root, *best = NULL;
    for (;;) {
        if (nd->snap && nd->depth <= limit) best = nd;
        if (nd->depth >= n) break;
        pc_node *ch = find_child(nd, t[nd->depth]);
        if (!ch || ch->depth > n || memcmp(ch->edge, t + nd->depth, (size_t)ch->n_edge * sizeof *t)) break;
        nd = ch;
    }
    if (at) *at = nd;
    return best;
}

/* Why GreedyDual-Size: see pcache.h. */
static void touch(pcache *c, pc_node *nd) {
    int saved = nd->depth - (nd->base ? nd->base->depth : 0);
    nd->prio = c->L + (double)saved / (double)(nd->bytes ? nd->bytes : 1);
    nd->used = ++c->clock;
}

/* A use of nd is a use of the prefixes it was built on: its bases are
 * refreshed with it, so a shared prefix is as recent as its most recently
 * used descendant once they are gone. */
static void hit(pcache *c, pc_node *nd) {
    for (; nd; nd = nd->base) touch(c, nd);
}

pc_node *pcache_lookup(pcache *c, const int32_t *prompt, int n) {
    pc_node *best = walk(c, prompt, n, n - 1, NULL);
    if (best) hit(c, best);
    return best;
}

pc_node *pcache_base(pcache *c, const int32_t *tokens, int n, int *exact) {
    pc_node *best = walk(c, tokens, n, n, NULL);
    *exact = best && best->depth == n;
    /* the conversation passed this checkpoint again: it is in use */
    if (*exact) hit(c, best);
    return best;
}

static pc_node *node_new(pc_node *parent, const int32_t *edge, int n_edge) {
    pc_node *nd = calloc(1, sizeof *nd);
    if (!nd || !(nd->edge = malloc((size_t)n_edge * sizeof *edge))) {
        free(nd);
        return NULL;
    }
    memcpy(nd->edge, edge, (size_t)n_edge * sizeof *edge);
    nd->n_edge = n_edge;
    nd->parent = parent;
    nd->depth = parent->depth + n_edge;
    nd->next = parent->child;
    parent->child = nd;
    return nd;
}

static void unlink_child(pc_node *parent, pc_node *nd) {
    pc_node **pp = &parent->child;
    while (*pp != nd) pp = &(*pp)->next;
    *pp = nd->next;
    nd->next = NULL;
}

/* Splits ch's edge after k ids: a new node between ch and its parent. */
static pc_node *split(pc_node *ch, int k) {
    pc_node *parent = ch->parent;
    pc_node *mid = node_new(parent, ch->edge, k);
    if (!mid) return NULL;
    unlink_child(parent, ch);
    memmove(ch->edge, ch->edge + k, (size_t)(ch->n_edge - k) * sizeof *ch->edge);
    ch->n_edge -= k;
    ch->parent = mid;
    mid->child = ch;
    return mid;
}

/* The node at exactly tokens[0..n), made (splitting an edge) if absent. */
static pc_node *node_at(pcache *c, const int32_t *t, int n) {
    pc_node *nd = &c->root;
    while (nd->depth < n) {
        pc_node *ch = find_child(nd, t[nd->depth]);
        if (!ch) return node_new(nd, t + nd->depth, n - nd->depth);
        int k = 0, most = ch->n_edge < n - nd->depth ? ch->n_edge : n - nd->depth;
        while (k < most && ch->edge[k] == t[nd->depth + k]) k++;
        if (k < ch->n_edge && !(ch = split(ch, k))) return NULL;
        nd = ch;
    }
    return nd;
}

/* A node with neither checkpoint nor children goes; one with no
 * checkpoint and a single child merges into that child (the tree stays
 * compressed). Checkpoints are never moved, so references stay valid. */
static void prune(pcache *c, pc_node *nd) {
    while (nd != &c->root && !nd->snap && !nd->child) {
        pc_node *parent = nd->parent;
        unlink_child(parent, nd);
        free(nd->edge);
        free(nd);
        nd = parent;
    }
    pc_node *ch = nd->child;
    if (nd == &c->root || nd->snap || !ch || ch->next) return;
    int32_t *e = malloc((size_t)(nd->n_edge + ch->n_edge) * sizeof *e);
    if (!e) return;   /* the tree stays valid, only less compressed */
    memcpy(e, nd->edge, (size_t)nd->n_edge * sizeof *e);
    memcpy(e + nd->n_edge, ch->edge, (size_t)ch->n_edge * sizeof *e);
    free(ch->edge);
    ch->edge = e;
    ch->n_edge += nd->n_edge;
    pc_node *parent = nd->parent;
    unlink_child(parent, nd);
    ch->parent = parent;
    ch->next = parent->child;
    parent->child = ch;
    free(nd->edge);
    free(nd);
}

/* ---- checkpoints ------------------------------------------------------- */

static void list_remove(pcache *c, pc_node *nd) {
    if (nd->lprev) nd->lprev->lnext = nd->lnext;
    else c->list = nd->lnext;
    if (nd->lnext) nd->lnext->lprev = nd->lprev;
    nd->lprev = nd->lnext = NULL;
}

static void drop(pcache *c, pc_node *nd) {
    if (nd->base) nd->base->holders--;
    list_remove(c, nd);
    tern_snapshot_free(nd->snap);
    pthread_mutex_lock(&c->mu);
    c->st.bytes -= nd->bytes;
    c->st.checkpoints--;
    c->st.evicted++;
    pthread_mutex_unlock(&c->mu);
    nd->snap = NULL;
    nd->base = NULL;
    nd->bytes = 0;
    prune(c, nd);
}

/* The checkpoint to evict: nothing holds it (descendants go first), the
 * lowest priority, the least recently used on a tie. */
static pc_node *victim(const pcache *c) {
    pc_node *v = NULL;
    for (pc_node *nd = c->list; nd; nd = nd->lnext) {
        if (nd->holders) continue;
        if (!v || nd->prio < v->prio || (nd->prio == v->prio && nd->used < v->used)) v = nd;
    }
    return v;
}

static void evict(pcache *c) {
    pc_node *v;
    while (c->st.bytes > c->st.budget && (v = victim(c))) {
        c->L = v->prio;
        drop(c, v);
    }
}

int pcache_insert(pcache *c, const int32_t *tokens, int n, tern_snapshot *snap) {
    size_t bytes = tern_snapshot_bytes(snap);
    int exact;
    pc_node *base = n >= 1 ? pcache_base(c, tokens, n, &exact) : NULL;
    /* one too large for the budget would only evict everything else */
    if (n < 1 || bytes > c->st.budget || (base && exact)) {
        tern_snapshot_free(snap);
        return 0;
    }
    pc_node *nd = node_at(c, tokens, n);
    if (!nd) {
        tern_snapshot_free(snap);
        return -1;
    }
    nd->snap = snap;
    nd->bytes = bytes;
    nd->base = base;
    if (base) base->holders++;
    nd->lnext = c->list;
    if (c->list) c->list->lprev = nd;
    c->list = nd;
    hit(c, nd);
    pthread_mutex_lock(&c->mu);
    c->st.bytes += bytes;
    c->st.checkpoints++;
    c->st.inserted++;
    nd->serial = c->st.inserted;
    pthread_mutex_unlock(&c->mu);
    evict(c);
    return 0;
}

/* ---- invariants (tests) ------------------------------------------------ */

static int is_ancestor(const pc_node *a, const pc_node *nd) {
    for (; nd; nd = nd->parent)
        if (nd == a) return 1;
    return 0;
}

static int check_node(const pcache *c, const pc_node *nd, size_t *bytes, int *n) {
    for (const pc_node *ch = nd->child; ch; ch = ch->next) {
        if (ch->parent != nd || ch->n_edge < 1 || ch->depth != nd->depth + ch->n_edge) return -1;
        if (find_child(nd, ch->edge[0]) != ch) return -1;   /* first ids differ among siblings */
        int kids = 0;
        for (const pc_node *g = ch->child; g; g = g->next) kids++;
        if (!ch->snap && kids < 2) return -1;               /* compressed */
        if (ch->snap) {
            int holders = 0;
            for (const pc_node *o = c->list; o; o = o->lnext) holders += o->base == ch;
            if (holders != ch->holders || ch->bytes != tern_snapshot_bytes(ch->snap)) return -1;
            if (ch->base && (!ch->base->snap || ch->base == ch || !is_ancestor(ch->base, ch))) return -1;
            *bytes += ch->bytes;
            (*n)++;
        }
        if (check_node(c, ch, bytes, n)) return -1;
    }
    return 0;
}

int pcache_check(const pcache *c) {
    size_t bytes = 0;
    int n = 0, listed = 0;
    if (c->root.snap || check_node(c, &c->root, &bytes, &n)) return -1;
    for (const pc_node *o = c->list; o; o = o->lnext) listed++;
    return bytes == c->st.bytes && n == c->st.checkpoints && n == listed ? 0 : -1;
}
