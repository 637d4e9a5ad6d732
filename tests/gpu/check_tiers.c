/* GPU snapshots moved to host memory, and the prefix cache's tiers
 * (src/server/pcache.c): a moved snapshot restores bit for bit, as either
 * end of a chain, and goes through a file; the cache moves checkpoints out
 * of device memory past its device budget, and one restored from RAM
 * continues as before the move. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/pcache.h"

static void die(const tern_error *err) {
    fprintf(stderr, "%s\n", err->msg);
    exit(2);
}

/* The logits of tok evaluated after snap, restored into a new session. */
static void next_logits(tern_model *m, const tern_snapshot *snap, int32_t tok, float *out) {
    tern_session_params sp = {.kv_bits = 8};
    tern_error err;
    tern_session *s = tern_session_create(m, &sp, &err);
    if (!s || tern_session_restore(s, snap, &err) || tern_session_eval(s, &tok, 1, out, 0, &err)) die(&err);
    tern_session_destroy(s);
}

static double differs(tern_model *m, const tern_snapshot *snap, int32_t tok, const float *want) {
    int V = tern_model_vocab_size(m);
    float *got = malloc((size_t)V * sizeof *got);
    next_logits(m, snap, tok, got);
    int d = memcmp(got, want, (size_t)V * sizeof *got) != 0;
    free(got);
    return d;
}

/* A session of m after ids[0..n). */
static tern_session *after(tern_model *m, const int32_t *ids, int n) {
    tern_session_params sp = {.kv_bits = 8};
    tern_error err;
    tern_session *s = tern_session_create(m, &sp, &err);
    if (!s || tern_session_eval(s, ids, n, NULL, 0, &err)) die(&err);
    return s;
}

/* snap written to a temporary file and read back (into device memory). */
static tern_snapshot *through_file(tern_model *m, const tern_snapshot *snap, const tern_snapshot *base) {
    tern_error err;
    FILE *f = tmpfile();
    if (!f || tern_snapshot_write(snap, f, &err)) die(&err);
    rewind(f);
    tern_snapshot *back = tern_snapshot_read(m, f, base, &err);
    fclose(f);
    if (!back) die(&err);
    return back;
}

static void moved_snapshots(tern_model *m, const int32_t *ids, const float *want_a, const float *want_b) {
    tern_error err;
    tern_session *s = after(m, ids, 10);
    tern_snapshot *a = tern_session_snapshot(s, &err), *b = NULL;
    if (!a || tern_session_eval(s, ids + 10, 4, NULL, 0, &err) || !(b = tern_session_snapshot_after(s, a, &err)))
        die(&err);
    tern_session_destroy(s);
    int where = tern_snapshot_on_host(a) + tern_snapshot_on_host(b);
    if (tern_snapshot_to_host(a, &err)) die(&err);
    where = where * 10 + tern_snapshot_on_host(a) + tern_snapshot_on_host(b);
    report("GPU snapshots on the host: where (0, then 1)", where != 1, 0);
    report("GPU snapshot after one on the host (bitwise)", differs(m, b, ids[14], want_b), 0);
    if (tern_snapshot_to_host(b, &err) || tern_snapshot_to_host(b, &err)) die(&err);
    report("GPU snapshot chain on the host (bitwise)",
           differs(m, b, ids[14], want_b) + differs(m, a, ids[10], want_a), 0);
    tern_snapshot *fa = through_file(m, a, NULL), *fb = through_file(m, b, fa);
    report("GPU host snapshots through files (bitwise)",
           differs(m, fb, ids[14], want_b) + differs(m, fa, ids[10], want_a) + tern_snapshot_on_host(fb), 0);
    tern_snapshot_free(fb);
    tern_snapshot_free(fa);
    tern_snapshot_free(b);
    tern_snapshot_free(a);
}

static int found_depth(pcache *c, const int32_t *ids, int n) {
    pc_node *nd = pcache_lookup(c, ids, n);
    return nd ? pc_node_depth(nd) : 0;
}

/* The checkpoints at 10 and 14 (sharing rows), with a device budget one
 * byte short of both: the later one (none holds it) moves to RAM. */
