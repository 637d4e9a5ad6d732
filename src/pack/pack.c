/* tern pack: source checkpoint -> packed directory (docs/FORMAT.md).
 *
 * Order of events, each step durable before the next:
 *   lock DST.install.lock -> read source, plan -> DST.partial (new, or
 *   resumed after re-verifying what pack-state.json lists) -> disk-space
 *   check -> each output file written, fsynced, hashed and recorded ->
 *   manifest.json, receipt -> rename DST.partial to DST -> fsync parent.
 * A kill at any point leaves either no DST or a complete one. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "model/packed.h"
#include "model/weights.h"
#include "pack/install.h"
#include "pack/plan.h"
#include "pack/source.h"
#include "pack/verify.h"
#include "synth/synth.h"
#include "util/err.h"
#include "util/file.h"
#include "util/pool.h"
#include "util/progress.h"
#include "util/sha256.h"

#define STATE_NAME "pack-state.json"
#define STATE_SCHEMA 1
#define DEFAULT_RESERVE (256ull << 20)
#define CHUNK_VALUES (4u << 20)          /* fp32 values per resident chunk: 16 MB of scratch */
#define BATCH_BYTES (128ull << 20)       /* expert blobs produced per batch */

typedef struct pk_job {
    const tern_pack_params *prm;
    const tern_synth_params *synth;      /* tern synth: the source is drawn, not read */
    pk_options opt;
    char *dst, *dst_real, *partial, *lock_path;
    tern_install_lock lock;
    pk_source src;
    int have_src;
    tern_config cfg;
    pk_plan plan;
    int have_plan;
    char plan_sha[65];
    int pdir;                            /* fd of DST.partial */
    tern_pool *pool;
    tern_progress *bar;
    tern_pk_file *done;                  /* completed files, in plan order */
    int n_done;
    tern_error *err;
} pk_job;

/* ---- options and paths -------------------------------------------------- */

static int class_bits(pk_job *j, int q, int given, const char *param) {
    int all = j->prm->bits;
    int b = given ? given : all ? all : q == TERN_QC_EXPERTS ? 4 : 8;
    if (b != 4 && b != 8 && b != 16)
        return tern_fail(j->err, "%s must be 4, 8 or 16 (got %d)", param, b);
    j->opt.bits[q] = b;
    j->opt.explicit_bits[q] = given ? given : all;
    return 0;
}

static int job_options(pk_job *j) {
    const tern_pack_params *p = j->prm;
    if ((!p->src && !j->synth) || !p->dst) return tern_fail(j->err, "pack: source and destination are required");
    if (p->bits && p->bits != 4 && p->bits != 8) return tern_fail(j->err, "bits must be 4 or 8 (got %d)", p->bits);
    j->opt.group = p->group ? p->group : 64;
    if (j->opt.group != 32 && j->opt.group != 64 && j->opt.group != 128)
        return tern_fail(j->err, "group must be 32, 64 or 128 (got %d)", p->group);
    return class_bits(j, TERN_QC_EMBED, p->embed_bits, "embed_bits") ||
           class_bits(j, TERN_QC_ATTN, p->attn_bits, "attn_bits") ||
           class_bits(j, TERN_QC_ROUTER, p->router_bits, "router_bits") ||
           class_bits(j, TERN_QC_SHARED, p->shared_bits, "shared_bits") ||
           class_bits(j, TERN_QC_EXPERTS, p->expert_bits, "expert_bits") ||
           class_bits(j, TERN_QC_HEAD, p->head_bits, "head_bits") ||
           class_bits(j, TERN_QC_MTP_FC, p->mtp_fc_bits, "mtp_fc_bits")
               ? -1 : 0;
}

