#include "pack/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu/quant.h"
#include "synth/synth.h"
#include "util/err.h"
#include "util/half.h"

#define RANGE_ALIGN 64
#define BLOB_ALIGN 4096

static const char *const sidecar_names[] = {"config.json",         "generation_config.json", "tokenizer.json",
                                            "tokenizer_config.json", "chat_template.jinja",   "special_tokens_map.json"};
static const char *const part_names[3] = {"gate", "up", "down"};

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---- classification ----------------------------------------------------- */

/* The quantization class of a canonical tensor name, or -1: kept float. */
static int qclass_of(const char *n) {
    if (!strcmp(n, "model.language_model.embed_tokens.weight")) return TERN_QC_EMBED;
    if (!strcmp(n, "lm_head.weight")) return TERN_QC_HEAD;
    if (!strcmp(n, "mtp.fc.weight")) return TERN_QC_MTP_FC;
    if (ends_with(n, ".mlp.gate.weight") || ends_with(n, ".mlp.shared_expert_gate.weight")) return TERN_QC_ROUTER;
    if (strstr(n, ".mlp.shared_expert.") && ends_with(n, "_proj.weight")) return TERN_QC_SHARED;
    if (strstr(n, ".self_attn.") && ends_with(n, "_proj.weight")) return TERN_QC_ATTN;
    if ((strstr(n, ".linear_attn.in_proj") || strstr(n, ".linear_attn.out_proj.")) && ends_with(n, ".weight"))
        return TERN_QC_ATTN;
    return -1;
}

/* MLX stores the (1 + w) RMSNorm weights with the 1 added; the format keeps
 * Hugging Face's w. Those are every norm module's weight (input/post-
 * attention layernorms, the final norm, q_norm/k_norm, and the MTP head's
 * norm, pre_fc_norm_embedding and pre_fc_norm_hidden) except the gated norm
 * of Gated DeltaNet, which multiplies by w itself and is stored unshifted. */
static int mlx_shifted_norm(const pk_source *s, const char *n) {
    if (!s->mlx || !ends_with(n, ".weight") || ends_with(n, "linear_attn.norm.weight")) return 0;
    size_t len = strlen(n) - 7;   /* the module path, without ".weight" */
    const char *last = n + len;
    while (last > n && last[-1] != '.') last--;
    return strstr(last, "norm") != NULL;   /* the rest, ".weight", holds no "norm" */
}

static int is_aux(const char *n) {
    return ends_with(n, ".scales") || ends_with(n, ".biases") || ends_with(n, "_scale_inv");
}

static int float_enc(int dtype) {
    return dtype == PK_F32 ? TERN_ENC_F32 : dtype == PK_F16 ? TERN_ENC_F16 : TERN_ENC_BF16;
}

static int is_float(int dtype) { return dtype == PK_F32 || dtype == PK_F16 || dtype == PK_BF16; }

/* Largest group <= g (halving, not below 32) that divides cols; 0 if none. */
static int choose_group(int64_t cols, int g) {
    while (g > 32 && cols % g != 0) g /= 2;
    return cols % g == 0 ? g : 0;
}

/* ---- source views ------------------------------------------------------- */

static pk_raw *sibling(const pk_source *s, const pk_raw *w, const char *suffix) {
    char name[700];
    size_t n = strlen(w->name);
    if (ends_with(w->name, ".weight") && strcmp(suffix, "_scale_inv") != 0) n -= 6;   /* keep the dot */
    snprintf(name, sizeof name, "%.*s%s", (int)n, w->name, suffix);
    return pk_source_get(s, name);
}

static int check_sb(const pk_raw *w, const pk_raw *sb, int64_t ng, tern_error *err) {
    int same = sb->ndim == w->ndim && is_float(sb->dtype) && sb->shape[sb->ndim - 1] == ng;
    for (int d = 0; same && d < w->ndim - 1; d++) same = sb->shape[d] == w->shape[d];
    if (!same)
        return tern_fail(err, "%s: '%s' does not fit packed weight '%s' (want float [..., %lld])", sb->file,
                         sb->src_name, w->src_name, (long long)ng);
    return 0;
}

