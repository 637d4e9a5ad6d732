/* Sequence state: KV caches of the full-attention layers (grown on demand),
 * conv + recurrent state of the Gated DeltaNet layers (fixed size), the MTP
 * head's own KV cache, and snapshots of all of it. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/gpu.h"
#include "util/err.h"

static int grow(tern_kv *kv, int *cap, int needed, int max_ctx, size_t row_bytes, int gpu, tern_error *err) {
    if (needed <= *cap) return 0;
    if (needed > max_ctx)
        return tern_fail(err, "context full: %d tokens exceed the session's max context of %d", needed, max_ctx);
    int n = *cap < 256 ? 256 : *cap;
    while (n < needed) n = n > max_ctx / 2 ? max_ctx : n * 2;
    if (n > max_ctx) n = max_ctx;
    if (gpu) {
        if (tern_gpu_grow(&kv->k, (size_t)*cap * row_bytes, (size_t)n * row_bytes, err) ||
            tern_gpu_grow(&kv->v, (size_t)*cap * row_bytes, (size_t)n * row_bytes, err))
            return -1;
        *cap = n;
        return 0;
    }
    uint8_t *k = realloc(kv->k, (size_t)n * row_bytes);
    if (k) kv->k = k;
    uint8_t *v = k ? realloc(kv->v, (size_t)n * row_bytes) : NULL;
    if (v) kv->v = v;
    if (!k || !v) return tern_fail(err, "out of memory growing the KV cache to %d positions", n);
    *cap = n;
    return 0;
}

int tern_session_reserve(tern_session *s, int needed, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    if (needed <= s->cap) return 0;
    int cap = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_ATTN) continue;
        cap = s->cap;
        if (grow(&s->kv[l], &cap, needed, s->max_ctx, s->kvf.row_bytes, s->gpu != NULL, err)) return -1;
    }
    if (cap) s->cap = cap;
    else if (needed > s->max_ctx)
        return tern_fail(err, "context full: %d tokens exceed the session's max context of %d", needed, s->max_ctx);
    return 0;
}

int tern_session_reserve_mtp(tern_session *s, int needed, tern_error *err) {
    return grow(&s->mtp_kv, &s->mtp_cap, needed, s->max_ctx, s->kvf.row_bytes, 0, err);
}

static int init_kv_format(tern_kv_format *f, const tern_config *c, int bits, tern_error *err) {
    f->bits = bits ? bits : 32;
    if (f->bits == 32) {
        f->row_bytes = (size_t)c->n_kv_heads * c->head_dim * sizeof(float);
        return 0;
    }
    if (tern_kvq_init(&f->q, c->n_kv_heads, c->head_dim, f->bits) != 0)
        return tern_fail(err, "kv_bits %d is not supported (32, 16, 8 or 4)", bits);
    f->row_bytes = f->q.row_bytes;
    return 0;
}

tern_session *tern_session_create(tern_model *m, const tern_session_params *p, tern_error *err) {
    const tern_config *c = &m->cfg;
    tern_session *s = calloc(1, sizeof *s);
    if (!s) { tern_fail(err, "out of memory"); return NULL; }
    s->m = m;
    s->gdn_mode = p ? p->gdn_mode : TERN_GDN_CHUNKED;
    s->max_ctx = p && p->max_context > 0 ? p->max_context : c->max_pos;
    if (s->gdn_mode != TERN_GDN_CHUNKED && s->gdn_mode != TERN_GDN_RECURRENT) {
        tern_fail(err, "unknown gdn_mode %d", s->gdn_mode);
        free(s);
        return NULL;
    }
    /* the GPU keeps no fp32 rows: its default is 16-bit */
    int kv_bits = p ? p->kv_bits : 0;
    if (m->gpu && kv_bits == 0) kv_bits = 16;
    if (init_kv_format(&s->kvf, c, kv_bits, err) != 0) {
        free(s);
        return NULL;
    }
    s->kv = calloc((size_t)c->n_layers, sizeof *s->kv);
    s->gdn = calloc((size_t)c->n_layers, sizeof *s->gdn);
    s->hidden = calloc((size_t)c->hidden, sizeof(float));
    int ok = s->kv && s->gdn && s->hidden;
    if (ok && m->gpu) {
        if (tern_gpu_session_init(s, err) == 0) return s;
        tern_session_destroy(s);
        return NULL;
    }
    for (int l = 0; ok && l < c->n_layers; l++) {
        if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
        s->gdn[l].conv = calloc(tern_cfg_gdn_conv_floats(c) + 1, sizeof(float));
        s->gdn[l].S = calloc(tern_cfg_gdn_state_floats(c), sizeof(float));
        ok = s->gdn[l].conv && s->gdn[l].S;
    }
    if (!ok) {
        tern_session_destroy(s);
        tern_fail(err, "out of memory creating a session");
        return NULL;
    }
    return s;
}

