/* tern_cuda_moe against the MoE block of engine/forward.c computed with
 * tern_matmul: out = sum_k w_k (silu(x G^T) * (x U^T)) D^T + sigmoid(x .
 * w_sg) * shared(x), and tern_cuda_route against the router rule
 * (tern_moe_topk, cpu/moe.h).
 * Experts live in blobs laid out as docs/FORMAT.md's experts/layer_NNN.bin.
 * Tolerances: fp32 throughout (1e-5 of max |out|, as for the GEMV: only
 * the summation order differs); the router's ids exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/moe.h"
#include "cpu/ops.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Part offsets inside a blob: q, scales, biases of gate, up, down, each
 * 64-byte aligned; returns the stride (a multiple of 4096). */
static size_t layout_parts(tern_cuda_experts *ex, int64_t H, int64_t I, int bits, int group) {
    tern_cuda_expert_part *parts[3] = {&ex->gate, &ex->up, &ex->down};
    size_t off = 0;
    for (int p = 0; p < 3; p++) {
        tern_cuda_expert_part *e = parts[p];
        e->rows = p < 2 ? I : H;
        e->cols = p < 2 ? H : I;
        e->bits = bits;
        e->group = group;
        size_t qb = (size_t)e->rows * e->cols * bits / 8, sb = (size_t)e->rows * (e->cols / group) * 2;
        e->q_off = off;
        off = align64(off + qb);
        e->s_off = off;
        off = align64(off + sb);
        e->b_off = off;
        off = align64(off + sb);
    }
    return (off + 4095) & ~(size_t)4095;
}

static tern_mat host_part(const uint8_t *blob, const tern_cuda_expert_part *p) {
    tern_mat m = {0};
    m.data = blob + p->q_off;
    m.scales = (const uint16_t *)(blob + p->s_off);
    m.biases = (const uint16_t *)(blob + p->b_off);
    m.rows = p->rows;
    m.cols = p->cols;
    m.bits = p->bits;
    m.group = p->group;
    return m;
}

static void fill_blob(checker *ck, uint8_t *blob, const tern_cuda_experts *ex) {
    const tern_cuda_expert_part *parts[3] = {&ex->gate, &ex->up, &ex->down};
    for (int p = 0; p < 3; p++) {
        const tern_cuda_expert_part *e = parts[p];
        fill_quant(ck, blob + e->q_off, (uint16_t *)(blob + e->s_off), (uint16_t *)(blob + e->b_off), e->rows, e->cols,
                   e->bits, e->group);
    }
}

/* out[H] (+)= scale * (silu(x G^T) * (x U^T)) D^T */
static void swiglu_ref(checker *ck, const tern_mat *g, const tern_mat *u, const tern_mat *d, const float *x, float scale,
                       float *out) {
    int64_t I = g->rows, H = d->rows;
    float *a = xmalloc((size_t)I * sizeof(float)), *b = xmalloc((size_t)I * sizeof(float));
    float *y = xmalloc((size_t)H * sizeof(float));
    tern_matmul(ck->pool, a, x, 1, g);
    tern_matmul(ck->pool, b, x, 1, u);
    tern_swiglu(a, a, b, (size_t)I);
    tern_matmul(ck->pool, y, a, 1, d);
    for (int64_t i = 0; i < H; i++) out[i] += scale * y[i];
    free(a);
    free(b);
    free(y);
}

/* Random experts for a check: E blobs (a host copy for the CPU twin and a
 * device copy), found through a table that lists them in reverse order (to
 * show it is used) or at base + e * stride; and, when shared_kind is set
 * (4 or 8 bits, 16 for bf16), a shared expert [Is, H] with its gate. */
typedef struct {
    tern_cuda_experts ex;
    size_t stride;
    int E, use_table, has_shared;
    uint8_t *blobs, *dblobs;
    void *table;
    test_mat sh[3], sg;
    tern_expert_w shd;
} expert_fixture;

/* 1: the experts' fixtures forbid the one launch (moe_check's two-launch
 * cases) */
static int moe_two_launches;

static void fixture_make(checker *ck, expert_fixture *f, int64_t H, int64_t I, int64_t Is, int E, int bits, int group,
                         int use_table, int shared_kind) {
    memset(f, 0, sizeof *f);
    f->stride = layout_parts(&f->ex, H, I, bits, group);
    f->ex.stride = f->stride;
    f->ex.one_launch = !moe_two_launches;   /* the checker runs one grid at a time */
    f->E = E;
    f->use_table = use_table;
    f->blobs = xmalloc(f->stride * (size_t)E);
    memset(f->blobs, 0, f->stride * (size_t)E);
    for (int e = 0; e < E; e++) fill_blob(ck, f->blobs + (size_t)e * f->stride, &f->ex);
    f->dblobs = dev_upload(f->blobs, f->stride * (size_t)E);
    if (use_table) {
        const uint8_t **tab = xmalloc((size_t)E * sizeof(*tab));
        for (int e = 0; e < E; e++) tab[e] = f->dblobs + (size_t)(E - 1 - e) * f->stride;
        f->table = dev_upload(tab, (size_t)E * sizeof(*tab));
        free(tab);
        f->ex.blobs = f->table;
    } else {
        f->ex.base = f->dblobs;
    }
    if (!(f->has_shared = shared_kind != 0)) return;
    int sbits = shared_kind == 16 ? 0 : shared_kind;
    make_mat(ck, &f->sh[0], Is, H, sbits, TERN_DTYPE_BF16, group);
    make_mat(ck, &f->sh[1], Is, H, sbits, TERN_DTYPE_BF16, group);
    make_mat(ck, &f->sh[2], H, Is, sbits, TERN_DTYPE_BF16, group);
    make_mat(ck, &f->sg, 1, H, 8, 0, group);
    f->shd = (tern_expert_w){f->sh[0].d, f->sh[1].d, f->sh[2].d};
}

