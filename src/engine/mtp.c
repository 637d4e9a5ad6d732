/* The MTP head kept in step with the sequence, and the mechanics of a
 * speculative step: the verify of the drafts in one forward pass and the
 * way back to the tokens it keeps. Which drafts are kept is the
 * generation's (engine/speculate.c).
 *
 * The head's row for position i is the pair (final-normed hidden state of
 * token i, token i + 1): the draft of token i + 2 reads it and the rows
 * before it. While a session tracks the head (tern_session_set_mtp), every
 * evaluation of T tokens adds the T pairs it completes, so the head drafts
 * with the whole sequence as context, as it was trained. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "util/err.h"

int tern_session_set_mtp(tern_session *s, int on, tern_error *err) {
    if (on && !s->m->w.has_mtp)
        return tern_fail(err, "%s: the model has no MTP head (mtp.* weights): speculative decoding needs one",
                         s->m->dir);
    if (on && !s->be->verify)
        return tern_fail(err, "MTP speculative decoding does not run on the GPU yet (--device cpu runs it)");
    s->mtp_track = on != 0;
    return 0;
}

void tern_mtp_align(tern_session *s) {
    /* without the last state (a new or filled session) the next pair is
     * the next token's own: its row is the one at pos */
    int want = s->has_hidden ? s->pos - 1 : s->pos;
    if (s->mtp_base <= want && s->mtp_base + s->mtp_pos >= want) {
        s->mtp_pos = want - s->mtp_base;
        return;
    }
    s->mtp_base = want;
    s->mtp_pos = 0;
}

/* The head's rows for n pairs (hidden[i], next[i]); no logits. */
static int add_pairs(tern_session *s, const float *hidden, const int32_t *next, int n, tern_error *err) {
    return n > 0 ? tern_mtp_forward(s, hidden, next, n, NULL, NULL, err) : 0;
}

/* h: room for T + 1 hidden states. The state before the tokens goes first
 * (a session at position 0 has none: its first pair is the first token's
 * state with the second token); *first and *n say where the pairs start
 * and how many the tokens complete. */
static void pairs_before(tern_session *s, float *h, int T, int *first, int *n) {
    int had = s->has_hidden && s->pos > 0;
    tern_mtp_align(s);
    if (had) memcpy(h, s->hidden, (size_t)s->m->cfg.hidden * sizeof(float));
    *first = had ? 0 : 1;
    *n = had ? T : T - 1;
}

int tern_forward_tracked(tern_session *s, const int32_t *tokens, int T, float *logits, int all_logits,
                         tern_error *err) {
    if (!s->mtp_track) return tern_forward(s, tokens, T, logits, all_logits, NULL, err);
    size_t H = (size_t)s->m->cfg.hidden;
    float *h = malloc((size_t)(T + 1) * H * sizeof(float));
    if (!h) return tern_fail(err, "out of memory");
    int first, n;
    pairs_before(s, h, T, &first, &n);
    int rc = tern_forward(s, tokens, T, logits, all_logits, h + H, err);
    if (rc == 0) rc = add_pairs(s, h + first * H, tokens + first, n, err);
    free(h);
    return rc;
}

int tern_forward_many_tracked(tern_session *const *s, const int32_t *const *tokens, const int *n, int n_seq,
                              const tern_row_draw *draw, int32_t *id, float *logits, tern_error *err) {
    size_t H = (size_t)s[0]->m->cfg.hidden, total = 0;
    for (int i = 0; i < n_seq; i++) total += s[i]->mtp_track ? (size_t)(n[i] + 1) * H : 0;
    float *buf = malloc(total * sizeof(float));
    float **hidden = calloc((size_t)n_seq, sizeof *hidden);
    int *first = malloc((size_t)n_seq * sizeof *first), *pairs = malloc((size_t)n_seq * sizeof *pairs);
    int rc = buf && hidden && first && pairs ? 0 : tern_fail(err, "out of memory");
    float *h = buf;
    for (int i = 0; rc == 0 && i < n_seq; i++) {
        if (!s[i]->mtp_track) continue;
        pairs_before(s[i], h, n[i], &first[i], &pairs[i]);
        hidden[i] = h + H;
        h += (size_t)(n[i] + 1) * H;
    }
    if (rc == 0) rc = s[0]->be->forward_many(s, tokens, n, n_seq, draw, id, logits, hidden, err);
    for (int i = 0; rc == 0 && i < n_seq; i++)
        if (hidden[i]) rc = add_pairs(s[i], hidden[i] - H + (size_t)first[i] * H, tokens[i] + first[i], pairs[i], err);
    free(buf);
    free(hidden);
    free(first);
    free(pairs);
    return rc;
}