/* MLX: packed U32 words [.., rows, cols*bits/32] with .scales/.biases. */
static int mlx_view(const pk_source *s, pk_raw *w, pk_mat *m, tern_error *err) {
    pk_raw *sc = sibling(s, w, "scales"), *bi = sibling(s, w, "biases");
    if (!sc || !bi || w->ndim < 2)
        return tern_fail(err, "%s: '%s' holds U32 packed words but its .scales/.biases are missing", w->file, w->src_name);
    int bits, group;
    if (pk_mlx_params(s, w, sc, &bits, &group, err) != 0) return -1;
    int64_t cols = w->shape[w->ndim - 1] * 32 / bits;
    if (check_sb(w, sc, cols / group, err) || check_sb(w, bi, cols / group, err)) return -1;
    sc->used = bi->used = 1;
    *m = (pk_mat){.storage = PK_STORE_MLX, .w = w, .scales = sc, .biases = bi, .rows = w->shape[w->ndim - 2],
                  .cols = cols, .bits = bits, .group = group};
    return 0;
}

/* FP8 blocks: F8_E4M3 weight [rows, cols] and weight_scale_inv
 * [ceil(rows/b0), ceil(cols/b1)]. */
static int fp8_view(const pk_source *s, pk_raw *w, pk_mat *m, tern_error *err) {
    pk_raw *si = sibling(s, w, "_scale_inv");
    if (w->ndim != 2)
        return tern_fail(err, "%s: '%s': FP8 weights with %d dimensions are not supported (2-D only)", w->file,
                         w->src_name, w->ndim);
    const int *b = s->fp8_block;
    int64_t br = (w->shape[0] + b[0] - 1) / b[0], bc = (w->shape[1] + b[1] - 1) / b[1];
    if (!si || si->ndim != 2 || si->shape[0] != br || si->shape[1] != bc || !is_float(si->dtype))
        return tern_fail(err, "%s: FP8 weight '%s' needs a float weight_scale_inv of shape [%lld, %lld]", w->file,
                         w->src_name, (long long)br, (long long)bc);
    si->used = 1;
    *m = (pk_mat){.storage = PK_STORE_FP8, .w = w, .scales = si, .rows = w->shape[0], .cols = w->shape[1],
                  .block = {b[0], b[1]}};
    return 0;
}

/* A view of a whole tensor: 2-D tensors as matrices, anything else as one
 * row of numel values. */
static int view_of(const pk_source *s, pk_raw *w, pk_mat *m, tern_error *err) {
    if (w->synth) {
        int two = w->ndim == 2;
        *m = (pk_mat){.storage = PK_STORE_SYNTH, .w = w, .rows = two ? w->shape[0] : 1, .cols = two ? w->shape[1] : w->numel};
        return 0;
    }
    if (w->dtype == PK_U32) return mlx_view(s, w, m, err);
    if (w->dtype == PK_F8E4M3) return fp8_view(s, w, m, err);
    if (!is_float(w->dtype))
        return tern_fail(err, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16, MLX U32, F8_E4M3)", w->file,
                         w->src_name, w->dtype_name);
    int two = w->ndim == 2;
    *m = (pk_mat){.storage = PK_STORE_FLOAT, .w = w, .rows = two ? w->shape[0] : 1,
                  .cols = two ? w->shape[1] : w->numel};
    return 0;
}

/* ---- encodings ---------------------------------------------------------- */

static void note_class(pk_plan *p, int qc, int bits, int group, int *seen) {
    if (qc < 0 || seen[qc]) return;
    seen[qc] = 1;
    p->man.quant[qc].bits = bits;
    p->man.quant[qc].group = group;
}