/* The host copy of expert e's blob (the table reverses the order). */
static const uint8_t *fixture_blob(const expert_fixture *f, int e) {
    return f->blobs + (size_t)(f->use_table ? f->E - 1 - e : e) * f->stride;
}

static const tern_expert_w *fixture_shared(const expert_fixture *f) { return f->has_shared ? &f->shd : NULL; }
static const tern_mat *fixture_gate(const expert_fixture *f) { return f->has_shared ? &f->sg.d : NULL; }

/* out += wts * routed expert e (x), CPU twin. */
static void fixture_ref(checker *ck, const expert_fixture *f, int e, const float *x, float w, float *out) {
    const uint8_t *blob = fixture_blob(f, e);
    tern_mat g = host_part(blob, &f->ex.gate), u = host_part(blob, &f->ex.up), d = host_part(blob, &f->ex.down);
    swiglu_ref(ck, &g, &u, &d, x, w, out);
}

/* out += sigmoid(x . w_sg) * shared(x), CPU twin. */
static void fixture_ref_shared(checker *ck, const expert_fixture *f, const float *x, float *out) {
    float sgv;
    tern_matmul(ck->pool, &sgv, x, 1, &f->sg.h);
    swiglu_ref(ck, &f->sh[0].h, &f->sh[1].h, &f->sh[2].h, x, tern_sigmoid(sgv), out);
}

/* Bytes of the shared expert and its gate (for timings). */
static double fixture_shared_bytes(const expert_fixture *f) {
    return f->has_shared ? (double)(mat_bytes(&f->sh[0].h) * 3 + mat_bytes(&f->sg.h)) : 0.0;
}

static void fixture_free(expert_fixture *f) {
    if (f->has_shared) {
        for (int i = 0; i < 3; i++) free_mat(&f->sh[i]);
        free_mat(&f->sg);
    }
    tern_cuda_free(f->table);
    tern_cuda_free(f->dblobs);
    free(f->blobs);
}

typedef struct {
    int64_t H, I;
    int E, K, T, bits, group;
    int use_table;        /* experts through a device pointer table (else base + stride) */
    int shared_kind;      /* 0 none, 4 q4, 8 q8, 16 bf16 */
    int64_t Is;           /* the shared expert's intermediate size (0: I) */
} moe_case;

typedef struct {
    const tern_cuda_experts *ex;
    const tern_expert_w *shared;
    const tern_mat *sg;
    const float *x;
    int T, K;
    int32_t *ids;         /* device: sets of ids, one per rep */
    int n_sets;
    const float *wts;
    void *work;
    float *out;
    tern_stream s;
} moe_run;

static void run_moe(void *arg, int rep) {
    moe_run *r = arg;
    tern_error err;
    const int32_t *ids = r->ids + (size_t)(rep % r->n_sets) * r->T * r->K;
    if (tern_cuda_moe(r->ex, r->shared, r->sg, r->x, r->T, r->K, ids, r->wts, r->work, r->out, r->s, &err))
        die_err("moe", &err);
}

/* Random distinct ids per token and weights that sum to 1. */
static void random_routing(checker *ck, int T, int K, int E, int32_t *ids, float *wts) {
    for (int t = 0; t < T; t++) {
        float sum = 0;
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = (int)(rnd_u64(ck) % (uint64_t)E);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= ids[t * K + j] == e;
            } while (dup);
            ids[t * K + k] = e;
            wts[t * K + k] = rnd_uniform(ck, 0.05f, 1.0f);
            sum += wts[t * K + k];
        }
        for (int k = 0; k < K; k++) wts[t * K + k] /= sum;
    }
}

enum { MOE_TW = 4 };

/* A call of MOE_TW random tokens through work, then three of the one-token
 * case (dx, dids, dw): the last one's output into got. A one-launch MoE
 * whose counters a wider call overwrote, or that does not put them back to
 * zero, computes from h rows not yet written. */
static void moe_after_wide(checker *ck, const expert_fixture *f, const moe_case *c, const float *dx,
                           const int32_t *dids, const float *dw, void *work, float *dout, float *got) {
    int K = c->K;
    int32_t ids[MOE_TW * 32];   /* top k <= 32 (the router's limit) */
    float wts[MOE_TW * 32];
    if (K > 32) {
        fprintf(stderr, "tern-cuda-tests: moe: top %d over the checker's 32\n", K);
        exit(2);
    }
    float *x = xmalloc((size_t)MOE_TW * c->H * sizeof(float));
    random_routing(ck, MOE_TW, K, c->E, ids, wts);
    rnd_floats(ck, x, (size_t)MOE_TW * c->H, 1.0f);
    int32_t *wids = dev_upload(ids, sizeof(int32_t) * MOE_TW * K);
    float *ww = dev_upload(wts, sizeof(float) * MOE_TW * K), *wx = dev_upload(x, (size_t)MOE_TW * c->H * sizeof(float));
    float *wout = dev_poison((size_t)MOE_TW * c->H);
    tern_error err;
    if (tern_cuda_moe(&f->ex, fixture_shared(f), fixture_gate(f), wx, MOE_TW, K, wids, ww, work, wout, ck->stream, &err))
        die_err("moe", &err);
    /* NaN first: an output the calls below do not all write shows */
    if (tern_cuda_fill(dout, 0xff, (size_t)c->H * sizeof(float), ck->stream, &err)) die_err("poison", &err);
    for (int i = 0; i < 3; i++)
        if (tern_cuda_moe(&f->ex, fixture_shared(f), fixture_gate(f), dx, 1, K, dids, dw, work, dout, ck->stream, &err))
            die_err("moe", &err);
    dev_sync(ck, "moe");
    dev_download(got, dout, (size_t)c->H * sizeof(float));
    tern_cuda_free(wids);
    tern_cuda_free(ww);
    tern_cuda_free(wx);
    tern_cuda_free(wout);
    free(x);
}