static void cache_tiers(tern_model *m, const int32_t *ids, const float *want_b) {
    tern_error err;
    tern_session *s = after(m, ids, 10);
    tern_snapshot *a = tern_session_snapshot(s, &err), *b = NULL;
    if (!a || tern_session_eval(s, ids + 10, 4, NULL, 0, &err) || !(b = tern_session_snapshot_after(s, a, &err)))
        die(&err);
    pcache *c = pcache_create(tern_snapshot_bytes(a) + tern_snapshot_bytes(b) - 1, (size_t)1 << 30);
    int exact;
    pc_node *nb = NULL;
    if (!c || pcache_insert(c, ids, 10, a, 0) || pcache_base(c, ids, 14, &exact) == NULL ||
        pcache_insert(c, ids, 14, b, 1))
        die(&(tern_error){{"cache insert failed"}});
    pcache_trim(c);
    if (!(nb = pcache_lookup(c, ids, 15))) die(&(tern_error){{"cache lookup failed"}});
    pcache_stats st;
    pcache_stats_get(c, &st);
    report("cache: device budget passed, moves to RAM (1)",
           (st.vram_moves != 1) + (st.vram_checkpoints != 1) + (st.checkpoints != 1) + (pcache_check(c) != 0), 0);
    report("cache: restored from RAM, under a device base",
           (pc_node_depth(nb) != 14) + differs(m, pc_node_snapshot(nb), ids[14], want_b), 0);
    pcache_destroy(c);
    /* no device tier: a checkpoint moves at once */
    c = pcache_create(0, (size_t)1 << 30);
    tern_snapshot *w = tern_session_snapshot(s, &err);
    if (!c || !w || pcache_insert(c, ids, 14, w, 0)) die(&err);
    pcache_trim(c);
    if (!(nb = pcache_lookup(c, ids, 15))) die(&err);
    pcache_stats_get(c, &st);
    report("cache without a device tier: in RAM, restored",
           (st.vram_moves != 1) + !tern_snapshot_on_host(pc_node_snapshot(nb)) + (pcache_check(c) != 0) +
               differs(m, pc_node_snapshot(nb), ids[14], want_b),
           0);
    pcache_destroy(c);
    /* no RAM tier nor disk: a device victim is dropped where it is, not
     * moved (checkpoints at 14 and 15, room for one: the later goes) */
    tern_snapshot *w14 = tern_session_snapshot(s, &err), *w15 = NULL;
    if (!w14 || tern_session_eval(s, ids + 14, 1, NULL, 0, &err) || !(w15 = tern_session_snapshot(s, &err)))
        die(&err);
    c = pcache_create(tern_snapshot_bytes(w14) + tern_snapshot_bytes(w15) - 1, 0);
    if (!c || pcache_insert(c, ids, 14, w14, 0) || pcache_insert(c, ids, 15, w15, 0))
        die(&(tern_error){{"cache insert failed"}});
    pcache_trim(c);
    pcache_stats_get(c, &st);
    report("cache without RAM: a device victim dropped",
           (st.vram_moves != 0) + (st.evicted != 1) + (st.vram_checkpoints != 1) + (found_depth(c, ids, 16) != 14) +
               (pcache_check(c) != 0),
           0);
    pcache_destroy(c);
    tern_session_destroy(s);
}

void check_tiers(const char *dir) {
    /* serial sessions, as the server's: a step's experts run one form
     * however many sessions are alive, so restores compare bit for bit */
    tern_load_params lp = {.n_threads = 4, .device = "cuda", .serial_sessions = 1};
    tern_error err;
    tern_model *m = tern_model_load(dir, &lp, &err);
    if (!m) die(&err);
    int V = tern_model_vocab_size(m);
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
    /* the truth: restores of snapshots never moved */
    float *want_a = malloc((size_t)V * sizeof(float)), *want_b = malloc((size_t)V * sizeof(float));
    tern_session *s = after(m, ids, 10);
    tern_snapshot *a = tern_session_snapshot(s, &err), *b = NULL;
    if (!a || tern_session_eval(s, ids + 10, 4, NULL, 0, &err) || !(b = tern_session_snapshot(s, &err))) die(&err);
    tern_session_destroy(s);
    next_logits(m, a, ids[10], want_a);
    next_logits(m, b, ids[14], want_b);
    tern_snapshot_free(a);
    tern_snapshot_free(b);
    moved_snapshots(m, ids, want_a, want_b);
    cache_tiers(m, ids, want_b);
    free(want_a);
    free(want_b);
    tern_model_free(m);
}