static int job_paths(pk_job *j) {
    j->dst = strdup(j->prm->dst);
    if (!j->dst) return tern_fail(j->err, "out of memory");
    size_t n = strlen(j->dst);
    while (n > 1 && j->dst[n - 1] == '/') j->dst[--n] = '\0';
    if (asprintf(&j->partial, "%s.partial", j->dst) < 0) j->partial = NULL;
    if (asprintf(&j->lock_path, "%s.install.lock", j->dst) < 0) j->lock_path = NULL;
    if (!j->partial || !j->lock_path) return tern_fail(j->err, "out of memory");
    j->dst_real = tern_future_realpath(j->dst, j->err);
    if (!j->dst_real) return -1;
    int exists;
    if (tern_refuse_symlink(j->dst, &exists, j->err) || tern_refuse_symlink(j->partial, NULL, j->err))
        return -1;
    if (exists) return tern_fail(j->err, "%s: already exists (tern pack never overwrites a model)", j->dst);
    return 0;
}

/* DST may have appeared between the first look and taking the lock. */
static int job_paths_recheck(pk_job *j) {
    int exists;
    if (tern_refuse_symlink(j->dst, &exists, j->err) != 0) return -1;
    if (exists) return tern_fail(j->err, "%s: already exists (tern pack never overwrites a model)", j->dst);
    return 0;
}

/* ---- the plan and its fingerprint --------------------------------------- */

static void hash_stat(tern_sha256 *h, const char *path) {
    struct stat st;
    char line[4400];
    if (stat(path, &st) != 0) memset(&st, 0, sizeof st);
    int n = snprintf(line, sizeof line, "%s %lld %lld.%09ld\n", path, (long long)st.st_size,
                     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    tern_sha256_update(h, line, (size_t)n);
}

/* Names what the output depends on: the planned manifest (tensors,
 * encodings, offsets), the output files, and the source files as they are
 * now. A resume under another fingerprint would mix two packs. */
static int plan_fingerprint(pk_job *j) {
    char *text = tern_manifest_dumps(&j->plan.man, j->err);
    tern_sha256 h;
    if (!text || tern_sha256_init(&h, j->err) != 0) { free(text); return -1; }
    tern_sha256_update(&h, TERN_TOOL_VERSION, strlen(TERN_TOOL_VERSION));
    tern_sha256_update(&h, text, strlen(text));
    free(text);
    if (j->src.synth) tern_sha256_update(&h, j->src.synth->config_json, strlen(j->src.synth->config_json));
    for (int i = 0; i < j->plan.n_out; i++) {
        char line[1200];
        int n = snprintf(line, sizeof line, "%s %llu\n", j->plan.out_paths[i], (unsigned long long)j->plan.out_sizes[i]);
        tern_sha256_update(&h, line, (size_t)n);
    }
    for (int i = 0; i < j->src.ts.n_files; i++) hash_stat(&h, j->src.ts.files[i].path);
    for (int i = j->plan.first_sidecar; i < j->plan.n_out; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", j->src.dir, j->plan.out_paths[i]);
        hash_stat(&h, path);
    }
    tern_sha256_final(&h, j->plan_sha);
    return 0;
}

/* The loader's own checks on the planned model: its resident tensors,
 * bound to the config over zero pages that are never written, must have
 * every tensor and every shape `tern run` asks for, before a byte is
 * written. */
static int check_binding(pk_job *j) {
    size_t size = j->plan.resident_size ? (size_t)j->plan.resident_size : 1;
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return tern_fail(j->err, "out of address space for %zu bytes", size);
    tern_tensor_set ts;
    memset(&ts, 0, sizeof ts);
    if (tern_packed_open_mem(&ts, &j->plan.man, base, size, j->err) != 0) return -1;
    /* a misfit names the source file, not the resident.bin still to come */
    for (int i = 0; i < ts.n_owned; i++) ts.owned[i].file = j->plan.items[i].src.w->file;
    tern_weights w;
    int rc = tern_weights_bind(&w, &j->cfg, &ts, j->err);
    if (rc == 0) tern_weights_free(&w, &j->cfg);
    tern_tensors_close(&ts);
    return rc;
}

static int job_plan(pk_job *j) {
    if ((j->synth ? pk_source_synth(&j->src, j->synth, j->err) : pk_source_open(&j->src, j->prm->src, j->err)) != 0)
        return -1;
    j->have_src = 1;
    if (j->src.synth) j->cfg = j->src.synth->cfg;
    else if (tern_config_load(&j->cfg, j->src.dir, j->err) != 0) return -1;
    if (pk_plan_build(&j->plan, &j->src, &j->cfg, &j->opt, j->err) != 0) return -1;
    j->have_plan = 1;
    return check_binding(j) || plan_fingerprint(j) ? -1 : 0;
}

/* ---- pack-state.json ---------------------------------------------------- */

static int save_state(pk_job *j) {
    json_t *files = json_array();
    for (int i = 0; i < j->n_done; i++)
        json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", j->done[i].path, "size",
                                               (json_int_t)j->done[i].size, "sha256", j->done[i].sha256));
    json_t *root = json_pack("{s:i, s:s, s:o}", "schema", STATE_SCHEMA, "plan_sha256", j->plan_sha, "files", files);
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!text) return tern_fail(j->err, "%s/%s: cannot encode", j->partial, STATE_NAME);
    char label[4200];
    snprintf(label, sizeof label, "%s/%s", j->partial, STATE_NAME);
    int rc = tern_atomic_write(j->pdir, STATE_NAME, text, strlen(text), label, j->err);
    free(text);
    return rc;
}