void tern_session_destroy(tern_session *s) {
    if (!s) return;
    int n = s->m->cfg.n_layers;
    if (s->m->gpu) tern_gpu_session_free(s);   /* device kv and gdn state */
    for (int l = 0; l < n; l++) {
        if (s->kv) { free(s->kv[l].k); free(s->kv[l].v); }
        if (s->gdn) { free(s->gdn[l].conv); free(s->gdn[l].S); }
    }
    free(s->kv);
    free(s->gdn);
    free(s->mtp_kv.k);
    free(s->mtp_kv.v);
    free(s->hidden);
    free(s);
}

int tern_session_pos(const tern_session *s) { return s->pos; }

int tern_session_reset(tern_session *s, tern_error *err) {
    const tern_config *c = &s->m->cfg;
    if (tern_session_sample_in_flight(s) > 0) return tern_fail(err, "a step is still in flight");
    if (s->gpu) {
        if (tern_gpu_session_reset(s, err)) return -1;
    } else {
        for (int l = 0; l < c->n_layers; l++) {
            if (c->layer_kind[l] != TERN_LAYER_GDN) continue;
            memset(s->gdn[l].conv, 0, tern_cfg_gdn_conv_floats(c) * sizeof(float));
            memset(s->gdn[l].S, 0, tern_cfg_gdn_state_floats(c) * sizeof(float));
        }
    }
    memset(s->hidden, 0, (size_t)c->hidden * sizeof(float));
    s->pos = s->mtp_pos = 0;
    s->has_hidden = 0;
    s->hidden_dev = NULL;
    s->broken = 0;
    return 0;
}

/* Long prompts run in pieces so scratch memory stays bounded; a multiple of
 * the GDN chunk keeps the chunk boundaries where one long call puts them.
 * A GPU session takes the whole run: the GPU engine cuts it into pieces of
 * its own size (tern_load_params.debug.piece), bounded by its preallocated buffers. */
#define EVAL_PIECE 512

/* What every evaluation checks first. */
static int can_eval(const tern_session *s, int n, tern_error *err) {
    if (n <= 0) return tern_fail(err, "no tokens to evaluate");
    if (s->broken)
        return tern_fail(err, "the session failed mid-step earlier; restore a snapshot or start a new session");
    if (s->pos + n > s->max_ctx)
        return tern_fail(err, "context full: %d + %d tokens exceed the session's max context of %d", s->pos, n,
                         s->max_ctx);
    return 0;
}

/* ---- the session's engine: the CPU's (forward.c) or the GPU's (gpu.h) --- */

int tern_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                 float *hidden_out, tern_error *err) {
    if (T <= 0) return tern_fail(err, "no tokens to evaluate");
    if (tern_check_tokens(&s->m->cfg, tokens, T, err) || tern_session_reserve(s, s->pos + T, err)) return -1;
    if (s->gpu) {
        if (hidden_out) return tern_fail(err, "GPU: per-token hidden states are not read back");
        return tern_gpu_forward(s, tokens, T, logits, all_logits, err);
    }
    return tern_cpu_forward(s, tokens, T, logits, all_logits, hidden_out, err);
}

int tern_mtp_forward(tern_session *s, const float *hidden, const int32_t *next, int n, float *logits,
                     tern_error *err) {
    if (!s->m->w.has_mtp) return tern_fail(err, "%s: the model has no MTP weights (mtp.*)", s->m->dir);
    if (s->gpu) return tern_fail(err, "the MTP head does not run on the GPU yet");
    return tern_cpu_mtp_forward(s, hidden, next, n, logits, err);
}

