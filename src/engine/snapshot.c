/* Snapshots: a session's exact state at a position, in the backend's
 * memory (session.c keeps the session; backend.h says what a backend
 * copies), and their files: the bytes a snapshot holds itself behind a
 * header that names the model and a SHA-256 of them. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "util/err.h"
#include "util/sha256.h"

struct tern_snapshot {
    const tern_model *m;
    const tern_backend *be;   /* whose memory data is (moved: host memory from be->host_alloc) */
    int from, pos, mtp_pos, mtp_base, has_hidden, kv_bits, moved;
    size_t n_bytes;
    /* the KV rows [from, pos) and the recurrent state (backend.h), then the
     * MTP head's KV rows and the hidden state */
    uint8_t *data;
    tern_snapshot *base;      /* holds the rows before from (NULL: from is 0) */
    atomic_int refs;          /* the owner's, and one per snapshot taken after this one */
};

/* The bytes after the layer state: the MTP head's K and V rows, then the
 * hidden state. */
static size_t tail_bytes(const tern_config *c, size_t row_bytes, int mtp_pos) {
    return 2 * (size_t)mtp_pos * row_bytes + (size_t)c->hidden * sizeof(float);
}

/* After the layers, the host state at off: the MTP head's K and V rows,
 * then the hidden state, from where the last step left it. */
static int save_tail(const tern_session *s, uint8_t *buf, size_t off, tern_error *err) {
    const tern_backend *be = s->be;
    size_t kv = (size_t)s->mtp_pos * s->kvf.row_bytes, h = (size_t)s->m->cfg.hidden * sizeof(float);
    if (kv && (be->copy(buf + off, s->mtp_kv.k, kv, TERN_COPY_TO_BE, err) ||
               be->copy(buf + off + kv, s->mtp_kv.v, kv, TERN_COPY_TO_BE, err)))
        return -1;
    off += 2 * kv;
    if (s->hidden_dev) return be->copy(buf + off, s->hidden_dev, h, TERN_COPY_IN_BE, err);
    return be->copy(buf + off, s->hidden, h, TERN_COPY_TO_BE, err);
}

static int load_tail(tern_session *s, const uint8_t *buf, size_t off, int mtp_pos, tern_error *err) {
    const tern_backend *be = s->be;
    size_t kv = (size_t)mtp_pos * s->kvf.row_bytes, h = (size_t)s->m->cfg.hidden * sizeof(float);
    if (kv && (be->copy(s->mtp_kv.k, buf + off, kv, TERN_COPY_TO_HOST, err) ||
               be->copy(s->mtp_kv.v, buf + off + kv, kv, TERN_COPY_TO_HOST, err)))
        return -1;
    return be->copy(s->hidden, buf + off + 2 * kv, h, TERN_COPY_TO_HOST, err);
}

/* snap keeps base (its rows before snap->from) until it is freed: a
 * reference count, which changes under a const pointer by design. */
static void hold(tern_snapshot *snap, const tern_snapshot *base) {
    snap->base = (tern_snapshot *)base;
    if (base) atomic_fetch_add(&snap->base->refs, 1);
}

tern_snapshot *tern_session_snapshot_after(const tern_session *s, const tern_snapshot *base, tern_error *err) {
    if (base && (base->m != s->m || base->be != s->be || base->kv_bits != s->kvf.bits)) {
        tern_fail(err, "snapshot_after: the base snapshot belongs to another model or KV precision");
        return NULL;
    }
    if (base && base->pos > s->pos) {
        tern_fail(err, "snapshot_after: the base snapshot is at position %d, past the session's %d", base->pos, s->pos);
        return NULL;
    }
    const tern_backend *be = s->be;
    tern_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) {
        tern_fail(err, "out of memory");
        return NULL;
    }
    snap->m = s->m;
    snap->be = be;
    snap->from = base ? base->pos : 0;
    snap->pos = s->pos;
    snap->mtp_pos = s->mtp_pos;
    snap->mtp_base = s->mtp_base;
    snap->has_hidden = s->has_hidden;
    snap->kv_bits = s->kvf.bits;
    atomic_init(&snap->refs, 1);
    size_t layers = tern_state_bytes(&s->m->cfg, s->kvf.row_bytes, snap->from, s->pos, 1);
    snap->n_bytes = layers + tail_bytes(&s->m->cfg, s->kvf.row_bytes, s->mtp_pos);
    if (!(snap->data = be->snap_alloc(snap->n_bytes ? snap->n_bytes : 1, err))) {
        free(snap);
        return NULL;
    }
    /* the copies may only be enqueued: one wait for them all */
    if (be->save(s, snap->data, snap->from, s->pos, 1, err) || save_tail(s, snap->data, layers, err) ||
        be->wait(err)) {
        tern_err_prefix(err, "the session state could not be copied");
        tern_snapshot_free(snap);
        return NULL;
    }
    hold(snap, base);
    return snap;
}