static void moe_check(checker *ck, const moe_case *c, int timed) {
    int64_t Is = c->Is ? c->Is : c->I;
    expert_fixture f;
    fixture_make(ck, &f, c->H, c->I, Is, c->E, c->bits, c->group, c->use_table, c->shared_kind);
    const tern_cuda_experts *ex = &f.ex;
    int T = c->T, K = c->K;
    int32_t *ids = xmalloc((size_t)T * K * sizeof(int32_t));
    float *wts = xmalloc((size_t)T * K * sizeof(float)), *x = xmalloc((size_t)T * c->H * sizeof(float));
    float *ref = xmalloc((size_t)T * c->H * sizeof(float)), *got = xmalloc((size_t)T * c->H * sizeof(float));
    random_routing(ck, T, K, c->E, ids, wts);
    rnd_floats(ck, x, (size_t)T * c->H, 1.0f);
    memset(ref, 0, (size_t)T * c->H * sizeof(float));
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * c->H;
        for (int k = 0; k < K; k++) fixture_ref(ck, &f, ids[t * K + k], xt, wts[t * K + k], ref + (size_t)t * c->H);
        if (f.has_shared) fixture_ref_shared(ck, &f, xt, ref + (size_t)t * c->H);
    }
    int32_t *dids = dev_upload(ids, (size_t)T * K * sizeof(int32_t));
    float *dw = dev_upload(wts, (size_t)T * K * sizeof(float)), *dx = dev_upload(x, (size_t)T * c->H * sizeof(float));
    /* room for MOE_TW tokens: a one-token case is checked again after a
     * call of MOE_TW tokens through the same workspace (as the engine's
     * prefill pieces then decode steps do) */
    size_t mwb = tern_cuda_moe_workspace(T > MOE_TW ? T : MOE_TW, K, Is > c->I ? Is : c->I, c->H);
    void *work = dev_alloc(mwb);
    dev_zero(work, mwb);   /* the one-launch MoE's counters start at zero */
    float *dout = dev_poison((size_t)T * c->H);
    tern_error err;
    const tern_expert_w *shp = fixture_shared(&f);
    const tern_mat *sgp = fixture_gate(&f);
    if (tern_cuda_moe(ex, shp, sgp, dx, T, K, dids, dw, work, dout, ck->stream, &err)) die_err("moe", &err);
    dev_sync(ck, "moe");
    dev_download(got, dout, (size_t)T * c->H * sizeof(float));
    char shape[96], sis[24] = "";
    if (Is != c->I) snprintf(sis, sizeof sis, " I=%lld", (long long)Is);
    snprintf(shape, sizeof shape, "q%d g%d %dx(%lld,%lld) top%d T=%d %s%s%s%s", c->bits, c->group, c->E,
             (long long)c->I, (long long)c->H, K, T, c->use_table ? "table" : "base",
             c->shared_kind == 4 ? "+sh q4" : c->shared_kind == 8 ? "+sh q8" : c->shared_kind == 16 ? "+sh bf16" : "",
             sis, moe_two_launches ? " two launches" : "");
    report(ck, "moe", shape, got, ref, (size_t)T * c->H, 1e-5);
    if (T == 1) {
        moe_after_wide(ck, &f, c, dx, dids, dw, work, dout, got);
        char again[128];
        snprintf(again, sizeof again, "%s, again x3 after T=%d", shape, MOE_TW);
        report(ck, "moe", again, got, ref, (size_t)c->H, 1e-5);
    }
    if (timed && ck->time) {
        /* 32 id sets: each rep reads other experts, like successive layers */
        int n_sets = 32;
        int32_t *sets = xmalloc((size_t)n_sets * T * K * sizeof(int32_t));
        float *tmpw = xmalloc((size_t)T * K * sizeof(float));
        for (int i = 0; i < n_sets; i++) random_routing(ck, T, K, c->E, sets + (size_t)i * T * K, tmpw);
        int32_t *dsets = dev_upload(sets, (size_t)n_sets * T * K * sizeof(int32_t));
        moe_run r = {ex, shp, sgp, dx, T, K, dsets, n_sets, dw, work, dout, ck->stream};
        double ms = time_op(ck, run_moe, &r);
        double bytes = (double)T * K * (double)f.stride + fixture_shared_bytes(&f);
        report_time(ck, "moe", shape, ms, bytes);
        tern_cuda_free(dsets);
        free(sets);
        free(tmpw);
    }
    fixture_free(&f);
    tern_cuda_free(dids);
    tern_cuda_free(dw);
    tern_cuda_free(dx);
    tern_cuda_free(work);
    tern_cuda_free(dout);
    free(ids);
    free(wts);
    free(x);
    free(ref);
    free(got);
}


/* The one launch's sums in fixed point (tern_cuda_experts.fx), in the
 * engine's order: three launches through two slots, each zeroing the
 * other's; the first two on other logits (dl2), so the third (dl, into the
 * slot the first used) shows sums or counters not zeroed. Its output
 * within the MoE check's 1e-5 of the CPU's (ref) and 1e-6 of the float
 * output (flt: the same shares, summed in fp32 instead of exactly); the
 * other slot zero after it, ids and weights bit for bit the float path's
 * (fids, fwts). A call of several tokens or with one slot for both refuses. */
