/* A session: the checks every call makes, the state no backend owns
 * (position, the MTP head's KV rows, the last hidden state) and snapshots;
 * the sequence state itself and the steps are the session's backend's
 * (engine/backend.h), chosen when the session is created. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "util/err.h"

/* The KV rows for `needed` positions, within the session's context. */
int tern_session_reserve_rows(tern_session *s, int needed, tern_error *err) {
    if (needed > s->max_ctx)
        return tern_fail(err, "context full: %d tokens exceed the session's max context of %d", needed, s->max_ctx);
    return s->be->reserve(s, needed, err);
}

int tern_kv_format_init(tern_kv_format *f, const tern_config *c, int bits, tern_error *err) {
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

static const tern_backend *backend_of(const tern_model *m) { return m->gpu ? &tern_gpu_backend : &tern_cpu_backend; }

int tern_model_batches(const tern_model *m) { return backend_of(m)->server_batches; }

tern_session *tern_session_create(tern_model *m, const tern_session_params *p, tern_error *err) {
    const tern_config *c = &m->cfg;
    if (p && p->max_context > 0 && tern_model_check_context(m, p->max_context, err) != 0) return NULL;
    tern_session *s = calloc(1, sizeof *s);
    if (!s) { tern_fail(err, "out of memory"); return NULL; }
    s->m = m;
    s->be = backend_of(m);
    s->gdn_mode = p ? p->gdn_mode : TERN_GDN_CHUNKED;
    s->max_ctx = p && p->max_context > 0 ? p->max_context : tern_model_max_context(m);
    if (s->gdn_mode != TERN_GDN_CHUNKED && s->gdn_mode != TERN_GDN_RECURRENT) {
        tern_fail(err, "unknown gdn_mode %d", s->gdn_mode);
        free(s);
        return NULL;
    }
    int kv_bits = p && p->kv_bits ? p->kv_bits : s->be->kv_bits;
    if (tern_kv_format_init(&s->kvf, c, kv_bits, err) != 0) {
        free(s);
        return NULL;
    }
    if (!(s->hidden = calloc((size_t)c->hidden, sizeof(float)))) {
        tern_fail(err, "out of memory creating a session");
        free(s);
        return NULL;
    }
    if (s->be->create(s, err) != 0) {
        tern_session_destroy(s);
        return NULL;
    }
    return s;
}

void tern_session_destroy(tern_session *s) {
    if (!s) return;
    s->be->destroy(s);
    free(s->mtp_kv.k);
    free(s->mtp_kv.v);
    free(s->hidden);
    free(s);
}

int tern_session_pos(const tern_session *s) { return s->pos; }

int tern_session_reset(tern_session *s, tern_error *err) {
    if (tern_session_sample_in_flight(s) > 0) return tern_fail(err, "a step is still in flight");
    if (s->be->reset(s, err)) return -1;
    memset(s->hidden, 0, (size_t)s->m->cfg.hidden * sizeof(float));
    s->pos = s->mtp_pos = s->mtp_base = 0;
    s->has_hidden = 0;
    s->hidden_dev = NULL;
    s->broken = 0;
    return 0;
}

/* K and V rows of every attention layer for `rows` positions. */
static uint64_t rows_bytes(const tern_session *s, int rows) {
    return tern_state_bytes(&s->m->cfg, s->kvf.row_bytes, 0, rows, 0);
}

/* The rows one store holds once it has n positions (cap held now). */
static int cap_at(const tern_session *s, int cap, int n) {
    if (n <= cap) return cap;
    tern_error e;
    int c = tern_kv_next_cap(cap, n > s->max_ctx ? s->max_ctx : n, s->max_ctx, &e);
    return c < 0 ? s->max_ctx : c;
}

uint64_t tern_session_kv_bytes(const tern_session *s) {
    uint64_t head = (uint64_t)s->mtp_cap * s->kvf.row_bytes * 2;
    return rows_bytes(s, s->be->kv_cap(s)) + head;
}

uint64_t tern_session_kv_bytes_at(const tern_session *s, int n, int released) {
    int cap = released ? 0 : s->be->kv_cap(s), head = released ? 0 : s->mtp_cap;
    if (s->mtp_track) head = cap_at(s, head, n);
    return rows_bytes(s, cap_at(s, cap, n)) + (uint64_t)head * s->kvf.row_bytes * 2;
}

int tern_session_release(tern_session *s, tern_error *err) {
    if (tern_session_reset(s, err)) return -1;
    s->be->release_rows(s);
    free(s->mtp_kv.k);
    free(s->mtp_kv.v);
    s->mtp_kv = (tern_kv){0};
    s->mtp_cap = 0;
    return 0;
}

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

/* ---- the session's backend ------------------------------------------------ */

int tern_forward(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                 float *hidden_out, tern_error *err) {
    if (T <= 0) return tern_fail(err, "no tokens to evaluate");
    if (tern_check_tokens(&s->m->cfg, tokens, T, err) || tern_session_reserve_rows(s, s->pos + T, err)) return -1;
    return s->be->forward(s, tokens, T, logits, all_logits, hidden_out, err);
}

int tern_mtp_forward(tern_session *s, const float *hidden, const int32_t *next, int n, float *logits,
                     float *hidden_out, tern_error *err) {
    if (!s->m->w.has_mtp) return tern_fail(err, "%s: the model has no MTP weights (mtp.*)", s->m->dir);
    return s->be->mtp_forward(s, hidden, next, n, logits, hidden_out, err);
}

int tern_session_sample_ok(const tern_session *s, const tern_gpu_rule *rule) { return s->be->sample_ok(s, rule); }

/* The backend grows the KV rows for a step that samples: one in flight
 * must end before they move. */
int tern_forward_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                        tern_error *err) {
    if (tern_check_tokens(&s->m->cfg, &token, 1, err)) return -1;
    return s->be->forward_sample(s, token, rule, u, next, err);
}