static int record_done(pk_job *j, const char *path, uint64_t size, const char *sha) {
    tern_pk_file *d = realloc(j->done, (size_t)(j->n_done + 1) * sizeof *d);
    if (!d) return tern_fail(j->err, "out of memory");
    j->done = d;
    d[j->n_done].path = strdup(path);
    if (!d[j->n_done].path) return tern_fail(j->err, "out of memory");
    d[j->n_done].size = size;
    memcpy(d[j->n_done].sha256, sha, 65);
    j->n_done++;
    return 0;
}

/* Keeps the longest prefix of the recorded files that is still on disk,
 * with the planned path and size and the recorded hash. */
static int verify_state_files(pk_job *j, json_t *files) {
    for (size_t i = 0; i < json_array_size(files) && (int)i < j->plan.n_out; i++) {
        json_t *f = json_array_get(files, i);
        const char *path = json_string_value(json_object_get(f, "path"));
        const char *sha = json_string_value(json_object_get(f, "sha256"));
        tern_pk_file want = {.path = (char *)path, .size = j->plan.out_sizes[i]};
        if (!path || strcmp(path, j->plan.out_paths[i]) != 0 || !tern_sha256_hex_ok(sha) ||
            json_integer_value(json_object_get(f, "size")) != (json_int_t)want.size)
            break;
        memcpy(want.sha256, sha, 65);
        tern_error e;
        if (tern_check_file(j->pdir, j->partial, &want, NULL, NULL, &e) != 0) {
            if (j->prm->progress) fprintf(j->prm->progress, "resume: redoing from %s (%s)\n", path, e.msg);
            break;
        }
        if (record_done(j, path, want.size, sha) != 0) return -1;
    }
    return 0;
}

static int load_state(pk_job *j) {
    int fd = tern_open_in(j->pdir, STATE_NAME, NULL, NULL);
    json_t *root = fd >= 0 ? tern_json_load_fd(fd, STATE_NAME, JSON_REJECT_DUPLICATES, TERN_JSON_LARGE_MAX, NULL) : NULL;
    if (fd >= 0) close(fd);
    if (!root) return 0;   /* killed before the first file completed: start over */
    int rc = 0;
    const char *sha = json_string_value(json_object_get(root, "plan_sha256"));
    if (json_integer_value(json_object_get(root, "schema")) != STATE_SCHEMA || !sha || strcmp(sha, j->plan_sha) != 0)
        rc = tern_fail(j->err, "%s: written by a different pack (other source, source files changed, or other "
                       "options); remove it or pack again with the same ones", j->partial);
    else
        rc = verify_state_files(j, json_object_get(root, "files"));
    json_decref(root);
    return rc;
}