/* The output encoding of a view in quantization class qc (-1 = none). */
static int decide(pk_plan *p, const pk_mat *m, int qc, int shift, const pk_options *o, int *seen, tern_pk_tensor *t,
                  int *mode, tern_error *err) {
    if (m->storage == PK_STORE_MLX) {
        if (qc >= 0 && o->explicit_bits[qc] && o->explicit_bits[qc] != m->bits)
            return tern_fail(err, "%s: '%s' is already %d-bit (MLX); tern pack copies MLX bits and does not "
                             "re-quantize: drop the %s bits option", m->w->file, m->w->src_name, m->bits,
                             tern_qclass_name(qc));
        t->encoding = m->bits == 4 ? TERN_ENC_Q4 : TERN_ENC_Q8;
        t->group = m->group;
        *mode = PK_MODE_MLX;
        note_class(p, qc, m->bits, m->group, seen);
        return 0;
    }
    int bits = qc >= 0 ? o->bits[qc] : 16;
    int group = bits != 16 ? choose_group(m->cols, o->group) : 0;
    if (group) {
        t->encoding = bits == 4 ? TERN_ENC_Q4 : TERN_ENC_Q8;
        t->group = group;
        *mode = PK_MODE_QUANT;
    } else {
        t->encoding = m->storage == PK_STORE_FLOAT || m->storage == PK_STORE_SYNTH ? float_enc(m->w->dtype)
                                                                                   : TERN_ENC_BF16;
        t->group = 0;
        *mode = m->storage == PK_STORE_FLOAT && !shift ? PK_MODE_COPY : PK_MODE_FLOAT;
    }
    if (m->storage == PK_STORE_SYNTH) *mode = PK_MODE_SYNTH;
    note_class(p, qc, o->bits[qc < 0 ? 0 : qc], o->group, seen);
    return 0;
}

static uint64_t place(uint64_t *cursor, tern_range *r, uint64_t size) {
    r->off = align_up(*cursor, RANGE_ALIGN);
    r->size = size;
    *cursor = r->off + size;
    return *cursor;
}

static void place_tensor(uint64_t *cursor, tern_pk_tensor *t) {
    uint64_t data, scales;
    tern_pk_tensor_bytes(t, &data, &scales);
    place(cursor, &t->data, data);
    if (scales) {
        place(cursor, &t->scales, scales);
        place(cursor, &t->biases, scales);
    }
}

/* ---- routed experts ----------------------------------------------------- */

typedef struct {
    pk_plan *p;
    const pk_source *s;
    const tern_config *c;
    const pk_options *o;
    int seen[TERN_QC_COUNT];
    tern_error *err;
} builder;

/* Hugging Face fused: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]. */
static int experts_fused(builder *b, const char *P, pk_item *out, int *found) {
    char name[300];
    snprintf(name, sizeof name, "%sexperts.gate_up_proj", P);
    pk_raw *gu = pk_source_get(b->s, name);
    snprintf(name, sizeof name, "%sexperts.down_proj", P);
    pk_raw *dn = pk_source_get(b->s, name);
    if (!gu) return 0;
    int64_t E = b->c->n_experts, I = b->c->expert_inter, H = b->c->hidden;
    if (!dn) return tern_fail(b->err, "missing tensor '%s' (beside %s)", name, gu->src_name);
    if (!is_float(gu->dtype) || !is_float(dn->dtype) || gu->ndim != 3 || dn->ndim != 3 || gu->shape[0] != E ||
        gu->shape[1] != 2 * I || gu->shape[2] != H || dn->shape[0] != E || dn->shape[1] != H || dn->shape[2] != I)
        return tern_fail(b->err, "%s: '%s'/'%s' must be float [%lld, %lld, %lld] and [%lld, %lld, %lld]", gu->file,
                         gu->src_name, dn->src_name, (long long)E, (long long)(2 * I), (long long)H, (long long)E,
                         (long long)H, (long long)I);
    gu->used = dn->used = 1;
    for (int64_t e = 0; e < E; e++) {
        int st = gu->synth ? PK_STORE_SYNTH : PK_STORE_FLOAT;
        pk_mat g = {.storage = st, .w = gu, .slice = e, .rows = I, .cols = H};
        out[e * 3 + 0].src = g;
        g.row0 = I;
        out[e * 3 + 1].src = g;
        out[e * 3 + 2].src = (pk_mat){.storage = st, .w = dn, .slice = e, .rows = H, .cols = I};
    }
    *found = 1;
    return 0;
}

