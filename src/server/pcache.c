#include "server/pcache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

struct pc_node {
    pc_node *parent, *child, *next;   /* the tree: first child, next sibling */
    int32_t *edge;                    /* the ids from the parent to here */
    int n_edge, depth;
    /* the checkpoint (snap != NULL: in memory, tier PC_VRAM or PC_RAM;
     * tier PC_DISK: in its file) */
    tern_snapshot *snap;
    int tier;
    size_t bytes;                     /* in memory: the snapshot's; on disk: the file's */
    uint64_t hash;                    /* of the token path: the file's name */
    pc_node *base;                    /* the checkpoint this one holds; NULL: none above */
    int shares;                       /* the snapshot continues base's KV rows */
    int holders;                      /* checkpoints whose base this is */
    int mem_holders, vram_holders;    /* those of them in memory; in device memory */
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
    pcdisk *disk;                     /* NULL: no disk tier */
    uint64_t serial;                  /* the last checkpoint's number */
    int keep_files;                   /* persisted: destroy leaves the files */
};

enum { PC_RAM, PC_VRAM, PC_DISK };

pcache *pcache_create(size_t vram_budget, size_t ram_budget) {
    pcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    c->st.vram_budget = vram_budget;
    c->st.budget = ram_budget;
    return c;
}

void pcache_attach_disk(pcache *c, pcdisk *d, size_t budget) {
    pcdisk_close(c->disk);
    c->disk = d;
    pthread_mutex_lock(&c->mu);
    c->st.disk_budget = d ? budget : 0;
    pthread_mutex_unlock(&c->mu);
}

static pcdisk_key key_of(const pc_node *nd) { return (pcdisk_key){nd->hash, nd->serial}; }

static void free_subtree(pcache *c, pc_node *nd) {
    while (nd) {
        pc_node *next = nd->next;
        free_subtree(c, nd->child);
        tern_snapshot_free(nd->snap);
        if (nd->tier == PC_DISK && !c->keep_files) pcdisk_remove(c->disk, key_of(nd));
        free(nd->edge);
        free(nd);
        nd = next;
    }
}