static void moe_fx_check(checker *ck, const expert_fixture *f, const moe_case *c, const char *shape, const float *dx,
                         const float *dl, const float *dl2, void *work, const float *ref, const float *flt,
                         const int32_t *fids, const float *fwts) {
    const tern_expert_w *shp = fixture_shared(f);
    const tern_mat *sgp = fixture_gate(f);
    int K = c->K, E = c->E;
    size_t fb = tern_cuda_moe_fx_bytes(c->H);
    uint8_t *slots = dev_alloc(2 * fb);
    dev_zero(slots, 2 * fb);
    float *dw = dev_poison((size_t)K), *dout = dev_poison((size_t)c->H);
    int32_t *di = dev_alloc((size_t)K * sizeof(int32_t));
    tern_cuda_experts ex = f->ex;
    tern_error err;
    for (int i = 0; i < 3; i++) {
        ex.fx = slots + (i & 1) * fb;
        ex.fx_zero = slots + (~i & 1) * fb;
        if (tern_cuda_moe_route(&ex, shp, sgp, dx, K, i == 2 ? dl : dl2, E, 1, di, dw, work, NULL, ck->stream, &err))
            die_err("moe_route (fixed point)", &err);
    }
    if (tern_cuda_dfx_float(dout, tern_cuda_moe_fx_sums(slots), c->H, ck->stream, &err)) die_err("dfx_float", &err);
    dev_sync(ck, "moe_route (fixed point)");
    float *got = xmalloc((size_t)c->H * sizeof(float));
    uint8_t *other = xmalloc(fb);
    int32_t gi[32];
    float gw[32];
    dev_download(got, dout, (size_t)c->H * sizeof(float));
    dev_download(other, slots + fb, fb);
    dev_download(gi, di, (size_t)K * sizeof(int32_t));
    dev_download(gw, dw, (size_t)K * sizeof(float));
    char what[192];
    long diff = 0;
    for (int k = 0; k < K; k++) diff += gi[k] != fids[k] || memcmp(&gw[k], &fwts[k], sizeof(float));
    snprintf(what, sizeof what, "%s, fixed-point sums' ids and weights = the float path's (bitwise)", shape);
    report_exact(ck, "moe_fx", what, diff, K);
    snprintf(what, sizeof what, "%s, fixed-point sums", shape);
    report(ck, "moe_fx", what, got, ref, (size_t)c->H, 1e-5);
    snprintf(what, sizeof what, "%s, fixed-point sums ~ float sums", shape);
    report(ck, "moe_fx", what, got, flt, (size_t)c->H, 1e-6);
    long nz = 0;
    for (size_t i = 0; i < fb; i++) nz += other[i] != 0;
    snprintf(what, sizeof what, "%s, the other slot zeroed (bytes)", shape);
    report_exact(ck, "moe_fx", what, nz, (long)fb);
    /* refusals: several tokens; one slot as both */
    int32_t ids4[4 * 32];
    float wts4[4 * 32];
    random_routing(ck, 4, K, E, ids4, wts4);
    int32_t *d4 = dev_upload(ids4, sizeof(int32_t) * 4 * K);
    float *w4 = dev_upload(wts4, sizeof(float) * 4 * K);
    ex.fx = slots;
    ex.fx_zero = slots + fb;
    long bad = tern_cuda_moe(&ex, shp, sgp, dx, 4, K, d4, w4, work, NULL, ck->stream, &err) == 0;
    ex.fx_zero = slots;
    bad += tern_cuda_moe_route(&ex, shp, sgp, dx, K, dl, E, 1, di, dw, work, NULL, ck->stream, &err) == 0;
    snprintf(what, sizeof what, "%s, fixed point refused for T=4 and for one slot as both", shape);
    report_exact(ck, "moe_fx", what, bad, 2);
    dev_sync(ck, "moe_route (fixed point)");
    tern_cuda_free(d4);
    tern_cuda_free(w4);
    tern_cuda_free(slots);
    tern_cuda_free(dw);
    tern_cuda_free(dout);
    tern_cuda_free(di);
    free(got);
    free(other);
}

/* The one-launch MoE routing the token itself (tern_cuda_moe_route) from
 * random logits: ids exactly the CPU's top k, weights and output within
 * the MoE check's tolerance of the CPU's, and all three bit for bit those
 * of tern_cuda_route then tern_cuda_moe (the same kernels' code). must:
 * the shape is the engine's, where it has to apply. ties: the logits in
 * quarters (route_case's), equal ones at the top k's edge. */