/* MLX: switch_mlp.{gate,up,down}_proj stacked [E, ...], packed or float. */
static int experts_switch(builder *b, const char *P, pk_item *out, int *found) {
    for (int part = 0; part < 3; part++) {
        char name[300];
        snprintf(name, sizeof name, "%sswitch_mlp.%s_proj.weight", P, part_names[part]);
        pk_raw *w = pk_source_get(b->s, name);
        if (!w) {
            if (part == 0) return 0;
            return tern_fail(b->err, "missing tensor '%s'", name);
        }
        pk_mat m;
        if (w->ndim != 3 || w->shape[0] != b->c->n_experts)
            return tern_fail(b->err, "%s: '%s' must be stacked [%d, ...]", w->file, w->src_name, b->c->n_experts);
        if (w->dtype == PK_U32) {
            if (mlx_view(b->s, w, &m, b->err) != 0) return -1;
        } else if (is_float(w->dtype)) {
            m = (pk_mat){.storage = PK_STORE_FLOAT, .w = w, .rows = w->shape[1], .cols = w->shape[2]};
        } else {
            return tern_fail(b->err, "%s: '%s' has dtype %s", w->file, w->src_name, w->dtype_name);
        }
        w->used = 1;
        for (int64_t e = 0; e < b->c->n_experts; e++) {
            out[e * 3 + part].src = m;
            out[e * 3 + part].src.slice = e;
        }
    }
    *found = 1;
    return 0;
}

/* Per expert: experts.{e}.{gate,up,down}_proj.weight, float or FP8. */
static int experts_split(builder *b, const char *P, pk_item *out, int *found) {
    char name[300];
    snprintf(name, sizeof name, "%sexperts.0.gate_proj.weight", P);
    if (!pk_source_get(b->s, name)) return 0;
    for (int64_t e = 0; e < b->c->n_experts; e++)
        for (int part = 0; part < 3; part++) {
            snprintf(name, sizeof name, "%sexperts.%lld.%s_proj.weight", P, (long long)e, part_names[part]);
            pk_raw *w = pk_source_get(b->s, name);
            if (!w) return tern_fail(b->err, "missing tensor '%s'", name);
            if (w->ndim != 2) return tern_fail(b->err, "%s: '%s' must be 2-D", w->file, w->src_name);
            if (view_of(b->s, w, &out[e * 3 + part].src, b->err) != 0) return -1;
            w->used = 1;
        }
    *found = 1;
    return 0;
}

/* Shapes from the config, and one storage per part: the part's encoding
 * and copy mode are decided once, from expert 0. */
static int check_expert_shapes(builder *b, const pk_item *x, const char *P) {
    int64_t I = b->c->expert_inter, H = b->c->hidden;
    for (int64_t e = 0; e < b->c->n_experts; e++)
        for (int part = 0; part < 3; part++) {
            const pk_mat *m = &x[e * 3 + part].src, *m0 = &x[part].src;
            int64_t rows = part == 2 ? H : I, cols = part == 2 ? I : H;
            if (m->storage != m0->storage || m->w->dtype != m0->w->dtype)
                return tern_fail(b->err, "%s: %sexperts %lld %s is stored as %s but expert 0's as %s", m->w->file, P,
                                 (long long)e, part_names[part], m->w->dtype_name, m0->w->dtype_name);
            if (m->rows != rows || m->cols != cols)
                return tern_fail(b->err, "%s: %sexperts %lld %s is [%lld, %lld] but the config implies [%lld, %lld]",
                                 m->w->file, P, (long long)e, part_names[part], (long long)m->rows, (long long)m->cols,
                                 (long long)rows, (long long)cols);
        }
    return 0;
}