tern_snapshot *tern_session_snapshot(const tern_session *s, tern_error *err) {
    return tern_session_snapshot_after(s, NULL, err);
}

/* The layer state of snap: its own rows and recurrent state, then the rows
 * of each base before it (each chain link holds distinct positions). */
static int load_chain(tern_session *s, const tern_snapshot *snap, tern_error *err) {
    const tern_backend *be = s->be;
    if (be->load(s, snap->data, snap->from, snap->pos, 1, err)) return -1;
    for (const tern_snapshot *b = snap->base; b; b = b->base)
        if (be->load(s, b->data, b->from, b->pos, 0, err)) return -1;
    return 0;
}

int tern_session_restore(tern_session *s, const tern_snapshot *snap, tern_error *err) {
    if (snap->m != s->m || snap->be != s->be) return tern_fail(err, "snapshot belongs to another model");
    if (snap->kv_bits != s->kvf.bits)
        return tern_fail(err, "snapshot has %d-bit KV rows, the session %d-bit", snap->kv_bits, s->kvf.bits);
    if (tern_session_reserve_rows(s, snap->pos, err) ||
        tern_kv_reserve_host(&s->mtp_kv, &s->mtp_cap, snap->mtp_pos, s->max_ctx, s->kvf.row_bytes, err))
        return -1;
    const tern_backend *be = s->be;
    size_t layers = tern_state_bytes(&s->m->cfg, s->kvf.row_bytes, snap->from, snap->pos, 1);
    if (load_chain(s, snap, err) || load_tail(s, snap->data, layers, snap->mtp_pos, err) || be->wait(err)) {
        s->broken = 1;
        tern_err_prefix(err, "the snapshot could not be copied into the session");
        return -1;
    }
    s->pos = snap->pos;
    s->broken = 0;
    s->mtp_pos = snap->mtp_pos;
    s->mtp_base = snap->mtp_base;
    s->has_hidden = snap->has_hidden;
    s->hidden_dev = NULL;
    return 0;
}

#define FILL_ROWS 1024   /* positions zeroed by one load */

int tern_session_fill(tern_session *s, int n, tern_error *err) {
    if (s->broken)
        return tern_fail(err, "the session failed mid-step earlier; restore a snapshot or start a new session");
    if (s->pos != 0) return tern_fail(err, "fill: the session holds %d tokens; fill needs a new one", s->pos);
    if (n < 0 || n >= s->max_ctx)
        return tern_fail(err, "fill: %d positions, the session's max context being %d (one left for a token)", n,
                         s->max_ctx);
    if (n == 0) return 0;
    if (tern_session_reserve_rows(s, n, err)) return -1;
    const tern_backend *be = s->be;
    size_t bytes = tern_state_bytes(&s->m->cfg, s->kvf.row_bytes, 0, n < FILL_ROWS ? n : FILL_ROWS, 0);
    uint8_t *zero = calloc(bytes ? bytes : 1, 1), *buf = be->snap_alloc(bytes ? bytes : 1, err);
    int rc = zero && buf ? be->copy(buf, zero, bytes, TERN_COPY_TO_BE, err) : tern_fail(err, "out of memory");
    for (int from = 0; rc == 0 && from < n; from += FILL_ROWS)
        rc = be->load(s, buf, from, from + FILL_ROWS < n ? from + FILL_ROWS : n, 0, err);
    if (rc == 0) rc = be->wait(err);
    if (buf) be->snap_free(buf);
    free(zero);
    if (rc != 0) {
        s->broken = 1;
        return -1;
    }
    s->pos = n;
    s->has_hidden = 0;
    return 0;
}