static void moe_route_check(checker *ck, const moe_case *c, int must, int ties) {
    expert_fixture f;
    fixture_make(ck, &f, c->H, c->I, c->I, c->E, c->bits, c->group, c->use_table, c->shared_kind);
    const tern_expert_w *shp = fixture_shared(&f);
    const tern_mat *sgp = fixture_gate(&f);
    char shape[96];
    snprintf(shape, sizeof shape, "q%d g%d %dx(%lld,%lld) top%d %s%s%s", c->bits, c->group, c->E, (long long)c->I,
             (long long)c->H, c->K, c->use_table ? "table" : "base", c->shared_kind ? "+sh q4" : "",
             ties ? " ties" : "");
    if (!tern_cuda_moe_routes_itself(&f.ex, shp, sgp, c->K, c->E)) {
        if (must) report_exact(ck, "moe_route", shape, 1, 1);   /* the engine's shape must take it */
        else printf("moe_route %s: does not apply on this device, skipped\n", shape);
        fixture_free(&f);
        return;
    }
    /* not allowed by the caller (another session on the device): never */
    tern_cuda_experts no = f.ex;
    no.one_launch = 0;
    char what[160];
    snprintf(what, sizeof what, "%s, one launch not allowed: not taken", shape);
    report_exact(ck, "moe_route", what, tern_cuda_moe_routes_itself(&no, shp, sgp, c->K, c->E) != 0, 1);
    int E = c->E, K = c->K;
    float *l = xmalloc((size_t)E * sizeof(float)), *p = xmalloc((size_t)E * sizeof(float));
    float *x = xmalloc((size_t)c->H * sizeof(float)), *ref = xmalloc((size_t)c->H * sizeof(float));
    float *got = xmalloc((size_t)c->H * sizeof(float)), *two = xmalloc((size_t)c->H * sizeof(float));
    int idx[32];
    float wt[32], gw[32], tw[32];
    int32_t gi[32], ti[32];
    rnd_floats(ck, l, (size_t)E, 2.0f);
    if (ties)
        for (int e = 0; e < E; e++) l[e] = roundf(l[e] * 4.0f) / 4.0f;
    rnd_floats(ck, x, (size_t)c->H, 1.0f);
    memcpy(p, l, (size_t)E * sizeof(float));
    tern_moe_topk(p, E, K, 1, idx, wt);
    memset(ref, 0, (size_t)c->H * sizeof(float));
    for (int k = 0; k < K; k++) fixture_ref(ck, &f, idx[k], x, wt[k], ref);
    if (f.has_shared) fixture_ref_shared(ck, &f, x, ref);
    float *dl = dev_upload(l, (size_t)E * sizeof(float)), *dx = dev_upload(x, (size_t)c->H * sizeof(float));
    float *dw = dev_poison((size_t)K), *dw2 = dev_poison((size_t)K);
    int32_t *di = dev_alloc((size_t)K * sizeof(int32_t)), *di2 = dev_alloc((size_t)K * sizeof(int32_t));
    size_t wb = tern_cuda_moe_workspace(1, K, c->I, c->H);
    void *work = dev_alloc(wb);
    dev_zero(work, wb);
    float *dout = dev_poison((size_t)c->H), *dout2 = dev_poison((size_t)c->H);
    tern_error err;
    /* first on other logits (other experts' h in the workspace), then
     * twice on these into a poisoned output: counters not back at zero
     * would let a segment read h rows of the earlier call */
    float *l2 = xmalloc((size_t)E * sizeof(float));
    rnd_floats(ck, l2, (size_t)E, 2.0f);
    float *dl2 = dev_upload(l2, (size_t)E * sizeof(float));
    if (tern_cuda_moe_route(&f.ex, shp, sgp, dx, K, dl2, E, 1, di, dw, work, dout, ck->stream, &err) ||
        tern_cuda_fill(dout, 0xff, (size_t)c->H * sizeof(float), ck->stream, &err))
        die_err("moe_route", &err);
    for (int i = 0; i < 2; i++)
        if (tern_cuda_moe_route(&f.ex, shp, sgp, dx, K, dl, E, 1, di, dw, work, dout, ck->stream, &err))
            die_err("moe_route", &err);
    if (tern_cuda_route(dl, 1, E, K, 1, di2, dw2, ck->stream, &err) ||
        tern_cuda_moe(&f.ex, shp, sgp, dx, 1, K, di2, dw2, work, dout2, ck->stream, &err))
        die_err("route + moe", &err);
    dev_sync(ck, "moe_route");
    dev_download(got, dout, (size_t)c->H * sizeof(float));
    dev_download(two, dout2, (size_t)c->H * sizeof(float));
    dev_download(gi, di, (size_t)K * sizeof(int32_t));
    dev_download(gw, dw, (size_t)K * sizeof(float));
    dev_download(ti, di2, (size_t)K * sizeof(int32_t));
    dev_download(tw, dw2, (size_t)K * sizeof(float));
    long bad = 0, diff = 0;
    for (int k = 0; k < K; k++) bad += gi[k] != idx[k];
    for (int k = 0; k < K; k++) diff += gi[k] != ti[k] || memcmp(&gw[k], &tw[k], sizeof(float));
    diff += memcmp(got, two, (size_t)c->H * sizeof(float)) != 0;
    snprintf(what, sizeof what, "%s ids", shape);
    report_exact(ck, "moe_route", what, bad, K);
    snprintf(what, sizeof what, "%s weights", shape);
    report(ck, "moe_route", what, gw, wt, (size_t)K, 1e-5);
    report(ck, "moe_route", shape, got, ref, (size_t)c->H, 1e-5);
    snprintf(what, sizeof what, "%s = route + moe (bitwise)", shape);
    report_exact(ck, "moe_route", what, diff, K + 1);
    moe_fx_check(ck, &f, c, shape, dx, dl, dl2, work, ref, got, gi, gw);
    tern_cuda_free(dl2);
    free(l2);
    tern_cuda_free(dl);
    tern_cuda_free(dx);
    tern_cuda_free(dw);
    tern_cuda_free(dw2);
    tern_cuda_free(di);
    tern_cuda_free(di2);
    tern_cuda_free(work);
    tern_cuda_free(dout);
    tern_cuda_free(dout2);
    fixture_free(&f);
    free(l);
    free(p);
    free(x);
    free(ref);
    free(got);
    free(two);
}