/* Decides the blob encodings from the first expert file and holds every
 * other file to them: one blob layout serves every layer. */
static int expert_encodings(builder *b, pk_item *x, int file, const char *P) {
    for (int part = 0; part < 3; part++) {
        tern_pk_tensor t = {0};
        int mode;
        if (decide(b->p, &x[part].src, TERN_QC_EXPERTS, 0, b->o, b->seen, &t, &mode, b->err) != 0) return -1;
        tern_pk_tensor *pt = &b->p->man.parts[part];
        if (file == 0) {
            pt->encoding = t.encoding;
            pt->group = t.group;
        } else if (pt->encoding != t.encoding || pt->group != t.group) {
            return tern_fail(b->err, "%sexperts: %s would be %s/group %d but layer 0's is %s/group %d: every expert "
                             "file must share one blob layout", P, part_names[part], tern_encoding_name(t.encoding),
                             t.group, tern_encoding_name(pt->encoding), pt->group);
        }
        for (int64_t e = 0; e < b->c->n_experts; e++) x[e * 3 + part].mode = mode;
    }
    return 0;
}

static int find_experts(builder *b, const char *P, int file, int required) {
    pk_item *x = &b->p->experts[(int64_t)file * b->c->n_experts * 3];
    int found = 0;
    if (experts_fused(b, P, x, &found) || (!found && experts_switch(b, P, x, &found)) ||
        (!found && experts_split(b, P, x, &found)))
        return -1;
    if (!found) {
        if (!required) return 1;
        return tern_fail(b->err, "no routed experts for '%s' (looked for %sexperts.gate_up_proj, "
                         "%sexperts.0.gate_proj.weight and %sswitch_mlp.gate_proj.weight)", P, P, P, P);
    }
    return check_expert_shapes(b, x, P) || expert_encodings(b, x, file, P) ? -1 : 0;
}

static int plan_experts(builder *b) {
    pk_plan *p = b->p;
    const tern_config *c = b->c;
    int files = c->n_layers + 1;
    p->experts = calloc((size_t)files * (size_t)c->n_experts * 3, sizeof *p->experts);
    p->man.layer_files = calloc((size_t)c->n_layers, sizeof *p->man.layer_files);
    if (!p->experts || !p->man.layer_files) return tern_fail(b->err, "out of memory");
    for (int i = 0; i < c->n_layers; i++) {
        char P[96];
        snprintf(P, sizeof P, "model.language_model.layers.%d.mlp.", i);
        if (find_experts(b, P, i, 1) != 0) return -1;
        if (asprintf(&p->man.layer_files[i], "experts/layer_%03d.bin", i) < 0) return tern_fail(b->err, "out of memory");
        p->man.n_layer_files++;
    }
    p->n_expert_files = c->n_layers;
    int rc = find_experts(b, "mtp.layers.0.mlp.", c->n_layers, 0);
    if (rc < 0) return -1;
    if (rc == 0) {
        p->man.mtp_file = strdup("experts/mtp.bin");
        if (!p->man.mtp_file) return tern_fail(b->err, "out of memory");
        p->n_expert_files++;
        p->man.arch.mtp = 1;
    }
    return 0;
}

static void layout_blob(pk_plan *p, int64_t I, int64_t H) {
    uint64_t cursor = 0;
    for (int part = 0; part < 3; part++) {
        tern_pk_tensor *t = &p->man.parts[part];
        t->name = strdup(part_names[part]);
        t->ndim = 2;
        t->shape[0] = part == 2 ? H : I;
        t->shape[1] = part == 2 ? I : H;
        place_tensor(&cursor, t);
    }
    p->man.stride = align_up(cursor, BLOB_ALIGN);
}

/* ---- resident tensors --------------------------------------------------- */

