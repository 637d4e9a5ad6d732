/* The server's prefix cache (src/server/pcache.c): longest-prefix lookup
 * over a radix tree of token ids, the budget, and the eviction order
 * (descendants before their bases, then by value per byte and recency).
 * The checkpoints are real snapshots of a session on the tiny fixture; the
 * tree's invariants are checked after every change. An unload of the
 * model empties the memory tiers into the disk tier. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/pcache.h"
#include "server/pcdisk.h"
#include "util/sha256.h"
#include "tern.h"
#include "testutil.h"

static tern_model *model;
static tern_session *sess;
static size_t S;   /* bytes of one snapshot of the empty session */

static tern_snapshot *snap(void) {
    tern_error err;
    tern_snapshot *s = tern_session_snapshot(sess, &err);
    cr_assert_not_null(s, "%s", err.msg);
    return s;
}

static void setup(void) {
    tern_error err;
    tern_load_params lp = {.n_threads = 1};
    model = tern_model_load(fixture_dir("tiny"), &lp, &err);
    cr_assert_not_null(model, "%s", err.msg);
    sess = tern_session_create(model, NULL, &err);
    cr_assert_not_null(sess, "%s", err.msg);
    tern_snapshot *s = snap();
    S = tern_snapshot_bytes(s);
    tern_snapshot_free(s);
}

static void teardown(void) {
    tern_session_destroy(sess);
    tern_model_free(model);
}

TestSuite(pcache, .init = setup, .fini = teardown);