void check_moe(checker *ck) {
    /* Qwen3.6 shapes, timed: the default pack (q4 experts, q8 shared), all
     * q4 at T = 1 and T = 8 (an MTP verification), all q8 */
    moe_case real = {2048, 512, 256, 8, 1, 4, 64, 0, 8, 0};
    moe_check(ck, &real, 1);
    moe_case q4 = {2048, 512, 256, 8, 1, 4, 64, 0, 4, 0};
    moe_check(ck, &q4, 1);
    moe_case q4t8 = {2048, 512, 256, 8, 8, 4, 64, 0, 4, 0};
    moe_check(ck, &q4t8, 1);
    moe_case q8g64 = {2048, 512, 128, 8, 1, 8, 64, 0, 8, 0};
    moe_check(ck, &q8g64, 1);
    moe_case two = {2048, 512, 64, 8, 3, 4, 64, 1, 16, 0};
    moe_check(ck, &two, 0);
    moe_case q8 = {2048, 512, 16, 8, 2, 8, 32, 0, 0, 0};
    moe_check(ck, &q8, 0);
    moe_case q8s4 = {2048, 512, 32, 8, 2, 8, 64, 1, 4, 0};   /* q8 experts, a q4 shared expert */
    moe_check(ck, &q8s4, 0);
    moe_case odd = {256, 96, 12, 3, 2, 4, 32, 1, 8, 0};
    moe_check(ck, &odd, 0);
    /* beyond the down kernel's one-pass shapes: routed rows of 33 pieces of
     * 32 (8 x 33 > 128 lanes), one row per block, a bf16 shared expert of
     * 4200 (not a multiple of 32, over 128 pieces), and a wide hidden size */
    moe_case big = {4160, 1056, 16, 8, 2, 8, 32, 1, 16, 4200};
    moe_check(ck, &big, 0);
    /* top 10 (more than 8 segments per token), groups of 128 */
    moe_case wide = {512, 128, 20, 10, 3, 4, 128, 0, 4, 0};
    moe_check(ck, &wide, 0);
    /* one token, all q4 (the one-launch MoE): no shared expert, a table;
     * top 10 with groups of 128 */
    moe_case q4ns = {2048, 512, 64, 8, 1, 4, 64, 1, 0, 0};
    moe_check(ck, &q4ns, 0);
    moe_case wide1 = {512, 128, 20, 10, 1, 4, 128, 0, 4, 0};
    moe_check(ck, &wide1, 0);
    /* routing inside the one launch: the engine's shape (q4 experts and
     * shared expert), no shared expert, top 10 of 20 */
    moe_route_check(ck, &q4, 1, 0);
    moe_route_check(ck, &q4, 1, 1);
    moe_route_check(ck, &q4ns, 0, 0);
    moe_route_check(ck, &wide1, 0, 1);
    /* the one launch's down on h as floats (the intermediate size not
     * whole spans of the digits) */
    moe_case narrow1 = {512, 96, 16, 4, 1, 4, 32, 0, 4, 0};
    moe_check(ck, &narrow1, 0);
    /* the float gate/up (a hidden size not whole spans of the digits), q8
     * and q4 */
    moe_case h288 = {288, 96, 12, 4, 2, 8, 32, 0, 8, 0};
    moe_check(ck, &h288, 0);
    moe_case h288q4 = {288, 96, 12, 4, 1, 4, 32, 1, 4, 0};
    moe_check(ck, &h288q4, 0);
    /* one token in two launches, as a step takes them while another
     * session may run beside it (tern_cuda_experts.one_launch 0) */
    moe_two_launches = 1;
    moe_check(ck, &q4, 0);
    moe_check(ck, &q4ns, 0);
    moe_check(ck, &wide1, 0);
    moe_two_launches = 0;
}

/* ---- router ------------------------------------------------------------------ */

typedef struct {
    const float *logits;
    int T, E, K;
    int32_t *ids;
    float *wts;
    tern_stream s;
} route_run;

static void run_route(void *arg, int rep) {
    route_run *r = arg;
    tern_error err;
    (void)rep;
    if (tern_cuda_route(r->logits, r->T, r->E, r->K, 1, r->ids, r->wts, r->s, &err)) die_err("route", &err);
}

/* ties: the logits rounded to quarters (17 values in [-2, 2]), so most
 * have equals, among them at the K-th place: the CPU's rule, ties to the
 * lower index, must hold on the device too. */
static void route_case(checker *ck, int T, int E, int K, int timed, int ties) {
    float *l = xmalloc((size_t)T * E * sizeof(float)), *p = xmalloc((size_t)T * E * sizeof(float));
    rnd_floats(ck, l, (size_t)T * E, 2.0f);
    if (ties)
        for (size_t i = 0; i < (size_t)T * E; i++) l[i] = roundf(l[i] * 4.0f) / 4.0f;
    memcpy(p, l, (size_t)T * E * sizeof(float));
    int *idx = xmalloc((size_t)T * K * sizeof(int));
    float *wt = xmalloc((size_t)T * K * sizeof(float)), *gw = xmalloc((size_t)T * K * sizeof(float));
    int32_t *gi = xmalloc((size_t)T * K * sizeof(int32_t));
    for (int t = 0; t < T; t++) tern_moe_topk(p + (size_t)t * E, E, K, 1, idx + t * K, wt + t * K);
    float *dl = dev_upload(l, (size_t)T * E * sizeof(float)), *dw = dev_poison((size_t)T * K);
    int32_t *di = dev_alloc((size_t)T * K * sizeof(int32_t));
    tern_error err;
    if (tern_cuda_route(dl, T, E, K, 1, di, dw, ck->stream, &err)) die_err("route", &err);
    dev_sync(ck, "route");
    dev_download(gi, di, (size_t)T * K * sizeof(int32_t));
    dev_download(gw, dw, (size_t)T * K * sizeof(float));
    long bad = 0;
    for (int i = 0; i < T * K; i++) bad += gi[i] != idx[i];
    char shape[64];
    snprintf(shape, sizeof shape, "%d experts top%d T=%d%s ids", E, K, T, ties ? " ties" : "");
    report_exact(ck, "route", shape, bad, (long)T * K);
    snprintf(shape, sizeof shape, "%d experts top%d T=%d%s weights", E, K, T, ties ? " ties" : "");
    report(ck, "route", shape, gw, wt, (size_t)T * K, 1e-5);
    if (timed && ck->time) {
        route_run r = {dl, T, E, K, di, dw, ck->stream};
        snprintf(shape, sizeof shape, "%d experts top%d T=%d", E, K, T);
        report_time(ck, "route", shape, time_op(ck, run_route, &r), (double)T * E * 4 + (double)T * K * 8);
    }
    tern_cuda_free(dl);
    tern_cuda_free(dw);
    tern_cuda_free(di);
    free(l);
    free(p);
    free(idx);
    free(wt);
    free(gw);
    free(gi);
}