static int open_partial(pk_job *j) {
    int exists;
    if (tern_refuse_symlink(j->partial, &exists, j->err) != 0) return -1;
    if (exists && !j->prm->resume)
        return tern_fail(j->err, "%s: exists (an earlier pack was interrupted): set resume to continue it, or "
                         "remove it", j->partial);
    j->pdir = tern_open_dir(AT_FDCWD, j->partial, 1, j->partial, j->err);
    if (j->pdir < 0) return -1;
    if (exists && load_state(j) != 0) return -1;
    if (j->n_done && j->prm->progress)
        fprintf(j->prm->progress, "resume: %d of %d files verified, continuing with %s\n", j->n_done, j->plan.n_out,
                j->n_done < j->plan.n_out ? j->plan.out_paths[j->n_done] : "the manifest");
    int ex = tern_open_dir(j->pdir, "experts", 1, "experts", j->err);
    if (ex < 0) return -1;
    close(ex);
    return 0;
}

static int check_space(pk_job *j) {
    uint64_t need = j->prm->min_free_bytes ? j->prm->min_free_bytes : DEFAULT_RESERVE;
    for (int i = j->n_done; i < j->plan.n_out; i++) need += j->plan.out_sizes[i];
    need += 2 * (4ull << 20);   /* manifest and receipt, generously */
    return tern_check_free_space(j->partial, need, j->err);
}

/* ---- writing a file: a sink that hashes what it writes ------------------ */

/* Producing bytes (quantizing) and consuming them (write + SHA-256) run
 * at once: sink_write copies into a ring that a writer thread drains, so
 * the pool quantizes the next chunk while the last one is hashed and
 * written. The copy costs ~1% of a pack; the overlap saves the write and
 * hash time that was serial before (a 2 GB synthetic bf16 source on this
 * one-core VM: 9.9 s -> 8.9 s to disk). */
#define RING_BYTES (64u << 20)
#define WRITE_SPAN (8u << 20)

typedef struct {
    pk_job *j;
    int fd;
    const char *path;
    char label[4200];
    uint64_t pos;                        /* bytes accepted from the producer */
    uint64_t written;                    /* bytes the writer has written */
    tern_sha256 sha;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t more, room;
    uint8_t *ring;
    size_t start, fill;                  /* the consumer reads [start, start + fill) mod RING_BYTES */
    int closing, failed;
    tern_error werr;                     /* the writer's first error */
} sink;

static void *sink_main(void *arg) {
    sink *k = arg;
    pthread_mutex_lock(&k->mu);
    for (;;) {
        while (k->fill == 0 && !k->closing) pthread_cond_wait(&k->more, &k->mu);
        if (k->fill == 0) break;
        size_t span = k->fill;
        if (span > RING_BYTES - k->start) span = RING_BYTES - k->start;
        if (span > WRITE_SPAN) span = WRITE_SPAN;
        const uint8_t *p = k->ring + k->start;
        int failed = k->failed;
        pthread_mutex_unlock(&k->mu);
        if (!failed && tern_write_all(k->fd, p, span, k->label, &k->werr) == 0) {
            /* start writeback now: the fsync at the end then waits for the
             * tail only instead of the whole file */
            sync_file_range(k->fd, (off_t)k->written, (off_t)span, SYNC_FILE_RANGE_WRITE);
            k->written += span;
            tern_sha256_update(&k->sha, p, span);
            tern_progress_add(k->j->bar, span);
        } else {
            failed = 1;
        }
        pthread_mutex_lock(&k->mu);
        k->failed = failed;
        k->start = (k->start + span) % RING_BYTES;
        k->fill -= span;
        pthread_cond_signal(&k->room);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

static int sink_open(sink *k, pk_job *j, const char *path) {
    memset(k, 0, sizeof *k);
    k->j = j;
    k->path = path;
    snprintf(k->label, sizeof k->label, "%s/%s", j->partial, path);
    k->ring = malloc(RING_BYTES);
    if (!k->ring) return tern_fail(j->err, "out of memory");
    k->fd = tern_create_in(j->pdir, path, j->err);
    if (k->fd < 0 || tern_sha256_init(&k->sha, j->err) != 0) {
        if (k->fd >= 0) close(k->fd);
        free(k->ring);
        return -1;
    }
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->more, NULL);
    pthread_cond_init(&k->room, NULL);
    if (pthread_create(&k->th, NULL, sink_main, k) != 0) {
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->more);
        pthread_cond_destroy(&k->room);
        tern_sha256_discard(&k->sha);
        close(k->fd);
        free(k->ring);
        return tern_fail(j->err, "%s: cannot start the writer thread", k->label);
    }
    return 0;
}