static void free_data(const tern_snapshot *snap) {
    if (snap->moved) snap->be->host_free(snap->data);
    else snap->be->snap_free(snap->data);
}

void tern_snapshot_free(tern_snapshot *snap) {
    while (snap && atomic_fetch_sub(&snap->refs, 1) == 1) {
        tern_snapshot *base = snap->base;
        free_data(snap);
        free(snap);
        snap = base;   /* (a loop: a long chain's release needs no recursion) */
    }
}

size_t tern_snapshot_bytes(const tern_snapshot *snap) { return snap->n_bytes; }

int tern_snapshot_pos(const tern_snapshot *snap) { return snap->pos; }

int tern_snapshot_on_host(const tern_snapshot *snap) { return snap->moved || !snap->be->host_alloc; }

int tern_snapshot_to_host(tern_snapshot *snap, tern_error *err) {
    const tern_backend *be = snap->be;
    if (tern_snapshot_on_host(snap)) return 0;
    uint8_t *h = be->host_alloc(snap->n_bytes ? snap->n_bytes : 1, err);
    if (!h) return -1;
    if (be->copy(h, snap->data, snap->n_bytes, TERN_COPY_TO_HOST, err)) {
        be->host_free(h);
        return -1;
    }
    be->snap_free(snap->data);
    snap->data = h;
    snap->moved = 1;
    return 0;
}


/* ---- files -----------------------------------------------------------------
 * A header (this struct, host byte order: the files are a local cache),
 * the bytes the snapshot holds itself, then the SHA-256 of the header and
 * those bytes (hex). Written and read in pieces through a host buffer, so
 * a device snapshot needs no second copy of itself in host memory. */

#define SNAP_MAGIC "TERNSNP1"
#define SNAP_PIECE ((size_t)16 << 20)

typedef struct snap_header {
    char magic[8];
    char identity[64];           /* tern_model_identity, hex */
    int32_t kv_bits, from, pos, mtp_pos, has_hidden, mtp_base;   /* mtp_base: 0 in files before it */
    uint64_t n_bytes;
} snap_header;

/* The bytes a snapshot of these positions holds itself, or 0 when the
 * values cannot be a snapshot's. */
static size_t expected_bytes(const tern_model *m, const snap_header *h, tern_error *err) {
    const tern_config *c = &m->cfg;
    tern_kv_format f;
    int ctx = tern_model_max_context(m);
    if (h->from < 0 || h->pos < h->from || h->pos > ctx || h->mtp_pos < 0 || h->mtp_pos > ctx || h->mtp_base < 0 ||
        h->mtp_base > ctx ||
        (h->has_hidden != 0 && h->has_hidden != 1) || tern_kv_format_init(&f, c, h->kv_bits, err))
        return 0;
    return tern_state_bytes(c, f.row_bytes, h->from, h->pos, 1) + tail_bytes(c, f.row_bytes, h->mtp_pos);
}

int tern_snapshot_write(const tern_snapshot *snap, FILE *f, tern_error *err) {
    snap_header h = {.kv_bits = snap->kv_bits, .from = snap->from, .pos = snap->pos, .mtp_pos = snap->mtp_pos,
                     .has_hidden = snap->has_hidden, .mtp_base = snap->mtp_base, .n_bytes = snap->n_bytes};
    memcpy(h.magic, SNAP_MAGIC, 8);
    char id[65], hex[65];
    tern_sha256 sh;
    if (tern_model_identity(snap->m, id, err) || tern_sha256_init(&sh, err)) return -1;
    memcpy(h.identity, id, 64);
    uint8_t *buf = malloc(SNAP_PIECE);
    if (!buf) {
        tern_sha256_discard(&sh);
        return tern_fail(err, "out of memory");
    }
    int rc = fwrite(&h, sizeof h, 1, f) == 1 ? 0 : -1, copied = 1;
    tern_sha256_update(&sh, &h, sizeof h);
    for (size_t off = 0; rc == 0 && off < snap->n_bytes; off += SNAP_PIECE) {
        size_t n = snap->n_bytes - off < SNAP_PIECE ? snap->n_bytes - off : SNAP_PIECE;
        if (snap->be->copy(buf, snap->data + off, n, TERN_COPY_TO_HOST, err)) rc = -1, copied = 0;
        else if (fwrite(buf, 1, n, f) != n) rc = -1;
        else tern_sha256_update(&sh, buf, n);
    }
    tern_sha256_final(&sh, hex);
    free(buf);
    if (rc == 0 && fwrite(hex, 1, 64, f) != 64) rc = -1;
    if (rc && copied) tern_fail(err, "snapshot file: write failed");
    return rc;
}