void check_route(checker *ck) {
    route_case(ck, 1, 256, 8, 1, 0);
    route_case(ck, 8, 256, 8, 1, 0);
    route_case(ck, 7, 256, 8, 0, 0);
    route_case(ck, 3, 16, 4, 0, 0);
    route_case(ck, 2, 1000, 10, 0, 0);
    route_case(ck, 2, 4096, 32, 0, 0);
    route_case(ck, 1, 3, 3, 0, 0);
    route_case(ck, 16, 256, 8, 0, 1);
    route_case(ck, 4, 1000, 10, 0, 1);
    route_case(ck, 4, 40, 32, 0, 1);
}

/* ---- the experts chosen, counted ---------------------------------------------
 * tern_cuda_count_experts against a histogram on the CPU, added onto
 * counts already there; exact. */
void check_count_experts(checker *ck) {
    static const int sizes[][2] = {{8, 256}, {320, 256}, {4096 * 8, 256}, {100, 16}};
    for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
        int n = sizes[c][0], E = sizes[c][1];
        int32_t *ids = xmalloc((size_t)n * 4);
        unsigned *want = xmalloc((size_t)E * 4), *got = xmalloc((size_t)E * 4);
        for (int e = 0; e < E; e++) want[e] = (unsigned)e;   /* counts already there */
        for (int i = 0; i < n; i++) {
            ids[i] = (int32_t)(rnd_u64(ck) % (uint64_t)(E + 2)) - 1;   /* some outside the range */
            if (ids[i] >= 0 && ids[i] < E) want[ids[i]]++;
        }
        int32_t *d_ids = dev_upload(ids, (size_t)n * 4);
        unsigned *d_counts = dev_alloc((size_t)E * 4);
        for (int e = 0; e < E; e++) got[e] = (unsigned)e;
        tern_cuda_upload(d_counts, got, (size_t)E * 4, NULL);
        tern_error err;
        if (tern_cuda_count_experts(d_ids, n, E, d_counts, ck->stream, &err)) die_err("count_experts", &err);
        dev_sync(ck, "count_experts");
        dev_download(got, d_counts, (size_t)E * 4);
        long bad = 0;
        for (int e = 0; e < E; e++) bad += got[e] != want[e];
        char shape[64];
        snprintf(shape, sizeof shape, "%d ids, %d experts", n, E);
        report_exact(ck, "count_experts", shape, bad, E);
        tern_cuda_free(d_ids);
        tern_cuda_free(d_counts);
        free(ids); free(want); free(got);
    }
}

/* ---- grouped by expert (prefill) ----------------------------------------------
 * tern_cuda_moe_grouped against moe_layer's order on the CPU (routed
 * experts in ascending id, then the shared expert times its gate), in
 * fp32 through tern_matmul; at T = 4096 on every 16th token (the CPU twin
 * would take minutes on all), and on all tokens against tern_cuda_moe (the
 * decode op, fp32) run on the same inputs.
 * Tolerance 1e-2 of max |ref|: x, h and the dequantized weights are rounded
 * to bf16 (2^-9 relative each) before fp32-accumulated products over 2048
 * and 512 terms of random sign, so an output's error is ~2^-9 x sqrt(3)
 * of a typical output per product, two products chained: ~3e-3 of a
 * typical output, less of the largest (the single cuBLAS GEMM measured
 * 2.5e-3); an indexing or order error is O(1). */

typedef struct {
    int64_t H, I;
    int E, K, T, bits, group;
    int use_table, shared_kind;
    int skew;              /* every token also picks expert 0: one expert of T rows */
    int stride_check;      /* check every n-th token on the CPU */
} moeg_case;

typedef struct {
    const tern_cuda_experts *ex;
    int E;
    const tern_expert_w *shared;
    const tern_mat *sg;
    const float *x;
    int T, K;
    const int32_t *ids;
    const float *wts;
    void *work;
    size_t work_bytes;
    float *out;
    int per_token;         /* time tern_cuda_moe instead */
    tern_stream s;
} moeg_run;

static void run_moeg(void *arg, int rep) {
    moeg_run *r = arg;
    tern_error err;
    (void)rep;
    int rc = r->per_token ? tern_cuda_moe(r->ex, r->shared, r->sg, r->x, r->T, r->K, r->ids, r->wts, r->work, r->out,
                                          r->s, &err)
                          : tern_cuda_moe_grouped(r->ex, r->E, r->shared, r->sg, r->x, r->T, r->K, r->ids, r->wts,
                                                  r->work, r->work_bytes, r->out, r->s, &err);
    if (rc) die_err(r->per_token ? "moe" : "moe_grouped", &err);
}

/* out (H) = sum over the token's experts in ascending id of w * E(x), then
 * + sigmoid(x . w_sg) * shared(x). */
static void moeg_ref_token(checker *ck, const moeg_case *c, const expert_fixture *f, const int32_t *ids,
                           const float *wts, const float *xt, float *out) {
    int K = c->K, ord[64];
    for (int k = 0; k < K; k++) {
        int j = k;
        while (j > 0 && ids[ord[j - 1]] > ids[k]) { ord[j] = ord[j - 1]; j--; }
        ord[j] = k;
    }
    memset(out, 0, (size_t)c->H * sizeof(float));
    for (int i = 0; i < K; i++) fixture_ref(ck, f, ids[ord[i]], xt, wts[ord[i]], out);
    if (f->has_shared) fixture_ref_shared(ck, f, xt, out);
}