static int sink_write(sink *k, const void *data, size_t n) {
    const uint8_t *p = data;
    while (n > 0) {
        pthread_mutex_lock(&k->mu);
        while (k->fill == RING_BYTES && !k->failed) pthread_cond_wait(&k->room, &k->mu);
        int failed = k->failed;
        size_t w = (k->start + k->fill) % RING_BYTES, span = RING_BYTES - k->fill;
        pthread_mutex_unlock(&k->mu);
        if (failed) return -1;   /* the writer's error is reported by sink_close */
        if (span > RING_BYTES - w) span = RING_BYTES - w;
        if (span > n) span = n;
        memcpy(k->ring + w, p, span);   /* outside [start, start + fill): the writer does not read it */
        pthread_mutex_lock(&k->mu);
        k->fill += span;
        pthread_cond_signal(&k->more);
        pthread_mutex_unlock(&k->mu);
        p += span;
        n -= span;
        k->pos += span;
    }
    return 0;
}

static int sink_pad(sink *k, uint64_t to) {
    static const uint8_t zeros[4096];
    while (k->pos < to) {
        size_t n = to - k->pos < sizeof zeros ? (size_t)(to - k->pos) : sizeof zeros;
        if (sink_write(k, zeros, n) != 0) return -1;
    }
    return 0;
}

/* Drains the ring, stops the writer, fsyncs and closes the file. hex gets
 * the SHA-256 of everything written. `ok` 0: the producer failed; the file
 * is closed without a digest. */
static int sink_close(sink *k, int ok, char hex[65]) {
    pthread_mutex_lock(&k->mu);
    k->closing = 1;
    pthread_cond_signal(&k->more);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->th, NULL);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->more);
    pthread_cond_destroy(&k->room);
    free(k->ring);
    int rc = ok ? 0 : -1;
    /* a producer stopped by the writer's failure has no message of its own */
    if (k->failed) rc = tern_fail(k->j->err, "%s", k->werr.msg);
    if (rc == 0) rc = tern_fsync_fd(k->fd, k->label, k->j->err);
    if (close(k->fd) != 0 && rc == 0) rc = tern_fail(k->j->err, "%s: close failed: %s", k->label, strerror(errno));
    if (rc == 0) tern_sha256_final(&k->sha, hex);
    else tern_sha256_discard(&k->sha);
    return rc;
}

/* ---- resident.bin -------------------------------------------------------- */

typedef struct {
    const pk_item *it;
    const tern_pk_tensor *t;
    int64_t r0;                          /* first row of the chunk */
    uint8_t *data;                       /* the chunk's rows */
    uint16_t *scales, *biases;           /* the whole tensor's */
    float *scratch;
} chunk_ctx;

static void encode_range(void *arg, int64_t b, int64_t e) {
    chunk_ctx *c = arg;
    int64_t cols = c->it->src.cols, ng = c->t->group ? cols / c->t->group : 0;
    uint64_t rb = pk_row_bytes(c->t, cols);
    int64_t r = c->r0 + b;
    pk_encode_rows(c->it, c->t, r, e - b, c->data + (size_t)b * rb, c->scales ? c->scales + r * ng : NULL,
                   c->biases ? c->biases + r * ng : NULL, c->scratch ? c->scratch + b * cols : NULL);
}