int tern_forward_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    if (token != -1 && tern_check_tokens(&s->m->cfg, &token, 1, err)) return -1;
    return s->be->sample_launch(s, token, rule, u, err);
}

int tern_session_eval_sample(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, int32_t *next,
                             tern_error *err) {
    return can_eval(s, 1, err) ? -1 : tern_forward_sample(s, token, rule, u, next, err);
}

int tern_session_sample_launch(tern_session *s, int32_t token, const tern_gpu_rule *rule, double u, tern_error *err) {
    return can_eval(s, 1, err) ? -1 : tern_forward_sample_launch(s, token, rule, u, err);
}

int tern_session_sample_wait(tern_session *s, int32_t *next, tern_error *err) {
    return s->be->sample_wait(s, next, err);
}

int tern_session_sample_in_flight(const tern_session *s) { return s->be->sample_in_flight(s); }

int tern_session_eval(tern_session *s, const int32_t *tokens, int n, float *logits, int all_logits,
                      tern_error *err) {
    if (can_eval(s, n, err)) return -1;
    size_t V = (size_t)s->m->cfg.vocab;
    int P = s->be->eval_piece ? s->be->eval_piece : n;
    for (int done = 0; done < n; done += P) {
        int T = n - done < P ? n - done : P;
        int last = done + T == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * V;
        else if (logits && last) out = logits;
        if (tern_forward_tracked(s, tokens + done, T, out, all_logits, err)) return -1;
    }
    return 0;
}

/* eval_many's checks: distinct sessions of one model, none with a step in
 * flight, valid tokens, and their rows reserved. */
static int many_ok(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq, tern_error *err) {
    if (n_seq <= 0) return tern_fail(err, "no sessions to evaluate");
    if (!s || !tokens || !n) return tern_fail(err, "the sessions, their tokens and their counts are needed");
    for (int i = 0; i < n_seq; i++) {
        if (!s[i]) return tern_fail(err, "session %d is NULL", i);
        if (!tokens[i]) return tern_fail(err, "session %d: its tokens are NULL", i);
        if (s[i]->m != s[0]->m) return tern_fail(err, "session %d belongs to another model than session 0", i);
        for (int j = 0; j < i; j++)
            if (s[j] == s[i]) return tern_fail(err, "session %d is also session %d", i, j);
        if (tern_session_sample_in_flight(s[i]) > 0) return tern_fail(err, "session %d: a step is still in flight", i);
        if (can_eval(s[i], n[i], err) || tern_check_tokens(&s[i]->m->cfg, tokens[i], n[i], err) ||
            tern_session_reserve_rows(s[i], s[i]->pos + n[i], err)) {
            tern_err_prefix(err, "session %d", i);
            return -1;
        }
    }
    return 0;
}

int tern_session_eval_many_draw(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                                const tern_row_draw *draw, int32_t *id, float *logits, tern_error *err) {
    if (many_ok(s, tokens, n, n_seq, err)) return -1;
    int tracked = 0;
    for (int i = 0; i < n_seq; i++) tracked += s[i]->mtp_track;
    if (!tracked) return s[0]->be->forward_many(s, tokens, n, n_seq, draw, id, logits, NULL, err);
    return tern_forward_many_tracked(s, tokens, n, n_seq, draw, id, logits, err);
}

int tern_session_eval_many(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                           float *logits, tern_error *err) {
    return tern_session_eval_many_draw(s, tokens, n, n_seq, NULL, NULL, logits, err);
}

int tern_session_mtp_draft(tern_session *s, int32_t next_token, float *logits, tern_error *err) {
    if (!s->has_hidden) return tern_fail(err, "MTP draft needs at least one evaluated token");
    return tern_mtp_forward(s, s->hidden, &next_token, 1, logits, NULL, err);
}

void tern_session_set_route_observer(tern_session *s, tern_route_fn fn, void *ud) {
    s->route_fn = fn;
    s->route_ud = ud;
}