static void moeg_check(checker *ck, const moeg_case *c, int timed) {
    expert_fixture f;
    fixture_make(ck, &f, c->H, c->I, c->I, c->E, c->bits, c->group, c->use_table, c->shared_kind);
    int T = c->T, K = c->K;
    size_t TH = (size_t)T * c->H;
    int32_t *ids = xmalloc((size_t)T * K * sizeof(int32_t));
    float *wts = xmalloc((size_t)T * K * sizeof(float)), *x = xmalloc(TH * sizeof(float));
    float *ref = xmalloc(TH * sizeof(float)), *got = xmalloc(TH * sizeof(float)), *pt = xmalloc(TH * sizeof(float));
    random_routing(ck, T, K, c->E, ids, wts);
    if (c->skew)
        for (int t = 0; t < T; t++) {
            int has0 = 0;
            for (int k = 0; k < K; k++) has0 |= ids[t * K + k] == 0;
            if (!has0) ids[t * K + (t % K)] = 0;
        }
    rnd_floats(ck, x, TH, 1.0f);
    int32_t *dids = dev_upload(ids, (size_t)T * K * sizeof(int32_t));
    float *dw = dev_upload(wts, (size_t)T * K * sizeof(float)), *dx = dev_upload(x, TH * sizeof(float));
    int64_t Is = c->shared_kind ? c->I : 0;
    size_t wb = tern_cuda_moe_grouped_workspace(T, K, c->E, c->H, c->I, Is);
    size_t pwb = tern_cuda_moe_workspace(T, K, c->I, c->H);
    void *work = dev_alloc(wb), *pwork = dev_alloc(pwb);
    dev_zero(pwork, pwb);
    float *dout = dev_poison(TH), *dpt = dev_poison(TH);
    const tern_expert_w *shp = fixture_shared(&f);
    const tern_mat *sgp = fixture_gate(&f);
    moeg_run r = {&f.ex, c->E, shp, sgp, dx, T, K, dids, dw, work, wb, dout, 0, ck->stream};
    moeg_run p = {&f.ex, c->E, shp, sgp, dx, T, K, dids, dw, pwork, 0, dpt, 1, ck->stream};
    run_moeg(&r, 0);
    run_moeg(&p, 0);
    dev_sync(ck, "moe_grouped");
    dev_download(got, dout, TH * sizeof(float));
    dev_download(pt, dpt, TH * sizeof(float));
    /* the CPU twin on the checked tokens, gathered into ref / sub */
    int every = c->stride_check > 0 ? c->stride_check : 1, n_chk = (T + every - 1) / every;
    float *sub = xmalloc((size_t)n_chk * c->H * sizeof(float));
    for (int i = 0; i < n_chk; i++) {
        int t = i * every;
        moeg_ref_token(ck, c, &f, ids + (size_t)t * K, wts + (size_t)t * K, x + (size_t)t * c->H,
                       ref + (size_t)i * c->H);
        memcpy(sub + (size_t)i * c->H, got + (size_t)t * c->H, (size_t)c->H * sizeof(float));
    }
    char shape[128], sh2[160];
    snprintf(shape, sizeof shape, "q%d g%d %dx(%lld,%lld) top%d T=%d %s%s%s", c->bits, c->group, c->E,
             (long long)c->I, (long long)c->H, K, T, c->use_table ? "table" : "base",
             c->shared_kind == 8 ? "+sh q8" : c->shared_kind == 16 ? "+sh bf16" : "", c->skew ? " skew" : "");
    snprintf(sh2, sizeof sh2, "%s%s", shape, every > 1 ? " (every 16th)" : "");
    report(ck, "moe_grouped", sh2, sub, ref, (size_t)n_chk * c->H, 1e-2);
    snprintf(sh2, sizeof sh2, "%s vs moe", shape);
    report(ck, "moe_grouped~", sh2, got, pt, TH, 1e-2);
    if (timed && ck->time) {
        double flops = 2.0 * T * K * 3.0 * (double)c->I * c->H + (c->shared_kind ? 2.0 * T * 3.0 * Is * c->H : 0);
        double bytes = (double)c->E * f.stride + 2.0 * TH * 4 + fixture_shared_bytes(&f);
        report_rate(ck, "moe_grouped", shape, time_eager(ck, run_moeg, &r, 10), flops, bytes);
        report_rate(ck, "moe (per token)", shape, time_eager(ck, run_moeg, &p, 3), flops, bytes);
    }
    fixture_free(&f);
    void *dbufs[] = {dids, dw, dx, work, pwork, dout, dpt};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) tern_cuda_free(dbufs[i]);
    free(ids); free(wts); free(x); free(ref); free(got); free(pt); free(sub);
}

void check_moe_grouped(checker *ck) {
    moeg_case real = {2048, 512, 256, 8, 4096, 4, 64, 0, 8, 0, 16};
    moeg_check(ck, &real, 1);
    moeg_case piece = {2048, 512, 256, 8, 512, 4, 64, 0, 8, 0, 16};   /* a piece of 512 (debug.piece 512, short prompts) */
    moeg_check(ck, &piece, 1);
    moeg_case one = {2048, 512, 256, 8, 1, 4, 64, 1, 16, 0, 1};
    moeg_check(ck, &one, 0);
    moeg_case q8 = {2048, 512, 64, 8, 200, 8, 32, 0, 0, 0, 1};
    moeg_check(ck, &q8, 0);
    moeg_case skew = {2048, 512, 16, 4, 300, 4, 128, 1, 8, 1, 1};
    moeg_check(ck, &skew, 0);
    moeg_case odd = {256, 96, 12, 3, 77, 4, 32, 1, 8, 0, 1};   /* I = 96: a half-empty column tile */
    moeg_check(ck, &odd, 0);
}