static int write_tensor(sink *k, const pk_item *it, const tern_pk_tensor *t) {
    int64_t rows = it->src.rows, cols = it->src.cols;
    int64_t step = (int64_t)CHUNK_VALUES / cols > 0 ? (int64_t)CHUNK_VALUES / cols : 1;
    if (step > rows) step = rows;
    uint64_t rb = pk_row_bytes(t, cols);
    chunk_ctx c = {.it = it, .t = t};
    c.data = malloc((size_t)(rb * (uint64_t)step));
    c.scratch = it->mode == PK_MODE_COPY || it->mode == PK_MODE_MLX ? NULL : malloc((size_t)(step * cols) * sizeof(float));
    if (t->scales.size) {
        c.scales = malloc((size_t)t->scales.size);
        c.biases = malloc((size_t)t->biases.size);
    }
    int rc = !c.data || (!c.scratch && it->mode != PK_MODE_COPY && it->mode != PK_MODE_MLX) ||
                     (t->scales.size && (!c.scales || !c.biases))
                 ? tern_fail(k->j->err, "%s: out of memory", t->name)
                 : sink_pad(k, t->data.off);
    for (int64_t r = 0; rc == 0 && r < rows; r += step) {
        int64_t n = rows - r < step ? rows - r : step;
        c.r0 = r;
        tern_pool_for(k->j->pool, n, encode_range, &c);
        rc = sink_write(k, c.data, (size_t)(rb * (uint64_t)n));
    }
    if (rc == 0 && t->scales.size)
        rc = sink_pad(k, t->scales.off) || sink_write(k, c.scales, (size_t)t->scales.size) ||
             sink_pad(k, t->biases.off) || sink_write(k, c.biases, (size_t)t->biases.size);
    free(c.data);
    free(c.scratch);
    free(c.scales);
    free(c.biases);
    return rc;
}

static int write_resident(sink *k) {
    const pk_plan *p = &k->j->plan;
    for (int i = 0; i < p->man.n_tensors; i++)
        if (write_tensor(k, &p->items[i], &p->man.tensors[i]) != 0) return -1;
    return 0;
}

/* ---- expert files ------------------------------------------------------- */

typedef struct {
    const pk_plan *p;
    int file, e0;
    uint8_t *buf;                        /* the batch's blobs */
    int failed;
} batch_ctx;

static void encode_experts(void *arg, int64_t b, int64_t e) {
    batch_ctx *c = arg;
    const tern_manifest *m = &c->p->man;
    float *scratch = malloc(pk_blob_scratch_floats(c->p) * sizeof(float));
    if (!scratch) { c->failed = 1; return; }
    for (int64_t i = b; i < e; i++) pk_encode_blob(c->p, c->file, c->e0 + (int)i, c->buf + (size_t)i * m->stride, scratch);
    free(scratch);
}

static int write_experts(sink *k, int file) {
    const pk_plan *p = &k->j->plan;
    int E = p->man.n_experts;
    int batch = (int)(BATCH_BYTES / p->man.stride);
    batch = batch < 1 ? 1 : batch > E ? E : batch;
    batch_ctx c = {.p = p, .file = file, .buf = malloc((size_t)batch * p->man.stride)};
    if (!c.buf) return tern_fail(k->j->err, "%s: out of memory for %d expert blobs", k->path, batch);
    int rc = 0;
    for (int e0 = 0; rc == 0 && e0 < E; e0 += batch) {
        int n = E - e0 < batch ? E - e0 : batch;
        c.e0 = e0;
        memset(c.buf, 0, (size_t)n * p->man.stride);   /* the padding of every blob is zero */
        tern_pool_for(k->j->pool, n, encode_experts, &c);
        rc = c.failed ? tern_fail(k->j->err, "%s: out of memory", k->path)
                      : sink_write(k, c.buf, (size_t)n * p->man.stride);
    }
    free(c.buf);
    return rc;
}

/* ---- sidecars ----------------------------------------------------------- */