/* ---- a speculative step -------------------------------------------------- */

/* The recurrent state alone: a snapshot's layer state with no KV rows. */
static size_t ckpt_bytes(const tern_session *s) {
    return tern_state_bytes(&s->m->cfg, s->kvf.row_bytes, s->pos, s->pos, 1);
}

int tern_mtp_verify(tern_session *s, const int32_t *tokens, int T, float *logits, float *hidden, tern_spec_verify *v,
                    tern_error *err) {
    const tern_backend *be = s->be;
    *v = (tern_spec_verify){.p = s->pos, .T = T, .tokens = tokens};
    if (!be->verify) return tern_fail(err, "MTP speculative decoding does not run on the GPU yet (--device cpu runs it)");
    if (s->broken)
        return tern_fail(err, "the session failed mid-step earlier; restore a snapshot or start a new session");
    if (T <= 0 || s->pos + T > s->max_ctx)
        return tern_fail(err, "verify of %d tokens at %d: past the session's max context of %d", T, s->pos,
                         s->max_ctx);
    if (tern_check_tokens(&s->m->cfg, tokens, T, err) || tern_session_reserve_rows(s, s->pos + T, err)) return -1;
    v->keep = be->rollback && !s->m->mtp_recompute;
    if (!v->keep && T > 1) {
        size_t n = ckpt_bytes(s);
        if (!(v->ckpt = be->snap_alloc(n ? n : 1, err)) || be->save(s, v->ckpt, s->pos, s->pos, 1, err) ||
            be->wait(err)) {
            tern_mtp_verify_free(s, v);
            return -1;
        }
    }
    if (be->verify(s, tokens, T, logits, hidden, v->keep, err) == 0) return 0;
    tern_mtp_verify_free(s, v);
    return -1;
}

void tern_mtp_verify_free(tern_session *s, tern_spec_verify *v) {
    if (v->ckpt) s->be->snap_free(v->ckpt);
    v->ckpt = NULL;
}

/* The layer state at the first k tokens: the backend's kept state, or the
 * checkpoint and the k tokens evaluated again. */
static int rewind_layers(tern_session *s, tern_spec_verify *v, int k, tern_error *err) {
    const tern_backend *be = s->be;
    if (v->keep) return be->rollback(s, k, err);
    if (be->load(s, v->ckpt, v->p, v->p, 1, err) || be->wait(err)) return -1;
    s->pos = v->p;
    return be->verify(s, v->tokens, k, NULL, NULL, 0, err);
}

int tern_mtp_keep(tern_session *s, tern_spec_verify *v, int k, const float *hidden, tern_error *err) {
    size_t H = (size_t)s->m->cfg.hidden;
    int rc = 0;
    if (k < 1 || k > v->T) rc = tern_fail(err, "keep %d of %d verified tokens", k, v->T);
    if (rc == 0 && k < v->T && rewind_layers(s, v, k, err)) {
        s->broken = 1;
        rc = -1;
    }
    tern_mtp_verify_free(s, v);
    if (rc) return -1;
    s->pos = v->p + k;
    memcpy(s->hidden, hidden + (size_t)(k - 1) * H, H * sizeof(float));
    /* the head's rows: the pair at p - 1 (the first draft's) stands; the
     * draft rows after it give way to the verified pairs */
    if (s->mtp_base > v->p - 1 || s->mtp_base + s->mtp_pos < v->p) {
        tern_mtp_align(s);
        return 0;
    }
    s->mtp_pos = v->p - s->mtp_base;
    return s->mtp_track ? add_pairs(s, hidden, v->tokens + 1, k - 1, err) : 0;
}