void pcache_destroy(pcache *c) {
    if (!c) return;
    free_subtree(c, c->root.child);
    pcdisk_close(c->disk);
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

static int is_ckpt(const pc_node *nd) { return nd->snap || nd->tier == PC_DISK; }

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
        if (is_ckpt(nd) && nd->depth <= limit) best = nd;
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
    while (nd != &c->root && !is_ckpt(nd) && !nd->child) {
        pc_node *parent = nd->parent;
        unlink_child(parent, nd);
        free(nd->edge);
        free(nd);
        nd = parent;
    }
    pc_node *ch = nd->child;
    if (nd == &c->root || is_ckpt(nd) || !ch || ch->next) return;
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

static void list_add(pcache *c, pc_node *nd) {
    nd->lnext = c->list;
    if (c->list) c->list->lprev = nd;
    c->list = nd;
}

static void list_remove(pcache *c, pc_node *nd) {
    if (nd->lprev) nd->lprev->lnext = nd->lnext;
    else c->list = nd->lnext;
    if (nd->lnext) nd->lnext->lprev = nd->lprev;
    nd->lprev = nd->lnext = NULL;
}

/* A checkpoint enters or leaves its tier's statistics. */
static void count_tier(pcache *c, const pc_node *nd, int sign) {
    pthread_mutex_lock(&c->mu);
    size_t *bytes = nd->tier == PC_DISK ? &c->st.disk_bytes : nd->tier == PC_VRAM ? &c->st.vram_bytes : &c->st.bytes;
    int *n = nd->tier == PC_DISK   ? &c->st.disk_checkpoints
             : nd->tier == PC_VRAM ? &c->st.vram_checkpoints
                                   : &c->st.checkpoints;
    *bytes += sign > 0 ? nd->bytes : -nd->bytes;
    *n += sign;
    pthread_mutex_unlock(&c->mu);
}

static void count(pcache *c, unsigned long long *counter) {
    pthread_mutex_lock(&c->mu);
    (*counter)++;
    pthread_mutex_unlock(&c->mu);
}

/* nd enters (sign 1) or leaves its base's holder counts. */
static void count_holder(pc_node *nd, int sign) {
    pc_node *b = nd->base;
    if (!b) return;
    b->holders += sign;
    if (nd->snap) b->mem_holders += sign;
    if (nd->snap && nd->tier == PC_VRAM) b->vram_holders += sign;
}

static void hold(pc_node *nd, pc_node *base) {
    nd->base = base;
    count_holder(nd, 1);
}

static void unhold(pc_node *nd) {
    count_holder(nd, -1);
    nd->base = NULL;
}

/* nd moves to tier, holding snap (NULL on disk) of bytes. */
static void move_tier(pcache *c, pc_node *nd, int tier, tern_snapshot *snap, size_t bytes) {
    count_tier(c, nd, -1);
    count_holder(nd, -1);
    nd->tier = tier;
    nd->snap = snap;
    nd->bytes = bytes;
    count_holder(nd, 1);
    count_tier(c, nd, 1);
}

static pc_node *holder_of(const pcache *c, const pc_node *nd) {
    for (pc_node *o = c->list; o; o = o->lnext)
        if (o->base == nd) return o;
    return NULL;
}

/* Removes the checkpoint from the cache (its file too). Those continuing
 * its KV rows go with it, since nothing could restore them; whole ones
 * hold its base instead. evicted: to stay within a budget (counted). */
static void drop(pcache *c, pc_node *nd, int evicted) {
    pc_node *o;
    while ((o = holder_of(c, nd))) {
        if (o->shares) {
            drop(c, o, evicted);
        } else {
            pc_node *b = nd->base;
            unhold(o);
            hold(o, b);
        }
    }
    unhold(nd);
    list_remove(c, nd);
    count_tier(c, nd, -1);
    if (evicted) count(c, &c->st.evicted);
    tern_snapshot_free(nd->snap);
    if (nd->tier == PC_DISK) pcdisk_remove(c->disk, key_of(nd));
    nd->snap = NULL;
    nd->tier = PC_RAM;
    nd->shares = 0;
    nd->bytes = 0;
    prune(c, nd);
}

/* The checkpoint of a tier to evict, one that none in the tier or above
 * holds (descendants go first): in device memory, none there; in RAM, none
 * in memory (they may continue its rows); on disk, none at all. Then the
 * lowest priority, the least recently used on a tie. */
static pc_node *victim(const pcache *c, int tier) {
    pc_node *v = NULL;
    for (pc_node *nd = c->list; nd; nd = nd->lnext) {
        int held = tier == PC_VRAM ? nd->vram_holders : tier == PC_RAM ? nd->mem_holders : nd->holders;
        if (nd->tier != tier || held) continue;
        if (!v || nd->prio < v->prio || (nd->prio == v->prio && nd->used < v->used)) v = nd;
    }
    return v;
}

/* GreedyDual-Size's L rises to each victim's priority (never falls: the
 * tiers' victims are chosen apart). */
static void inflate(pcache *c, const pc_node *v) {
    if (v->prio > c->L) c->L = v->prio;
}

/* Evicts from the disk tier until need more bytes fit its budget. (L is
 * the RAM tier's: the disk keeps the priorities its checkpoints had.) */
static int make_room(pcache *c, size_t need) {
    pc_node *v;
    while (c->st.disk_bytes + need > c->st.disk_budget) {
        if (!(v = victim(c, PC_DISK))) return -1;
        drop(c, v, 1);
    }
    return 0;
}

/* A file is the snapshot's bytes behind a header and followed by a
 * checksum: room is made for this much more before it is written. */
#define FILE_OVERHEAD 4096

/* Moves a victim in memory to its file: it keeps its place in the tree. -1
 * when there is no disk tier, no room or the write failed (the caller then
 * drops it). */
static int spill(pcache *c, pc_node *nd) {
    size_t need = nd->bytes + FILE_OVERHEAD, fbytes;
    if (!c->disk || need > c->st.disk_budget || make_room(c, need)) return -1;
    tern_error err;
    if (pcdisk_write(c->disk, key_of(nd), nd->snap, &fbytes, &err)) {
        fprintf(stderr, "tern serve: a checkpoint was not written to disk: %s\n", err.msg);
        return -1;
    }
    tern_snapshot_free(nd->snap);
    move_tier(c, nd, PC_DISK, NULL, fbytes);
    count(c, &c->st.disk_writes);
    make_room(c, 0);   /* a file larger than expected */
    return 0;
}

/* Moves a device-memory victim's snapshot to host memory (the RAM tier):
 * -1 when that failed (then it is dropped). */
static int to_ram(pcache *c, pc_node *nd) {
    tern_error err;
    if (tern_snapshot_to_host(nd->snap, &err)) {
        fprintf(stderr, "tern serve: a checkpoint was not moved to host memory: %s\n", err.msg);
        return -1;
    }
    move_tier(c, nd, PC_RAM, nd->snap, nd->bytes);
    count(c, &c->st.vram_moves);
    return 0;
}

/* A device-memory victim, moved down (dropped when it cannot be): to RAM,
 * or, when a RAM tier of ram_budget could not hold it and nothing in
 * memory continues its rows, straight to disk. */
static int trim_vram_one(pcache *c, size_t ram_budget) {
    pc_node *v = victim(c, PC_VRAM);
    if (!v) return -1;
    inflate(c, v);
    int past_ram = v->bytes > ram_budget && !v->mem_holders;
    if (past_ram ? spill(c, v) : to_ram(c, v)) drop(c, v, 1);
    return 0;
}

/* Evicts until the tiers in memory hold at most these bytes. */
static void trim_to(pcache *c, size_t vram_budget, size_t ram_budget) {
    while (c->st.vram_bytes > vram_budget && trim_vram_one(c, ram_budget) == 0) {
    }
    while (c->st.bytes > ram_budget) {
        pc_node *v = victim(c, PC_RAM);
        if (!v) {
            /* every checkpoint in RAM is held by one in device memory,
             * which must come down (and be evicted) first */
            if (trim_vram_one(c, ram_budget)) break;
            continue;
        }
        inflate(c, v);
        if (spill(c, v)) drop(c, v, 1);
    }
}

void pcache_trim(pcache *c) { trim_to(c, c->st.vram_budget, c->st.budget); }

void pcache_evict_memory(pcache *c) { trim_to(c, 0, 0); }

int pcache_rebind(pcache *c, const tern_model *m, tern_error *err) {
    if (!c->disk) return 0;
    int same = m ? pcdisk_matches(c->disk, m, err) : 1;
    if (same < 0) return -1;
    /* files another model (or build) wrote: nothing could read them */
    for (pc_node *nd; !same && (nd = c->list);) drop(c, nd, 0);
    return pcdisk_rebind(c->disk, m, err);
}

static int tier_of(const tern_snapshot *snap) { return tern_snapshot_on_host(snap) ? PC_RAM : PC_VRAM; }

/* Reads nd's file, after those of the bases whose rows it continues. */
static int load(pcache *c, pc_node *nd, tern_error *err) {
    if (nd->snap) return 0;
    if (nd->shares && load(c, nd->base, err)) return -1;   /* nd went with its base */
    tern_snapshot *snap = pcdisk_read(c->disk, key_of(nd), nd->shares ? nd->base->snap : NULL, err);
    /* a sound file of other tokens (renamed, or named wrongly by an index) */
    if (snap && tern_snapshot_pos(snap) != nd->depth) {
        tern_fail(err, "a checkpoint's file holds %d tokens, its place in the tree %d", tern_snapshot_pos(snap),
                  nd->depth);
        tern_snapshot_free(snap);
        snap = NULL;
    }
    if (!snap) {
        count(c, &c->st.disk_corrupt);
        drop(c, nd, 0);
        return -1;
    }
    pcdisk_remove(c->disk, key_of(nd));
    move_tier(c, nd, tier_of(snap), snap, tern_snapshot_bytes(snap));
    count(c, &c->st.disk_reads);
    return 0;
}

int pcache_load(pcache *c, pc_node *nd, tern_error *err) {
    return load(c, nd, err);
}

int pcache_insert(pcache *c, const int32_t *tokens, int n, tern_snapshot *snap, int shares) {
    size_t bytes = tern_snapshot_bytes(snap);
    int exact, tier = tier_of(snap);
    pc_node *base = n >= 1 ? pcache_base(c, tokens, n, &exact) : NULL;
    /* one too large for the budgets would only evict everything else */
    int fits = bytes <= c->st.budget || (tier == PC_VRAM && bytes <= c->st.vram_budget);
    if (n < 1 || !fits || (base && exact) || (shares && !(base && base->snap))) {
        tern_snapshot_free(snap);
        return 0;
    }
    pc_node *nd = node_at(c, tokens, n);
    if (!nd) {
        tern_snapshot_free(snap);
        return -1;
    }
    nd->snap = snap;
    nd->tier = tier;
    nd->bytes = bytes;
    nd->shares = shares;
    nd->hash = pcdisk_hash(tokens, n);
    hold(nd, base);
    list_add(c, nd);
    hit(c, nd);
    count_tier(c, nd, 1);
    nd->serial = ++c->serial;
    count(c, &c->st.inserted);
    return 0;
}

/* ---- the disk tier across processes ----------------------------------- */

static pc_node *by_serial(const pcache *c, uint64_t serial) {
    for (pc_node *nd = c->list; nd; nd = nd->lnext)
        if (nd->serial == serial) return nd;
    return NULL;
}

/* The ids on the path from the root to nd, into t (nd->depth of them). */
static void path_ids(const pc_node *nd, int32_t *t) {
    for (; nd && nd->n_edge; nd = nd->parent)
        memcpy(t + nd->depth - nd->n_edge, nd->edge, (size_t)nd->n_edge * sizeof *t);
}

/* An index entry back in the tree, on disk. Skipped: one already there,
 * one whose base is not a checkpoint on its path, one continuing the rows
 * of a base that did not come back. */
static int adopt(void *ud, const pcdisk_entry *e) {
    pcache *c = ud;
    pc_node *base = e->base ? by_serial(c, e->base) : NULL, *at;
    if (walk(c, e->tokens, e->n, e->n, &at) && at->depth == e->n && is_ckpt(at)) return 0;
    if (base && base != walk(c, e->tokens, e->n, base->depth, NULL)) base = NULL;
    if ((e->shares && !base) || by_serial(c, e->key.serial)) return 0;
    pc_node *nd = node_at(c, e->tokens, e->n);
    if (!nd) return 1;
    nd->tier = PC_DISK;
    nd->bytes = (size_t)e->bytes;
    nd->shares = e->shares;
    nd->hash = e->key.hash;
    nd->serial = e->key.serial;
    if (nd->serial > c->serial) c->serial = nd->serial;
    hold(nd, base);
    list_add(c, nd);
    hit(c, nd);
    count_tier(c, nd, 1);
    return 0;
}

static int claimed(void *ud, pcdisk_key k) {
    for (const pc_node *nd = ((const pcache *)ud)->list; nd; nd = nd->lnext)
        if (nd->tier == PC_DISK && nd->hash == k.hash && nd->serial == k.serial) return 1;
    return 0;
}

int pcache_adopt_disk(pcache *c, tern_error *err) {
    if (!c->disk) return 0;
    int n = pcdisk_read_index(c->disk, adopt, c, err);
    pcdisk_sweep(c->disk, n > 0 ? claimed : NULL, c);
    make_room(c, 0);
    if (n <= 0) return n;
    int held = 0;
    for (const pc_node *nd = c->list; nd; nd = nd->lnext) held++;
    return held;
}

static int by_depth(const void *a, const void *b) {
    int da = (*(pc_node *const *)a)->depth, db = (*(pc_node *const *)b)->depth;
    return (da > db) - (da < db);
}

int pcache_persist(pcache *c, tern_error *err) {
    if (!c->disk) return 0;
    pcache_evict_memory(c);
    int n = 0;
    size_t total = 0;
    for (pc_node *nd = c->list; nd; nd = nd->lnext) {
        n++;
        total += (size_t)nd->depth;
    }
    /* bases before the checkpoints holding them: a base is an ancestor */
    pc_node **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    pcdisk_entry *e = malloc((size_t)(n ? n : 1) * sizeof *e);
    int32_t *ids = malloc((total ? total : 1) * sizeof *ids);
    int rc = order && e && ids ? 0 : tern_fail(err, "out of memory");
    int k = 0;
    for (pc_node *nd = c->list; rc == 0 && nd; nd = nd->lnext) order[k++] = nd;
    if (rc == 0) qsort(order, (size_t)n, sizeof *order, by_depth);
    int32_t *t = ids;
    for (int i = 0; rc == 0 && i < n; t += order[i++]->depth) {
        pc_node *nd = order[i];
        path_ids(nd, t);
        e[i] = (pcdisk_entry){key_of(nd), nd->base ? nd->base->serial : 0, nd->bytes, nd->shares, nd->depth, t};
    }
    if (rc == 0) rc = pcdisk_write_index(c->disk, e, n, err);
    c->keep_files = rc == 0;
    free(order);
    free(e);
    free(ids);
    return rc ? -1 : n;
}

/* ---- invariants (tests) ------------------------------------------------ */

static int is_ancestor(const pc_node *a, const pc_node *nd) {
    for (; nd; nd = nd->parent)
        if (nd == a) return 1;
    return 0;
}

/* One checkpoint's references: holders counted, one in memory's shared
 * base in memory, its bytes and tier its snapshot's. */
static int check_ckpt(const pcache *c, const pc_node *ch) {
    int holders = 0, mem = 0, vram = 0;
    for (const pc_node *o = c->list; o; o = o->lnext) {
        holders += o->base == ch;
        mem += o->base == ch && o->snap;
        vram += o->base == ch && o->snap && o->tier == PC_VRAM;
    }
    if (holders != ch->holders || mem != ch->mem_holders || vram != ch->vram_holders) return -1;
    if (!!ch->snap == (ch->tier == PC_DISK)) return -1;
    if (ch->snap && (ch->bytes != tern_snapshot_bytes(ch->snap) || ch->tier != tier_of(ch->snap))) return -1;
    if (ch->shares && (!ch->base || (ch->snap && !ch->base->snap))) return -1;
    if (ch->base && (!is_ckpt(ch->base) || ch->base == ch || !is_ancestor(ch->base, ch))) return -1;
    return 0;
}

static int check_node(const pcache *c, const pc_node *nd, size_t *bytes, int *n) {
    for (const pc_node *ch = nd->child; ch; ch = ch->next) {
        if (ch->parent != nd || ch->n_edge < 1 || ch->depth != nd->depth + ch->n_edge) return -1;
        if (find_child(nd, ch->edge[0]) != ch) return -1;   /* first ids differ among siblings */
        int kids = 0;
        for (const pc_node *g = ch->child; g; g = g->next) kids++;
        if (!is_ckpt(ch) && kids < 2) return -1;            /* compressed */
        if (is_ckpt(ch)) {
            if (check_ckpt(c, ch)) return -1;
            bytes[ch->tier] += ch->bytes;
            n[ch->tier]++;
        }
        if (check_node(c, ch, bytes, n)) return -1;
    }
    return 0;
}

int pcache_check(const pcache *c) {
    size_t bytes[3] = {0, 0, 0};   /* by tier */
    int n[3] = {0, 0, 0}, listed = 0;
    if (is_ckpt(&c->root) || check_node(c, &c->root, bytes, n)) return -1;
    for (const pc_node *o = c->list; o; o = o->lnext) listed++;
    if (bytes[PC_DISK] > c->st.disk_budget || (n[PC_DISK] && !c->disk)) return -1;
    return bytes[PC_RAM] == c->st.bytes && n[PC_RAM] == c->st.checkpoints && bytes[PC_VRAM] == c->st.vram_bytes &&
                   n[PC_VRAM] == c->st.vram_checkpoints && bytes[PC_DISK] == c->st.disk_bytes &&
                   n[PC_DISK] == c->st.disk_checkpoints && n[0] + n[1] + n[2] == listed
               ? 0
               : -1;
}