static int copy_sidecar(sink *k) {
    if (k->j->src.synth) return sink_write(k, k->j->src.synth->config_json, strlen(k->j->src.synth->config_json));
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", k->j->src.dir, k->path);
    /* the source may be a Hugging Face cache snapshot, whose files are
     * symlinks into blobs/: follow them on the reading side */
    int fd = tern_file_open(path, 0, k->j->err);
    if (fd < 0) return -1;
    char buf[1 << 16];
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) rc = tern_fail(k->j->err, "%s: read failed: %s", path, strerror(errno));
        if (n <= 0 || rc != 0 || (rc = sink_write(k, buf, (size_t)n)) != 0) break;
    }
    close(fd);
    return rc;
}

/* ---- the file loop ------------------------------------------------------ */

static int produce(sink *k, int i) {
    const pk_plan *p = &k->j->plan;
    if (i == 0) return write_resident(k);
    if (i < p->first_sidecar) return write_experts(k, i - 1);
    return copy_sidecar(k);
}

static int write_file(pk_job *j, int i) {
    const pk_plan *p = &j->plan;
    sink k;
    char hex[65];
    if (sink_open(&k, j, p->out_paths[i]) != 0) return -1;
    int ok = produce(&k, i) == 0;
    if (ok && k.pos != p->out_sizes[i]) {
        tern_fail(j->err, "%s: wrote %llu bytes but planned %llu (did the source change?)", k.label,
                  (unsigned long long)k.pos, (unsigned long long)p->out_sizes[i]);
        ok = 0;
    }
    if (sink_close(&k, ok, hex) != 0) return -1;
    return record_done(j, k.path, k.pos, hex) || save_state(j) ? -1 : 0;
}

static int write_all_files(pk_job *j) {
    uint64_t done = 0;
    for (int i = 0; i < j->n_done; i++) done += j->done[i].size;
    j->bar = tern_progress_create(j->prm->progress, j->synth ? "synth" : "pack", j->plan.out_bytes);
    if (!j->bar) return tern_fail(j->err, "out of memory");
    tern_progress_start_at(j->bar, done);
    for (int i = j->n_done; i < j->plan.n_out; i++)
        if (write_file(j, i) != 0) return -1;
    tern_progress_finish(j->bar);
    return 0;
}

/* ---- finishing ---------------------------------------------------------- */