int tern_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                        tern_error *err) {
    if (!s->gpu) return tern_fail(err, "sampling in the step needs a GPU session");
    if (tern_check_tokens(&s->m->cfg, &token, 1, err) || tern_session_reserve(s, s->pos + 1, err)) return -1;
    return tern_gpu_forward_sample(s, token, rule, u, next, err);
}

int tern_forward_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    if (!s->gpu) return tern_fail(err, "sampling in the step needs a GPU session");
    if (token != -1 && tern_check_tokens(&s->m->cfg, &token, 1, err)) return -1;   /* (the KV caches: tern_gpu_sample_launch) */
    return tern_gpu_sample_launch(s, token, rule, u, err);
}

int tern_session_eval_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                             tern_error *err) {
    return can_eval(s, 1, err) ? -1 : tern_forward_sample(s, token, rule, u, next, err);
}

int tern_session_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    return can_eval(s, 1, err) ? -1 : tern_forward_sample_launch(s, token, rule, u, err);
}

int tern_session_sample_wait(tern_session *s, int32_t *next, tern_error *err) {
    if (!s->gpu) return tern_fail(err, "sampling in the step needs a GPU session");
    return tern_gpu_sample_wait(s, next, err);
}

int tern_session_sample_in_flight(const tern_session *s) { return s->gpu ? tern_gpu_sample_in_flight(s) : 0; }

int tern_session_eval(tern_session *s, const int32_t *tokens, int n, float *logits, int all_logits,
                      tern_error *err) {
    if (can_eval(s, n, err)) return -1;
    size_t V = (size_t)s->m->cfg.vocab;
    int P = s->gpu ? n : EVAL_PIECE;
    for (int done = 0; done < n; done += P) {
        int T = n - done < P ? n - done : P;
        int last = done + T == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * V;
        else if (logits && last) out = logits;
        if (tern_forward(s, tokens + done, T, out, all_logits, NULL, err)) return -1;
    }
    return 0;
}

int tern_session_mtp_draft(tern_session *s, int32_t next_token, float *logits, tern_error *err) {
    if (!s->has_hidden) return tern_fail(err, "MTP draft needs at least one evaluated token");
    return tern_mtp_forward(s, s->hidden, &next_token, 1, logits, err);
}

/* ---- snapshots ---------------------------------------------------------- */

struct tern_snapshot {
    const tern_model *m;
    int pos, mtp_pos, has_hidden, kv_bits;
    int on_dev;      /* a GPU session's: data is device memory */
    size_t n_bytes;
    uint8_t *data;   /* attention KV rows, GDN conv + state, MTP KV, hidden, in layer order */
};

/* n bytes from src to dst, each in host or device memory. */
static int move_bytes(void *dst, int dst_dev, const void *src, int src_dev, size_t n) {
    if (!n) return 0;
    if (dst_dev && src_dev) return tern_gpu_copy_d2d(dst, src, n, NULL);
    if (dst_dev) return tern_gpu_copy((void *)src, dst, n, 0, NULL);
    if (src_dev) return tern_gpu_copy(dst, (void *)src, n, 1, NULL);
    memcpy(dst, src, n);
    return 0;
}

/* Copies every piece of state between the session and a flat buffer (on
 * the device when buf_dev), in a fixed order; `to_buf` picks the
 * direction. With buf NULL it only counts the bytes. */