/* ids base, base+1, ... */
static void seq(int32_t *t, int n, int32_t base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

static void insert(pcache *c, const int32_t *t, int n) {
    cr_assert_eq(pcache_insert(c, t, n, snap(), 0), 0);
    pcache_trim(c);
    cr_assert_eq(pcache_check(c), 0, "the tree's invariants after inserting %d ids", n);
}

static int found(pcache *c, const int32_t *t, int n) {
    pc_node *nd = pcache_lookup(c, t, n);
    return nd ? pc_node_depth(nd) : 0;
}

static pcache_stats stats(pcache *c) {
    pcache_stats st;
    pcache_stats_get(c, &st);
    return st;
}

Test(pcache, longest_prefix_lookup) {
    pcache *c = pcache_create(0, 100 * S);
    int32_t a[64], b[64];
    seq(a, 64, 1000);
    memcpy(b, a, sizeof b);
    b[15] = 7;   /* b leaves a after 15 ids */
    insert(c, a, 10);
    insert(c, a, 20);
    insert(c, b, 25);
    cr_expect_eq(found(c, a, 64), 20);
    cr_expect_eq(found(c, a, 21), 20);
    cr_expect_eq(found(c, a, 20), 10, "the prompt's last id is never restored");
    cr_expect_eq(found(c, a, 10), 0);
    cr_expect_eq(found(c, b, 64), 25);
    cr_expect_eq(found(c, b, 24), 10);
    int32_t x[8];
    seq(x, 8, 5);
    cr_expect_eq(found(c, x, 8), 0);
    cr_expect_eq(stats(c).checkpoints, 3);
    cr_expect_eq(stats(c).bytes, 3 * S);
    pcache_destroy(c);
}

Test(pcache, divergence_resumes_from_the_last_checkpoint_before_it) {
    pcache *c = pcache_create(0, 100 * S);
    int32_t a[300], b[300];
    seq(a, 300, 1);
    for (int k = 64; k <= 256; k += 64) insert(c, a, k);
    memcpy(b, a, sizeof b);
    b[150] = 99999;
    cr_expect_eq(found(c, b, 300), 128);
    b[150] = a[150];
    b[192] = 99999;   /* right after a checkpoint: that one */
    cr_expect_eq(found(c, b, 300), 192);
    b[192] = a[192];
    b[191] = 99999;   /* right before one: the one before */
    cr_expect_eq(found(c, b, 300), 128);
    pcache_destroy(c);
}

Test(pcache, an_exact_duplicate_is_not_kept_twice) {
    pcache *c = pcache_create(0, 100 * S);
    int32_t a[32];
    seq(a, 32, 1);
    insert(c, a, 16);
    insert(c, a, 16);
    cr_expect_eq(stats(c).checkpoints, 1);
    cr_expect_eq(stats(c).inserted, 1);
    int exact;
    pc_node *nd = pcache_base(c, a, 16, &exact);
    cr_expect(nd && exact && pc_node_depth(nd) == 16);
    nd = pcache_base(c, a, 20, &exact);
    cr_expect(nd && !exact && pc_node_depth(nd) == 16);
    pcache_destroy(c);
}

Test(pcache, bytes_held_stay_within_the_budget) {
    size_t budget = 3 * S + S / 2;
    pcache *c = pcache_create(0, budget);
    int32_t t[40];
    for (int i = 0; i < 12; i++) {
        seq(t, 40, 100 * i);   /* unrelated conversations */
        insert(c, t, 10 + i);
        cr_assert_leq(stats(c).bytes, budget);
    }
    cr_expect_eq(stats(c).checkpoints, 3);
    cr_expect_eq(stats(c).evicted, 9);
    pcache_destroy(c);
    c = pcache_create(0, S - 1);   /* smaller than one checkpoint: nothing is kept */
    insert(c, t, 10);
    cr_expect_eq(stats(c).checkpoints, 0);
    cr_expect_eq(stats(c).bytes, 0);
    pcache_destroy(c);
}

Test(pcache, inserts_wait_for_a_trim_to_evict) {
    pcache *c = pcache_create(0, 2 * S);
    int32_t t[40];
    for (int i = 0; i < 4; i++) {
        seq(t, 40, 100 * i);
        cr_assert_eq(pcache_insert(c, t, 10, snap(), 0), 0);
    }
    cr_expect_eq(stats(c).checkpoints, 4, "an insert alone evicts nothing");
    cr_expect_eq(pcache_check(c), 0);
    pcache_trim(c);
    cr_expect_eq(stats(c).checkpoints, 2);
    cr_expect_leq(stats(c).bytes, 2 * S);
    cr_expect_eq(found(c, t, 11), 10, "the newest is kept");
    pcache_destroy(c);
}

Test(pcache, descendants_go_before_their_base) {
    pcache *c = pcache_create(0, 3 * S);
    int32_t a[64], x[64];
    seq(a, 64, 1);
    insert(c, a, 10);   /* the oldest and least valuable: yet held by 20 */
    insert(c, a, 20);
    insert(c, a, 50);
    seq(x, 64, 5000);
    insert(c, x, 60);   /* a fourth: one of a's must go, the leaf */
    cr_expect_eq(found(c, a, 64), 20);
    cr_expect_eq(found(c, x, 64), 60);
    insert(c, x + 1, 60);   /* another: 20 (the leaf of a's chain now) goes before 10 */
    cr_expect_eq(found(c, a, 64), 10);
    cr_expect_eq(stats(c).checkpoints, 3);
    pcache_destroy(c);
}

Test(pcache, value_per_byte_outweighs_recency) {
    pcache *c = pcache_create(0, 2 * S);
    int32_t a[1100], b[64], x[64];
    seq(a, 1100, 1);
    seq(b, 64, 20000);
    seq(x, 64, 30000);
    insert(c, a, 1000);   /* saves 1000 ids of prefill */
    insert(c, b, 10);     /* newer, but saves 10 */
    insert(c, x, 40);
    cr_expect_eq(found(c, a, 1100), 1000);
    cr_expect_eq(found(c, b, 64), 0);
    cr_expect_eq(found(c, x, 64), 40);
    pcache_destroy(c);
}

Test(pcache, recency_among_equals) {
    pcache *c = pcache_create(0, 2 * S);
    int32_t a[64], b[64], x[64];
    seq(a, 64, 1);
    seq(b, 64, 20000);
    seq(x, 64, 30000);
    insert(c, a, 30);
    insert(c, b, 30);
    cr_expect_eq(found(c, a, 64), 30);   /* a hit: a is now the more recent */
    insert(c, x, 30);
    cr_expect_eq(found(c, a, 64), 30);
    cr_expect_eq(found(c, b, 64), 0);
    pcache_destroy(c);
}

/* A hit below a base is a use of the base: once its descendant is gone it
 * outlives a checkpoint of the same value used before that hit. */
Test(pcache, a_hit_refreshes_the_bases) {
    pcache *c = pcache_create(0, 3 * S);
    int32_t s[200], x[200], y[400], z[400];
    seq(s, 200, 1);
    seq(x, 200, 10000);
    seq(y, 400, 20000);
    seq(z, 400, 30000);
    insert(c, s, 100);
    insert(c, x, 100);   /* as valuable as s's, and used after it */
    insert(c, s, 150);   /* held by nothing: the first to go */
    cr_expect_eq(found(c, s, 200), 150);   /* used through s[0..150) */
    insert(c, y, 300);
    int exact;   /* (not a lookup: that would be a use of s's) */
    pc_node *nd = pcache_base(c, s, 150, &exact);
    cr_expect(nd && !exact && pc_node_depth(nd) == 100, "the descendant went first");
    insert(c, z, 300);
    cr_expect_eq(found(c, x, 200), 0, "the base was used later than x");
    cr_expect_eq(found(c, s, 200), 100);
    pcache_destroy(c);
}

/* Random conversations from a small alphabet (many shared prefixes, edges
 * split and merged again): the invariants hold throughout, and a lookup
 * never gives a checkpoint deeper than the prompt allows. */
Test(pcache, random_branches_keep_the_tree_sound) {
    pcache *c = pcache_create(0, 6 * S);
    unsigned r = 12345;
    int32_t t[48];
    for (int op = 0; op < 400; op++) {
        int n = 1 + (int)((r = r * 1103515245u + 12345u) >> 16) % 48;
        for (int i = 0; i < n; i++) t[i] = (int32_t)(((r = r * 1103515245u + 12345u) >> 16) % 3);
        if (op % 3) insert(c, t, n);
        int d = found(c, t, n);
        cr_assert_lt(d, n > 0 ? n : 1);
        cr_assert_leq(stats(c).bytes, 6 * S);
        cr_assert_eq(pcache_check(c), 0, "after op %d", op);
    }
    pcache_destroy(c);
}

/* ---- the disk tier ----------------------------------------------------- */

static char *disk_dir(void) {
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/tern-pcache-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static pcache *disk_cache(size_t ram, size_t disk, char **dir) {
    tern_error err;
    *dir = disk_dir();
    pcache *c = pcache_create(0, ram);
    pcdisk *d = pcdisk_open(*dir, model, &err);
    cr_assert_not_null(d, "%s", err.msg);
    pcache_attach_disk(c, d, disk);
    return c;
}

static int files_in(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ls %s | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    cr_assert(p && fscanf(p, "%d", &n) == 1);
    pclose(p);
    return n;
}

/* A chain of checkpoints of one session, each sharing its base's rows:
 * spilled leaf first, read back root to leaf, equal to what was taken. */
Test(pcache, a_chain_spills_to_disk_and_comes_back) {
    char *dir;
    pcache *c = disk_cache(2 * S, 100 * S, &dir);
    tern_error err;
    int32_t t[64];
    seq(t, 64, 100);
    cr_assert_eq(tern_session_reset(sess, &err), 0);
    const pc_node *base = NULL;
    for (int k = 1; k <= 4; k++) {
        cr_assert_eq(tern_session_eval(sess, t + 8 * (k - 1), 8, NULL, 0, &err), 0, "%s", err.msg);
        int exact;
        cr_assert_eq(pcache_base(c, t, 8 * k, &exact), base);
        int shares = base && pc_node_snapshot(base);
        tern_snapshot *s = tern_session_snapshot_after(sess, shares ? pc_node_snapshot(base) : NULL, &err);
        cr_assert_not_null(s, "%s", err.msg);
        cr_assert_eq(pcache_insert(c, t, 8 * k, s, shares), 0);
        pcache_trim(c);
        cr_assert_eq(pcache_check(c), 0, "after %d", k);
        base = pcache_base(c, t, 8 * k, &exact);
        cr_assert(base && exact);
    }
    pcache_stats st = stats(c);
    cr_expect_gt(st.disk_checkpoints, 0);
    cr_expect_eq(st.checkpoints + st.disk_checkpoints, 4);
    cr_expect_eq(files_in(dir), st.disk_checkpoints);
    pc_node *nd = pcache_lookup(c, t, 64);
    cr_assert(nd && pc_node_depth(nd) == 32 && !pc_node_snapshot(nd), "the leaf is on disk");
    cr_assert_eq(pcache_load(c, nd, &err), 0, "%s", err.msg);
    cr_assert_eq(pcache_check(c), 0);
    cr_expect_gt(stats(c).disk_reads, 0);
    tern_session *s2 = tern_session_create(model, NULL, &err);
    cr_assert_eq(tern_session_restore(s2, pc_node_snapshot(nd), &err), 0, "%s", err.msg);
    cr_expect_eq(tern_session_pos(s2), 32);
    tern_session_destroy(s2);
    pcache_trim(c);
    cr_assert_eq(pcache_check(c), 0);
    cr_assert_leq(stats(c).bytes, 2 * S);
    pcache_destroy(c);
    cr_expect_eq(files_in(dir), 0, "the cache's files go with it");
    rmdir(dir);
}

/* A file that fails verification drops its checkpoint and those that
 * continue its rows; the lookup then finds what is left. */
Test(pcache, a_corrupt_file_drops_its_chain) {
    char *dir;
    pcache *c = disk_cache(S + S / 2, 100 * S, &dir);
    tern_error err;
    int32_t t[64];
    seq(t, 64, 100);
    cr_assert_eq(tern_session_reset(sess, &err), 0);
    const pc_node *base = NULL;
    for (int k = 1; k <= 3; k++) {
        cr_assert_eq(tern_session_eval(sess, t + 8 * (k - 1), 8, NULL, 0, &err), 0, "%s", err.msg);
        int exact, shares = base && pc_node_snapshot(base);
        tern_snapshot *s = tern_session_snapshot_after(sess, shares ? pc_node_snapshot(base) : NULL, &err);
        cr_assert_eq(pcache_insert(c, t, 8 * k, s, shares), 0);
        pcache_trim(c);
        base = pcache_base(c, t, 8 * k, &exact);
    }
    cr_assert_eq(stats(c).disk_checkpoints, 2, "16 and 24 spilled, 8 in RAM");
    char cmd[160];
    snprintf(cmd, sizeof cmd, "for f in %s/*; do printf 'x' | dd of=$f bs=1 seek=300 conv=notrunc 2>/dev/null; done",
             dir);
    cr_assert_eq(system(cmd), 0);
    /* as the scheduler does: the deepest, until one is in RAM */
    pc_node *nd;
    int failed = 0;
    while ((nd = pcache_lookup(c, t, 64)) && pcache_load(c, nd, &err)) {
        failed++;
        cr_assert_eq(pcache_check(c), 0);
    }
    cr_assert(nd && pc_node_depth(nd) == 8 && pc_node_snapshot(nd));
    pcache_stats st = stats(c);
    cr_expect(failed >= 1 && st.disk_corrupt == (unsigned long long)failed);
    cr_expect_eq(st.disk_checkpoints, 0);
    cr_expect_eq(st.disk_reads, 0);
    cr_expect_eq(files_in(dir), 0);
    pcache_destroy(c);
    rmdir(dir);
}

/* A whole checkpoint of the session after t[0..n) (a file read back must
 * hold as many tokens as its place in the tree). */
static void insert_evaluated(pcache *c, const int32_t *t, int n) {
    tern_error err;
    cr_assert_eq(tern_session_reset(sess, &err), 0);
    cr_assert_eq(tern_session_eval(sess, t, n, NULL, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(pcache_insert(c, t, n, snap(), 0), 0);
    pcache_trim(c);
    cr_assert_eq(pcache_check(c), 0, "the tree's invariants after inserting %d ids", n);
}

/* Random conversations with whole checkpoints through a small RAM tier and
 * a small disk tier: the invariants hold, each tier within its budget. */
Test(pcache, random_spills_keep_both_tiers_sound) {
    char *dir;
    pcache *c = disk_cache(2 * S, 3 * (S + 4096), &dir);
    unsigned r = 777;
    int32_t t[48];
    tern_error err;
    for (int op = 0; op < 200; op++) {
        int n = 1 + (int)((r = r * 1103515245u + 12345u) >> 16) % 48;
        for (int i = 0; i < n; i++) t[i] = (int32_t)(((r = r * 1103515245u + 12345u) >> 16) % 3);
        if (op % 3) insert_evaluated(c, t, n);
        pc_node *nd = pcache_lookup(c, t, n);
        if (nd && op % 2) cr_assert_eq(pcache_load(c, nd, &err), 0, "%s", err.msg);
        pcache_trim(c);
        cr_assert_leq(stats(c).bytes, 2 * S);
        cr_assert_leq(stats(c).disk_bytes, 3 * (S + 4096));
        cr_assert_eq(pcache_check(c), 0, "after op %d", op);
        cr_assert_eq(files_in(dir), stats(c).disk_checkpoints, "after op %d", op);
    }
    cr_expect_gt(stats(c).disk_reads, 0);
    pcache_destroy(c);
    rmdir(dir);
}

/* A chain of checkpoints of one session, each sharing its base's rows;
 * *dir: the disk tier's directory. */
static pcache *chain_in_ram(int32_t *t, char **dir) {
    tern_error err;
    pcache *c = disk_cache(100 * S, 100 * S, dir);
    cr_assert_eq(tern_session_reset(sess, &err), 0);
    const pc_node *base = NULL;
    for (int k = 1; k <= 4; k++) {
        cr_assert_eq(tern_session_eval(sess, t + 8 * (k - 1), 8, NULL, 0, &err), 0, "%s", err.msg);
        int exact, shares = base != NULL;
        tern_snapshot *s = tern_session_snapshot_after(sess, shares ? pc_node_snapshot(base) : NULL, &err);
        cr_assert_eq(pcache_insert(c, t, 8 * k, s, shares), 0);
        pcache_trim(c);
        base = pcache_base(c, t, 8 * k, &exact);
    }
    cr_assert_eq(stats(c).checkpoints, 4);
    cr_assert_eq(stats(c).disk_checkpoints, 0);
    return c;
}

/* The server frees the model: what the memory tiers hold goes to disk, and
 * a model loaded again (the same files) reads it back. */
Test(pcache, an_unload_moves_memory_to_disk_and_a_reload_reads_it) {
    char *dir;
    int32_t t[64];
    seq(t, 64, 100);
    pcache *c = chain_in_ram(t, &dir);
    pcache_evict_memory(c);
    cr_assert_eq(pcache_check(c), 0);
    pcache_stats st = stats(c);
    cr_expect_eq(st.checkpoints, 0);
    cr_expect_eq(st.bytes, 0);
    cr_expect_eq(st.disk_checkpoints, 4);
    cr_expect_eq(files_in(dir), 4);
    cr_assert_eq(pcache_rebind(c, NULL, NULL), 0);
    tern_error err;
    tern_load_params lp = {.n_threads = 1};
    tern_model *again = tern_model_load(fixture_dir("tiny"), &lp, &err);
    cr_assert_not_null(again, "%s", err.msg);
    cr_assert_eq(pcache_rebind(c, again, &err), 0, "%s", err.msg);
    cr_expect_eq(stats(c).disk_checkpoints, 4, "the same model's files stay");
    pc_node *nd = pcache_lookup(c, t, 64);
    cr_assert(nd && pc_node_depth(nd) == 32);
    cr_assert_eq(pcache_load(c, nd, &err), 0, "%s", err.msg);
    cr_assert_eq(pcache_check(c), 0);
    tern_session *s2 = tern_session_create(again, NULL, &err);
    cr_assert_eq(tern_session_restore(s2, pc_node_snapshot(nd), &err), 0, "%s", err.msg);
    cr_expect_eq(tern_session_pos(s2), 32);
    tern_session_destroy(s2);
    pcache_destroy(c);
    tern_model_free(again);
    cr_expect_eq(files_in(dir), 0);
    rmdir(dir);
}

/* Without room on disk the memory tiers' checkpoints are dropped; a model
 * of another identity drops the files. */
Test(pcache, an_unload_drops_what_the_disk_cannot_take) {
    char *dir;
    int32_t t[64];
    seq(t, 64, 100);
    pcache *c = chain_in_ram(t, &dir);
    /* room for one of the four (of about equal size) */
    size_t room = stats(c).bytes / 4 * 3 / 2 + 4096;
    pcache_attach_disk(c, pcdisk_open(dir, model, &(tern_error){{0}}), room);
    pcache_evict_memory(c);
    cr_assert_eq(pcache_check(c), 0);
    pcache_stats st = stats(c);
    cr_expect_eq(st.checkpoints, 0);
    cr_expect_eq(st.disk_checkpoints, 1, "the disk tier holds one");
    cr_expect_leq(st.disk_bytes, room);
    cr_expect_eq(files_in(dir), 1);
    tern_error err;
    tern_load_params lp = {.n_threads = 1};
    tern_model *other = tern_model_load(fixture_dir("odd"), &lp, &err);
    cr_assert_not_null(other, "%s", err.msg);
    cr_assert_eq(pcache_rebind(c, other, &err), 0, "%s", err.msg);
    cr_assert_eq(pcache_check(c), 0);
    cr_expect_eq(stats(c).disk_checkpoints, 0);
    cr_expect_eq(files_in(dir), 0);
    cr_expect_null(pcache_lookup(c, t, 64));
    pcache_destroy(c);
    tern_model_free(other);
    rmdir(dir);
}

/* A new cache whose disk tier of `disk` bytes is dir, adopting what an
 * earlier one left there (*adopted: pcache_adopt_disk's count). */
static pcache *adopted_cache(const char *dir, size_t disk, int *adopted) {
    tern_error err;
    pcache *c = pcache_create(0, 100 * S);
    pcdisk *d = pcdisk_open(dir, model, &err);
    cr_assert_not_null(d, "%s", err.msg);
    pcache_attach_disk(c, d, disk);
    *adopted = pcache_adopt_disk(c, &err);
    return c;
}

/* A clean exit keeps the tier: persist writes the index, and a new cache
 * on the same directory adopts the chain (sharing bases included) and
 * reads the leaf back as it was taken. Without the index (a crash), the
 * next cache deletes the files. */
Test(pcache, persisted_checkpoints_are_adopted_by_the_next_cache) {
    char *dir;
    int32_t t[64];
    seq(t, 64, 100);
    pcache *c = chain_in_ram(t, &dir);
    tern_error err;
    cr_assert_eq(pcache_persist(c, &err), 4, "%s", err.msg);
    pcache_destroy(c);
    cr_expect_eq(files_in(dir), 5, "four checkpoints and the index stay");
    int n;
    c = adopted_cache(dir, 100 * S, &n);
    cr_assert_eq(n, 4);
    cr_assert_eq(pcache_check(c), 0);
    cr_expect_eq(stats(c).disk_checkpoints, 4);
    cr_expect_eq(files_in(dir), 4, "the index is read once");
    pc_node *nd = pcache_lookup(c, t, 64);
    cr_assert(nd && pc_node_depth(nd) == 32);
    cr_assert_eq(pcache_load(c, nd, &err), 0, "%s", err.msg);
    cr_assert_eq(pcache_check(c), 0);
    tern_session *s2 = tern_session_create(model, NULL, &err);
    cr_assert_eq(tern_session_restore(s2, pc_node_snapshot(nd), &err), 0, "%s", err.msg);
    cr_expect_eq(tern_session_pos(s2), 32);
    tern_snapshot *a = tern_session_snapshot(sess, &err), *b = tern_session_snapshot(s2, &err);
    cr_assert(a && b);
    cr_expect_eq(tern_snapshot_bytes(a), tern_snapshot_bytes(b));
    tern_snapshot_free(a);
    tern_snapshot_free(b);
    tern_session_destroy(s2);
    /* a crash: the files stay without an index, and the next cache deletes them */
    pcache_insert(c, t, 40, snap(), 0);
    cr_assert_eq(pcache_persist(c, &err), 5, "%s", err.msg);
    pcache_destroy(c);
    char index[4096];
    snprintf(index, sizeof index, "ls %s/*-index >/dev/null && rm %s/*-index", dir, dir);
    cr_assert_eq(system(index), 0);
    c = adopted_cache(dir, 100 * S, &n);
    cr_expect_eq(n, 0);
    cr_expect_eq(files_in(dir), 0);
    cr_expect_null(pcache_lookup(c, t, 64));
    pcache_destroy(c);
    rmdir(dir);
}

/* Adopted into a smaller disk budget: the tier evicts down to it, leaves
 * first, and the tree stays sound. */
Test(pcache, adoption_keeps_within_a_smaller_budget) {
    char *dir;
    int32_t t[64];
    seq(t, 64, 100);
    pcache *c = chain_in_ram(t, &dir);
    tern_error err;
    size_t whole = stats(c).bytes;
    cr_assert_eq(pcache_persist(c, &err), 4, "%s", err.msg);
    pcache_destroy(c);
    size_t room = whole / 2;
    int n;
    c = adopted_cache(dir, room, &n);
    cr_assert(n >= 1 && n < 4, "%d adopted", n);
    cr_assert_eq(pcache_check(c), 0);
    cr_expect_leq(stats(c).disk_bytes, room);
    cr_expect_eq(files_in(dir), n);
    cr_expect_eq(found(c, t, 64), 8 * n, "the chain's first checkpoints stay");
    pcache_destroy(c);
    rmdir(dir);
}

/* ---- a damaged or hostile index ---------------------------------------- */

/* chain_in_ram's chain persisted (serials 1 to 4 at depths 8 to 32, each
 * after the first continuing its base's rows); file[k]: its files' paths,
 * bytes[k] their sizes. */
static void persisted_chain(const int32_t *t, char **dir, char file[5][512], uint64_t bytes[5]) {
    tern_error err;
    pcache *c = chain_in_ram((int32_t *)t, dir);
    cr_assert_eq(pcache_persist(c, &err), 4, "%s", err.msg);
    pcache_destroy(c);
    char id[65];
    cr_assert_eq(tern_model_identity(model, id, &err), 0);
    for (int k = 1; k <= 4; k++) {
        struct stat st;
        snprintf(file[k], 512, "%s/%s-%016llx-%d.snap", *dir, id, (unsigned long long)pcdisk_hash(t, 8 * k), k);
        cr_assert_eq(stat(file[k], &st), 0, "%s", file[k]);
        bytes[k] = (uint64_t)st.st_size;
    }
}

static pcdisk_entry chain_entry(const int32_t *t, const uint64_t *bytes, int k) {
    return (pcdisk_entry){{pcdisk_hash(t, 8 * k), (uint64_t)k}, (uint64_t)(k - 1), bytes[k], k > 1, 8 * k, t};
}

static void write_index(const char *dir, const pcdisk_entry *e, int n) {
    tern_error err;
    pcdisk *d = pcdisk_open(dir, model, &err);
    cr_assert_not_null(d, "%s", err.msg);
    cr_assert_eq(pcdisk_write_index(d, e, n, &err), 0, "%s", err.msg);
    pcdisk_close(d);
}

/* A new cache adopts what dir holds (*adopted: the count, -1 on an error);
 * then, as the scheduler does, the deepest checkpoint starting t[0..64)
 * is read back until one reads: restored, it must hold as many tokens as
 * its depth. The depth restored (0: none); the directory is removed. */
static int adopt_and_restore(const char *dir, const int32_t *t, int *adopted) {
    tern_error err;
    pcache *c = adopted_cache(dir, 100 * S, adopted);
    cr_assert_eq(pcache_check(c), 0);
    cr_assert_eq(files_in(dir), stats(c).disk_checkpoints, "the files the index does not name are deleted");
    pc_node *nd;
    while ((nd = pcache_lookup(c, t, 64)) && pcache_load(c, nd, &err)) cr_assert_eq(pcache_check(c), 0);
    int depth = 0;
    if (nd) {
        tern_session *s2 = tern_session_create(model, NULL, &err);
        cr_assert_eq(tern_session_restore(s2, pc_node_snapshot(nd), &err), 0, "%s", err.msg);
        depth = pc_node_depth(nd);
        cr_expect_eq(tern_session_pos(s2), depth, "a checkpoint restored for tokens it was not taken after");
        tern_session_destroy(s2);
    }
    pcache_destroy(c);
    cr_assert_eq(files_in(dir), 0);
    rmdir(dir);
    return depth;
}

/* Entries the index names wrongly are skipped, with those continuing
 * their rows: never restored for other tokens, and the tree stays sound. */
Test(pcache, an_index_naming_checkpoints_wrongly_is_not_trusted) {
    int32_t t[64], u[64];
    seq(t, 64, 100);
    seq(u, 64, 300);
    enum { SELF_BASE, LATER_BASE, TWICE, OTHER_TOKENS, OTHER_SIZE, MISSING, SWAPPED_BASE, SHORTER, CASES };
    static const int want_adopted[CASES] = {1, 1, 4, 1, 2, 1, 3, 4}, want_depth[CASES] = {8, 8, 32, 8, 16, 8, 8, 24};
    for (int k = 0; k < CASES; k++) {
        char *dir, file[5][512];
        uint64_t bytes[5];
        persisted_chain(t, &dir, file, bytes);
        pcdisk_entry e[6];
        int n = 4;
        for (int i = 0; i < 4; i++) e[i] = chain_entry(t, bytes, i + 1);
        if (k == SELF_BASE) e[1].base = 2;
        if (k == LATER_BASE) e[1].base = 3;
        if (k == TWICE) {
            /* the same checkpoint twice, and a copy of a file under another serial */
            char cmd[1200];
            snprintf(cmd, sizeof cmd, "cp %s %.*s-1.snap", file[2], (int)(strlen(file[2]) - strlen("-2.snap")), file[2]);
            cr_assert_eq(system(cmd), 0);
            memmove(e + 2, e, 4 * sizeof *e);
            e[1] = e[0];
            e[2].key.serial = 1;
            n = 6;
        }
        if (k == OTHER_TOKENS) e[1].tokens = u;
        if (k == OTHER_SIZE) e[2].bytes++;
        if (k == MISSING) unlink(file[2]);
        if (k == SWAPPED_BASE) {
            /* 3 said to continue 1's rows (it continues 2's), and 2 to hold 3 */
            pcdisk_entry two = e[1];
            e[1] = e[2];
            e[2] = two;
            e[1].base = 1;
            e[2].base = 3;
        }
        if (k == SHORTER) {
            /* the leaf's file renamed for the first 28 of its 32 tokens */
            char to[600];
            snprintf(to, sizeof to, "%.*s-%016llx-4.snap", (int)(strlen(file[4]) - 24), file[4],
                     (unsigned long long)pcdisk_hash(t, 28));
            cr_assert_eq(rename(file[4], to), 0);
            e[3].n = 28;
            e[3].key.hash = pcdisk_hash(t, 28);
        }
        write_index(dir, e, n);
        int adopted, depth = adopt_and_restore(dir, t, &adopted);
        cr_expect_eq(adopted, want_adopted[k], "case %d", k);
        cr_expect_eq(depth, want_depth[k], "case %d", k);
    }
}

/* An index whose bytes are damaged, or sound by its checksum but
 * malformed (counts, token counts), or another model's: an error, and
 * the files are deleted. */
Test(pcache, a_damaged_or_malformed_index_deletes_the_files) {
    int32_t t[64];
    seq(t, 64, 100);
    enum { CUT, FLIPPED, MORE_COUNTED, FEWER_COUNTED, HUGE_TOKENS, NO_TOKENS, OTHER_MODEL, OLDER, CASES };
    for (int k = 0; k < CASES; k++) {
        char *dir, file[5][512], index[600];
        uint64_t bytes[5];
        persisted_chain(t, &dir, file, bytes);
        snprintf(index, sizeof index, "%.*s-index", (int)(strlen(file[1]) - 24), file[1]);
        FILE *f = fopen(index, "rb");
        cr_assert_not_null(f, "%s", index);
        static uint8_t buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f) - 64;
        fclose(f);
        uint32_t v;
        if (k == CUT) len -= 10;
        if (k == FLIPPED) buf[200] ^= 1;
        if (k == MORE_COUNTED || k == FEWER_COUNTED) {
            memcpy(&v, buf + 12, 4);
            v += k == MORE_COUNTED ? 1000 : -1;
            memcpy(buf + 12, &v, 4);
        }
        if (k == HUGE_TOKENS || k == NO_TOKENS) {
            v = k == HUGE_TOKENS ? 0x7fffffffu : 0;
            memcpy(buf + 80 + 36, &v, 4);   /* the first entry's token count */
        }
        if (k == OTHER_MODEL) buf[20] ^= 1;
        if (k == OLDER) buf[8] = 0;
        if (k != CUT && k != FLIPPED) {
            tern_error err;
            cr_assert_eq(tern_sha256_buf(buf, len, (char *)buf + len, &err), 0);
        } else {
            memmove(buf + len, buf + len + (k == CUT ? 10 : 0), 64);
        }
        f = fopen(index, "wb");
        cr_assert_eq(fwrite(buf, 1, len + 64, f), len + 64);
        fclose(f);
        int adopted, depth = adopt_and_restore(dir, t, &adopted);
        cr_expect_eq(adopted, -1, "case %d", k);
        cr_expect_eq(depth, 0, "case %d", k);
    }
}