static int fsync_parent(pk_job *j) {
    char *copy = strdup(j->dst_real);
    if (!copy) return tern_fail(j->err, "out of memory");
    char *slash = strrchr(copy, '/');
    if (slash == copy) slash[1] = '\0';
    else *slash = '\0';
    int fd = open(copy, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = fd < 0 ? tern_fail(j->err, "%s: cannot open: %s", copy, strerror(errno)) : tern_fsync_fd(fd, copy, j->err);
    if (fd >= 0) close(fd);
    free(copy);
    return rc;
}

/* Never replaces an existing DST (RENAME_NOREPLACE where the kernel has it;
 * DST's absence was checked under the lock otherwise). */
static int rename_into_place(pk_job *j) {
    if (renameat2(AT_FDCWD, j->partial, AT_FDCWD, j->dst, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS)
        return tern_fail(j->err, "%s -> %s: rename failed: %s", j->partial, j->dst, strerror(errno));
    if (rename(j->partial, j->dst) != 0)
        return tern_fail(j->err, "%s -> %s: rename failed: %s", j->partial, j->dst, strerror(errno));
    return 0;
}

static int finish(pk_job *j) {
    tern_manifest *m = &j->plan.man;
    m->files = j->done;
    m->n_files = j->n_done;
    char *text = tern_manifest_dumps(m, j->err);
    m->files = NULL;
    m->n_files = 0;
    if (!text) return -1;
    size_t n = strlen(text);
    char *full = realloc(text, n + 2);
    if (!full) { free(text); return tern_fail(j->err, "out of memory"); }
    full[n] = '\n';
    full[n + 1] = '\0';
    char sha[65];
    int rc = tern_sha256_buf(full, n + 1, sha, j->err);
    if (rc == 0) rc = tern_atomic_write(j->pdir, "manifest.json", full, n + 1, "manifest.json", j->err);
    free(full);
    m->files = j->done;
    m->n_files = j->n_done;
    if (rc == 0) rc = tern_receipt_write(j->pdir, m, j->dst_real, sha, n + 1, j->err);
    m->files = NULL;
    m->n_files = 0;
    if (rc != 0) return -1;
    if (unlinkat(j->pdir, STATE_NAME, 0) != 0 && errno != ENOENT)
        return tern_fail(j->err, "%s/%s: cannot remove: %s", j->partial, STATE_NAME, strerror(errno));
    unlinkat(j->pdir, STATE_NAME ".tmp", 0);   /* left by a kill during a state write, if any */
    if (tern_fsync_fd(j->pdir, j->partial, j->err) != 0) return -1;
    return rename_into_place(j) || fsync_parent(j) ? -1 : 0;
}

static void summary(const pk_job *j) {
    FILE *f = j->prm->progress;
    if (!f) return;
    const tern_manifest *m = &j->plan.man;
    fprintf(f, "%s %s -> %s: %d resident tensors (%.1f MB), %d expert files x %d experts x %.2f MB%s%s\n",
            j->synth ? "synthesized" : "packed", j->src.dir, j->dst, m->n_tensors, j->plan.resident_size / 1e6, j->plan.n_expert_files, m->n_experts,
            m->stride / 1e6, j->src.mlx ? ", MLX bits copied" : "", j->src.n_dropped ? ", vision/audio dropped" : "");
}

static void job_free(pk_job *j) {
    if (j->pdir >= 0) close(j->pdir);
    tern_progress_destroy(j->bar);
    tern_pool_destroy(j->pool);
    for (int i = 0; i < j->n_done; i++) free(j->done[i].path);
    free(j->done);
    if (j->have_plan) pk_plan_free(&j->plan);
    if (j->have_src) pk_source_close(&j->src);
    tern_lock_release(&j->lock);
    free(j->dst);
    free(j->dst_real);
    free(j->partial);
    free(j->lock_path);
}

static int pack_run(const tern_pack_params *p, const tern_synth_params *sp, tern_error *err) {
    pk_job j = {.prm = p, .synth = sp, .err = err, .pdir = -1, .lock = {.fd = -1}};
    int rc = job_options(&j) || job_paths(&j) || tern_lock_acquire(&j.lock, j.lock_path, err) ? -1 : 0;
    if (rc == 0) rc = job_paths_recheck(&j);
    if (rc == 0) rc = job_plan(&j) || open_partial(&j) || check_space(&j) ? -1 : 0;
    if (rc == 0) {
        j.pool = tern_pool_create(p->n_threads);
        rc = j.pool ? write_all_files(&j) : tern_fail(err, "cannot start worker threads");
    }
    if (rc == 0) rc = finish(&j);
    if (rc == 0) summary(&j);
    job_free(&j);
    return rc;
}

int tern_pack(const tern_pack_params *p, tern_error *err) { return pack_run(p, NULL, err); }

int tern_pack_check(const tern_pack_params *p, tern_error *err) {
    pk_job j = {.prm = p, .err = err};
    return job_options(&j);
}

int tern_synth(const tern_synth_params *p, tern_error *err) {
    if (p->bits && p->bits != 4 && p->bits != 8) return tern_fail(err, "bits must be 4 or 8 (got %d)", p->bits);
    if (p->expert_bits && p->expert_bits != 4 && p->expert_bits != 8)
        return tern_fail(err, "expert_bits must be 4 or 8 (got %d)", p->expert_bits);
    tern_pack_params pp = {.dst = p->dst, .bits = p->bits ? p->bits : 4, .expert_bits = p->expert_bits, .resume = p->resume,
                           .n_threads = p->n_threads, .progress = p->progress, .min_free_bytes = p->min_free_bytes};
    return pack_run(&pp, p, err);
}