static size_t walk_state(tern_session *s, uint8_t *buf, int buf_dev, int pos, int mtp_pos, int to_buf, int *failed) {
    const tern_config *c = &s->m->cfg;
    size_t off = 0, row = s->kvf.row_bytes;
    int dev = s->gpu != NULL;   /* kv and gdn state live on the GPU */
#define MOVE_IN(ptr, bytes, on_dev)                                                                  \
    do {                                                                                             \
        size_t n_ = (bytes);  /* an empty cache may have no buffer at all */                         \
        if (buf && n_ && (to_buf ? move_bytes(buf + off, buf_dev, (ptr), (on_dev), n_)               \
                                 : move_bytes((ptr), (on_dev), buf + off, buf_dev, n_)))             \
            *failed = 1;                                                                             \
        off += n_;                                                                                   \
    } while (0)
#define MOVE(ptr, bytes) MOVE_IN(ptr, bytes, dev)
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] == TERN_LAYER_ATTN) {
            MOVE(s->kv[l].k, (size_t)pos * row);
            MOVE(s->kv[l].v, (size_t)pos * row);
        } else {
            MOVE(s->gdn[l].conv, tern_cfg_gdn_conv_floats(c) * sizeof(float));
            MOVE(s->gdn[l].S, tern_cfg_gdn_state_floats(c) * sizeof(float));
        }
    }
    MOVE_IN(s->mtp_kv.k, (size_t)mtp_pos * row, 0);
    MOVE_IN(s->mtp_kv.v, (size_t)mtp_pos * row, 0);
    /* the hidden state: a GPU session's last step left it on the device */
    if (to_buf && s->hidden_dev) MOVE_IN((float *)s->hidden_dev, (size_t)c->hidden * sizeof(float), 1);
    else MOVE_IN(s->hidden, (size_t)c->hidden * sizeof(float), 0);
#undef MOVE
#undef MOVE_IN
    return off;
}

tern_snapshot *tern_session_snapshot(const tern_session *s, tern_error *err) {
    tern_session *ms = (tern_session *)s;   /* walk_state only reads when to_buf */
    tern_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) { tern_fail(err, "out of memory"); return NULL; }
    snap->m = s->m;
    snap->pos = s->pos;
    snap->mtp_pos = s->mtp_pos;
    snap->has_hidden = s->has_hidden;
    snap->kv_bits = s->kvf.bits;
    snap->on_dev = s->gpu != NULL;
    int failed = 0;
    snap->n_bytes = walk_state(ms, NULL, 0, s->pos, s->mtp_pos, 1, &failed);
    size_t n = snap->n_bytes ? snap->n_bytes : 1;
    snap->data = snap->on_dev ? tern_gpu_alloc(n, err) : malloc(n);
    if (!snap->data) {
        if (!snap->on_dev) tern_fail(err, "out of memory for a %zu-byte snapshot", snap->n_bytes);
        free(snap);
        return NULL;
    }
    walk_state(ms, snap->data, snap->on_dev, s->pos, s->mtp_pos, 1, &failed);
    if (snap->on_dev && !failed && tern_gpu_wait(NULL)) failed = 1;
    if (failed) {
        tern_fail(err, "GPU: the session state could not be copied");
        tern_snapshot_free(snap);
        return NULL;
    }
    return snap;
}

int tern_session_restore(tern_session *s, const tern_snapshot *snap, tern_error *err) {
    if (snap->m != s->m) return tern_fail(err, "snapshot belongs to another model");
    if (snap->kv_bits != s->kvf.bits)
        return tern_fail(err, "snapshot has %d-bit KV rows, the session %d-bit", snap->kv_bits, s->kvf.bits);
    if (tern_session_reserve(s, snap->pos, err) || tern_session_reserve_mtp(s, snap->mtp_pos, err)) return -1;
    int failed = 0;
    walk_state(s, snap->data, snap->on_dev, snap->pos, snap->mtp_pos, 0, &failed);
    if (snap->on_dev && !failed && tern_gpu_wait(NULL)) failed = 1;
    if (failed) {
        s->broken = 1;
        return tern_fail(err, "GPU: the snapshot could not be copied to the device");
    }
    s->pos = snap->pos;
    s->broken = 0;
    s->mtp_pos = snap->mtp_pos;
    s->has_hidden = snap->has_hidden;
    s->hidden_dev = NULL;
    return 0;
}

void tern_snapshot_free(tern_snapshot *snap) {
    if (!snap) return;
    if (snap->on_dev) tern_gpu_free(snap->data);
    else free(snap->data);
    free(snap);
}

size_t tern_snapshot_bytes(const tern_snapshot *snap) { return snap->n_bytes; }

void tern_session_set_route_observer(tern_session *s, tern_route_fn fn, void *ud) {
    s->route_fn = fn;
    s->route_ud = ud;
}