/* The header read and checked against m and base. */
static int read_header(const tern_model *m, FILE *f, const tern_snapshot *base, snap_header *h, tern_sha256 *sh,
                       tern_error *err) {
    char id[65];
    if (fread(h, sizeof *h, 1, f) != 1) return tern_fail(err, "snapshot file: shorter than its header");
    tern_sha256_update(sh, h, sizeof *h);
    if (memcmp(h->magic, SNAP_MAGIC, 8)) return tern_fail(err, "snapshot file: not a tern snapshot (magic)");
    if (tern_model_identity(m, id, err)) return -1;
    if (memcmp(h->identity, id, 64))
        return tern_fail(err, "snapshot file: taken with another model, engine or model files");
    size_t want = expected_bytes(m, h, err);
    if (!want || want != h->n_bytes)
        return tern_fail(err, "snapshot file: positions %d..%d, KV bits %d and %llu bytes do not agree", h->from,
                         h->pos, h->kv_bits, (unsigned long long)h->n_bytes);
    if (h->from == 0 ? base != NULL : !base || base->m != m || base->pos != h->from || base->kv_bits != h->kv_bits)
        return tern_fail(err, "snapshot file: it continues a snapshot at position %d, and the base given is %s",
                         h->from, base ? "another" : "none");
    return 0;
}

tern_snapshot *tern_snapshot_read(const tern_model *m, FILE *f, const tern_snapshot *base, tern_error *err) {
    tern_sha256 sh;
    snap_header h;
    if (tern_sha256_init(&sh, err)) return NULL;
    tern_snapshot *snap = NULL;
    uint8_t *buf = NULL;
    if (read_header(m, f, base, &h, &sh, err)) goto fail;
    if (!(snap = calloc(1, sizeof *snap)) || !(buf = malloc(SNAP_PIECE))) {
        tern_fail(err, "out of memory");
        goto fail;
    }
    snap->m = m;
    snap->be = m->gpu ? &tern_gpu_backend : &tern_cpu_backend;
    snap->from = h.from;
    snap->pos = h.pos;
    snap->mtp_pos = h.mtp_pos;
    snap->mtp_base = h.mtp_base;
    snap->has_hidden = h.has_hidden;
    snap->kv_bits = h.kv_bits;
    snap->n_bytes = h.n_bytes;
    atomic_init(&snap->refs, 1);
    if (!(snap->data = snap->be->snap_alloc(h.n_bytes ? h.n_bytes : 1, err))) goto fail;
    for (size_t off = 0; off < h.n_bytes; off += SNAP_PIECE) {
        size_t n = h.n_bytes - off < SNAP_PIECE ? h.n_bytes - off : SNAP_PIECE;
        if (fread(buf, 1, n, f) != n) {
            tern_fail(err, "snapshot file: shorter than its %llu bytes", (unsigned long long)h.n_bytes);
            goto fail;
        }
        tern_sha256_update(&sh, buf, n);
        if (snap->be->copy(snap->data + off, buf, n, TERN_COPY_TO_BE, err)) goto fail;
    }
    char want[65], got[64];
    tern_sha256_final(&sh, want);
    if (fread(got, 1, 64, f) != 64 || memcmp(got, want, 64)) {
        tern_fail(err, "snapshot file: its SHA-256 does not match its bytes");
        goto fail_freed;
    }
    free(buf);
    hold(snap, base);
    return snap;
fail:
    tern_sha256_discard(&sh);
fail_freed:
    free(buf);
    if (snap && snap->data) snap->be->snap_free(snap->data);
    free(snap);
    return NULL;
}