static void output_shape(const pk_source *s, const pk_raw *w, const pk_mat *m, tern_pk_tensor *t) {
    if (m->storage == PK_STORE_MLX) {
        t->ndim = 2;
        t->shape[0] = m->rows;
        t->shape[1] = m->cols;
        return;
    }
    t->ndim = w->ndim;
    for (int d = 0; d < w->ndim && d < 4; d++) t->shape[d] = w->shape[d];
    /* MLX keeps conv1d as [C, K, 1]; the same bytes are HF's [C, 1, K] */
    if (s->mlx && ends_with(w->name, "conv1d.weight") && w->ndim == 3 && w->shape[2] == 1) {
        t->shape[1] = 1;
        t->shape[2] = w->shape[1];
    }
}

static int add_resident(builder *b, pk_raw *w) {
    pk_plan *p = b->p;
    if (strstr(w->name, ".mlp.experts.") || strstr(w->name, ".mlp.switch_mlp."))
        return tern_fail(b->err, "%s: unexpected routed-expert tensor '%s' (num_experts is %d, %d layers)", w->file,
                         w->src_name, b->c->n_experts, b->c->n_layers);
    if (w->ndim < 1 || w->ndim > 4 || w->numel == 0)
        return tern_fail(b->err, "%s: tensor '%s' has %d dimensions / %lld values (1-4 dims, non-empty)", w->file,
                         w->src_name, w->ndim, (long long)w->numel);
    pk_item *it = &p->items[p->man.n_tensors];
    tern_pk_tensor *t = &p->man.tensors[p->man.n_tensors];
    if (view_of(b->s, w, &it->src, b->err) != 0) return -1;
    int shift = mlx_shifted_norm(b->s, w->name);
    if (shift && it->src.storage != PK_STORE_FLOAT)
        return tern_fail(b->err, "%s: norm weight '%s' is quantized", w->file, w->src_name);
    it->src.add = shift ? -1.0f : 0.0f;
    int qc = (w->ndim == 2 || it->src.storage == PK_STORE_MLX) ? qclass_of(w->name) : -1;
    if (decide(p, &it->src, qc, shift, b->o, b->seen, t, &it->mode, b->err) != 0) return -1;
    t->name = strdup(w->name);
    if (!t->name) return tern_fail(b->err, "out of memory");
    output_shape(b->s, w, &it->src, t);
    w->used = 1;
    p->man.n_tensors++;
    return 0;
}

static int plan_resident(builder *b) {
    pk_plan *p = b->p;
    const pk_source *s = b->s;
    p->items = calloc((size_t)s->n_raw + 1, sizeof *p->items);
    p->man.tensors = calloc((size_t)s->n_raw + 1, sizeof *p->man.tensors);
    if (!p->items || !p->man.tensors) return tern_fail(b->err, "out of memory");
    for (int i = 0; i < s->n_raw; i++)
        if (!s->raw[i].used && !is_aux(s->raw[i].name) && add_resident(b, &s->raw[i]) != 0) return -1;
    for (int i = 0; i < s->n_raw; i++)
        if (!s->raw[i].used)
            return tern_fail(b->err, "%s: tensor '%s' belongs to no weight (a .scales/.biases/_scale_inv without "
                             "its weight)", s->raw[i].file, s->raw[i].src_name);
    /* raw tensors are sorted by canonical name: so are the items and the
     * manifest, and resident.bin follows the manifest's order */
    uint64_t cursor = 0;
    for (int i = 0; i < p->man.n_tensors; i++) place_tensor(&cursor, &p->man.tensors[i]);
    p->resident_size = cursor;
    return 0;
}

/* ---- output files ------------------------------------------------------- */

static int add_out(pk_plan *p, const char *path, uint64_t size, tern_error *err) {
    char **paths = realloc(p->out_paths, (size_t)(p->n_out + 1) * sizeof *paths);
    if (paths) p->out_paths = paths;
    uint64_t *sizes = realloc(p->out_sizes, (size_t)(p->n_out + 1) * sizeof *sizes);
    if (sizes) p->out_sizes = sizes;
    if (!paths || !sizes || !(p->out_paths[p->n_out] = strdup(path))) return tern_fail(err, "out of memory");
    p->out_sizes[p->n_out++] = size;
    p->out_bytes += size;
    return 0;
}

static int plan_files(builder *b) {
    pk_plan *p = b->p;
    if (add_out(p, "resident.bin", p->resident_size, b->err) != 0) return -1;
    uint64_t expert_file = (uint64_t)p->man.n_experts * p->man.stride;
    for (int i = 0; i < p->man.n_layer_files; i++)
        if (add_out(p, p->man.layer_files[i], expert_file, b->err) != 0) return -1;
    if (p->man.mtp_file && add_out(p, p->man.mtp_file, expert_file, b->err) != 0) return -1;
    p->first_sidecar = p->n_out;
    if (b->s->synth) return add_out(p, "config.json", strlen(b->s->synth->config_json), b->err);
    for (size_t i = 0; i < sizeof sidecar_names / sizeof *sidecar_names; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", b->s->dir, sidecar_names[i]);
        if (stat(path, &st) != 0) continue;   /* optional (config.json was read already) */
        if (!S_ISREG(st.st_mode)) return tern_fail(b->err, "%s: not a regular file", path);
        if (add_out(p, sidecar_names[i], (uint64_t)st.st_size, b->err) != 0) return -1;
    }
    return 0;
}

static void plan_head(builder *b) {
    pk_plan *p = b->p;
    const tern_config *c = b->c;
    tern_pk_arch *a = &p->man.arch;
    snprintf(a->model_type, sizeof a->model_type, "%s", c->model_type);
    a->hidden = c->hidden;
    a->n_layers = c->n_layers;
    a->n_experts = c->n_experts;
    a->top_k = c->top_k;
    a->expert_inter = c->expert_inter;
    a->vocab = c->vocab;
    p->man.version = TERN_FORMAT_VERSION;
    p->man.n_experts = c->n_experts;
    for (int q = 0; q < TERN_QC_COUNT; q++) {
        p->man.quant[q].bits = b->o->bits[q];
        p->man.quant[q].group = b->o->group;
    }
}

int pk_plan_build(pk_plan *p, const pk_source *s, const tern_config *c, const pk_options *o, tern_error *err) {
    memset(p, 0, sizeof *p);
    builder b = {.p = p, .s = s, .c = c, .o = o, .err = err};
    for (int i = 0; i < s->n_raw; i++) s->raw[i].used = 0;
    plan_head(&b);
    p->man.source_path = strdup(s->dir);
    if (s->has_index) p->man.source_index_sha256 = strdup(s->index_sha256);
    int rc = !p->man.source_path || (s->has_index && !p->man.source_index_sha256) ? tern_fail(err, "out of memory") : 0;
    if (rc == 0) rc = plan_experts(&b);
    if (rc == 0) {
        layout_blob(p, c->expert_inter, c->hidden);
        rc = plan_resident(&b);
    }
    if (rc == 0) rc = plan_files(&b);
    if (rc != 0) pk_plan_free(p);
    return rc;
}

void pk_plan_free(pk_plan *p) {
    tern_manifest_free(&p->man);
    free(p->items);
    free(p->experts);
    for (int i = 0; i < p->n_out; i++) free(p->out_paths[i]);
    free(p->out_paths);
    free(p->out_sizes);
    memset(p, 0, sizeof *p);
}

/* ---- encoding rows ------------------------------------------------------ */

uint64_t pk_row_bytes(const tern_pk_tensor *out, int64_t cols) {
    switch (out->encoding) {
    case TERN_ENC_F32: return (uint64_t)cols * 4;
    case TERN_ENC_Q4: return (uint64_t)cols / 2;
    case TERN_ENC_Q8: return (uint64_t)cols;
    default: return (uint64_t)cols * 2;
    }
}

/* Round to nearest even; overflow to infinity, NaN kept. */
static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u;        /* >= 65520 rounds past 65504 */
    if (a < 0x38800000u) {                              /* below 2^-14: subnormal */
        float v;
        memcpy(&v, &a, sizeof v);
        return sign | (uint16_t)lrintf(v * 16777216.0f);   /* units of 2^-24 */
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;   /* rebias 127 -> 15 */
    return sign | (uint16_t)(r >> 13);
}

static void narrow(const float *in, int64_t n, int enc, uint8_t *out) {
    if (enc == TERN_ENC_F32) { memcpy(out, in, (size_t)n * 4); return; }
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = enc == TERN_ENC_BF16 ? tern_f32_to_bf16(in[i]) : f32_to_f16(in[i]);
        memcpy(out + 2 * i, &h, 2);
    }
}

static void copy_sb(const pk_mat *m, const pk_raw *sb, int64_t r0, int64_t n, int64_t ng, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = pk_mat_sb_row(m, sb, r0 + i);
        if (sb->dtype == PK_BF16) { memcpy(out + i * ng, row, (size_t)ng * 2); continue; }
        for (int64_t g = 0; g < ng; g++) {
            float f;
            uint16_t h;
            if (sb->dtype == PK_F32) memcpy(&f, row + 4 * g, 4);
            else { memcpy(&h, row + 2 * g, 2); f = tern_f16_to_f32(h); }
            out[i * ng + g] = tern_f32_to_bf16(f);
        }
    }
}

void pk_encode_rows(const pk_item *it, const tern_pk_tensor *out, int64_t r0, int64_t n, uint8_t *data,
                    uint16_t *scales, uint16_t *biases, float *scratch) {
    const pk_mat *m = &it->src;
    uint64_t rb = pk_row_bytes(out, m->cols);
    switch (it->mode) {
    case PK_MODE_COPY:
        memcpy(data, pk_mat_float_row(m, r0), (size_t)(rb * (uint64_t)n));
        break;
    case PK_MODE_FLOAT:
        pk_mat_read_f32(m, r0, n, scratch);
        narrow(scratch, n * m->cols, out->encoding, data);
        break;
    case PK_MODE_QUANT:
        pk_mat_read_f32(m, r0, n, scratch);
        tern_quantize(scratch, n, m->cols, out->encoding == TERN_ENC_Q4 ? 4 : 8, out->group, data, scales, biases);
        break;
    case PK_MODE_SYNTH:
        if (scales && synth_direct_q(m->w->synth)) {
            synth_rows_q(m->w->synth, m->slice, m->row0 + r0, n, m->cols, out->encoding == TERN_ENC_Q4 ? 4 : 8,
                         out->group, data, scales, biases);
            break;
        }
        synth_rows_f32(m->w->synth, m->slice, m->row0 + r0, n, m->cols, scratch);
        if (scales) tern_quantize(scratch, n, m->cols, out->encoding == TERN_ENC_Q4 ? 4 : 8, out->group, data, scales, biases);
        else narrow(scratch, n * m->cols, out->encoding, data);
        break;
    case PK_MODE_MLX:
        for (int64_t i = 0; i < n; i++) memcpy(data + (size_t)(i * (int64_t)rb), pk_mat_q_row(m, r0 + i), (size_t)rb);
        copy_sb(m, m->scales, r0, n, m->cols / m->group, scales);
        copy_sb(m, m->biases, r0, n, m->cols / m->group, biases);
        break;
    }
}

void pk_encode_blob(const pk_plan *p, int file, int e, uint8_t *blob, float *scratch) {
    for (int part = 0; part < 3; part++) {
        const tern_pk_tensor *t = &p->man.parts[part];
        pk_encode_rows(pk_plan_expert(p, file, e, part), t, 0, t->shape[0], blob + t->data.off,
                       t->scales.size ? (uint16_t *)(blob + t->scales.off) : NULL,
                       t->biases.size ? (uint16_t *)(blob + t->biases.off) : NULL, scratch);
    }
}

size_t pk_blob_scratch_floats(const pk_plan *p) {
    int64_t most = 0;
    for (int part = 0; part < 3; part++) {
        int64_t n = p->man.parts[part].shape[0] * p->man.parts[part].shape[1];
        if (n > most) most = n;
    }
    return (size_t)most;
}
