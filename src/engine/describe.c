/* `tern info`: what a model directory holds and what a token costs. The
 * parameter arithmetic follows ../shared/docs/qwen36-model.md §6: the text
 * model without the MTP layer and vision; "active" counts what one decoded
 * token touches (one embedding row, top_k of the routed experts, all else). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "model/config.h"
#include "model/manifest.h"
#include "model/packed.h"
#include "model/rope.h"
#include "model/tensors.h"
#include "util/err.h"

typedef struct {
    double embed, lm_head, norms, gdn, attn, router, routed, shared;
} param_parts;

static param_parts count_params(const tern_config *c) {
    param_parts p = {0};
    double H = c->hidden, V = c->vocab;
    double vd = tern_cfg_gdn_value_dim(c), conv = tern_cfg_gdn_conv_dim(c);
    double nv = c->gdn_v_heads, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    p.embed = V * H;
    p.lm_head = c->tie_embeddings ? 0 : V * H;
    p.norms = H;   /* final norm */
    for (int l = 0; l < c->n_layers; l++) {
        p.norms += 2 * H;
        if (c->layer_kind[l] == TERN_LAYER_GDN)
            p.gdn += conv * H + vd * H + 2 * nv * H + conv * c->gdn_conv_kernel + 2 * nv + c->gdn_v_dim + H * vd;
        else
            p.attn += nh * 2 * hd * H + 2 * nkv * hd * H + H * nh * hd + 2 * hd;
        p.router += (double)c->n_experts * H;
        p.routed += (double)c->n_experts * 3 * c->expert_inter * H;
        p.shared += 3.0 * c->shared_inter * H + H;
    }
    return p;
}

static double total_of(const param_parts *p) {
    return p->embed + p->lm_head + p->norms + p->gdn + p->attn + p->router + p->routed + p->shared;
}

static double active_of(const param_parts *p, const tern_config *c) {
    return p->embed / c->vocab + p->lm_head + p->norms + p->gdn + p->attn + p->router +
           p->routed * c->top_k / c->n_experts + p->shared;
}

static void print_count(FILE *out, const char *label, double n) {
    char digits[64], grouped[96];
    snprintf(digits, sizeof digits, "%.0f", n);
    size_t len = strlen(digits), j = 0;
    for (size_t i = 0; i < len; i++) {
        if (i && (len - i) % 3 == 0) grouped[j++] = ',';
        grouped[j++] = digits[i];
    }
    grouped[j] = '\0';
    if (n >= 1e9) fprintf(out, "  %-22s %8.2f B  (%s)\n", label, n / 1e9, grouped);
    else fprintf(out, "  %-22s %8.2f M  (%s)\n", label, n / 1e6, grouped);
}

/* ---- tensor inventory: tensors grouped by name with layer/expert indices
 * replaced by N/E, so 40 layers x 256 experts print as one line. ---------- */

typedef struct {
    char key[160];
    int count, dtype, ndim;
    int64_t shape[TERN_MAX_DIMS];
    double numel, bytes;
} group;

static void group_key(const char *name, char *key, size_t n) {
    size_t j = 0;
    for (const char *p = name; *p && j + 2 < n;) {
        int after_layers = p - name >= 7 && strncmp(p - 7, "layers.", 7) == 0;
        int after_experts = p - name >= 8 && strncmp(p - 8, "experts.", 8) == 0;
        if ((after_layers || after_experts) && isdigit((unsigned char)*p)) {
            key[j++] = after_layers ? 'N' : 'E';
            while (isdigit((unsigned char)*p)) p++;
        } else {
            key[j++] = *p++;
        }
    }
    key[j] = '\0';
}

static int cmp_group(const void *a, const void *b) {
    return strcmp(((const group *)a)->key, ((const group *)b)->key);
}

static void print_inventory(FILE *out, const tern_tensor_set *ts, double *text_params) {
    int cap = 64, n = 0;
    group *g = calloc((size_t)cap, sizeof *g);
    if (!g) return;
    *text_params = 0;
    for (int f = 0; f < ts->n_files; f++)
        for (int i = 0; i < ts->files[f].n_tensors; i++) {
            const tern_tensor *t = &ts->files[f].tensors[i];
            if (strncmp(t->name, "mtp.", 4) != 0 && !strstr(t->name, "visual.") && !strstr(t->name, "audio"))
                *text_params += (double)t->numel;
            char key[160];
            group_key(t->name, key, sizeof key);
            int k = 0;
            while (k < n && strcmp(g[k].key, key) != 0) k++;
            if (k == n) {
                if (n == cap) {
                    group *ng = realloc(g, (size_t)(cap *= 2) * sizeof *g);
                    if (!ng) { free(g); return; }
                    g = ng;
                }
                memset(&g[n], 0, sizeof g[n]);
                snprintf(g[n].key, sizeof g[n].key, "%s", key);
                g[n].dtype = t->dtype;
                g[n].ndim = t->ndim;
                memcpy(g[n].shape, t->shape, sizeof t->shape);
                n++;
            }
            g[k].count++;
            g[k].numel += (double)t->numel;
            g[k].bytes += (double)t->nbytes;
        }
    qsort(g, (size_t)n, sizeof *g, cmp_group);
    fprintf(out, "tensors (%d groups; N = layer, E = expert):\n", n);
    for (int k = 0; k < n; k++) {
        char shape[96];
        size_t off = (size_t)snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < g[k].ndim && off < sizeof shape; d++)
            off += (size_t)snprintf(shape + off, sizeof shape - off, d ? ", %lld" : "%lld", (long long)g[k].shape[d]);
        if (off < sizeof shape) snprintf(shape + off, sizeof shape - off, "]");
        fprintf(out, "  %-60s x%-5d %-5s %-22s %10.1f MB\n", g[k].key, g[k].count, tern_dtype_name(g[k].dtype),
                shape, g[k].bytes / 1e6);
    }
    free(g);
}

/* Bytes per stored element of the big matrices: the dtype of the embedding
 * table when tensors exist, else the config's declared dtype. */
static double dtype_bytes(const tern_config *c, const tern_tensor_set *ts, const char **source) {
    const char *names[] = {"model.language_model.embed_tokens.weight", "model.embed_tokens.weight"};
    for (int i = 0; i < 2; i++) {
        const tern_tensor *t = tern_tensors_get(ts, names[i]);
        if (t) { *source = tern_dtype_name(t->dtype); return (double)tern_dtype_size(t->dtype); }
    }
    *source = c->dtype;
    if (strcmp(c->dtype, "float32") == 0) return 4;
    return 2;
}

/* "1.23 GB" / "45.6 MB" / "7.8 kB" */
static const char *human(double bytes, char *buf, size_t n) {
    if (bytes >= 1e9) snprintf(buf, n, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6) snprintf(buf, n, "%.1f MB", bytes / 1e6);
    else snprintf(buf, n, "%.1f kB", bytes / 1e3);
    return buf;
}

static const char *qclass_names[TERN_QC_COUNT] = {"embed", "attn", "router", "shared", "experts", "head", "mtp_fc"};

/* The same budget on a GPU (--device cuda): VRAM slots for the decoder
 * layers' experts (the MTP layer's stay on the host), every expert's home
 * in page-locked host RAM (docs/CUDA.md). */
static void describe_gpu_budget(const tern_manifest *man, const tern_config *c, uint64_t budget, uint64_t resident,
                                FILE *out) {
    uint64_t per_slot = man->stride * (uint64_t)man->n_layer_files, slots = budget / per_slot;
    if (slots > (uint64_t)man->n_experts) slots = (uint64_t)man->n_experts;
    char b1[32], b2[32], b3[32], b4[32];
    /* two staging buffers of a layer's experts each, for prefill pieces */
    double staging = 2.0 * man->n_experts * man->stride;
    fprintf(out, "on a GPU: %llu slots per decoder layer, VRAM for experts %s and their prefill staging %s (%s with "
                 "resident.bin; the KV cache, input projections and buffers come on top), page-locked host RAM for "
                 "the experts' home %s%s\n",
            (unsigned long long)slots, human((double)slots * per_slot, b1, 32), human(staging, b4, 32),
            human((double)slots * per_slot + staging + resident, b2, 32),
            human((double)man->n_experts * per_slot, b3, 32),
            slots < (uint64_t)c->top_k ? " -- TOO SMALL: fewer slots than top_k experts per token" : "");
}

/* Packed models: quantization, file sizes, bytes per token, and what an
 * expert budget gives. */
static int describe_packed(const char *dir, const tern_config *c, uint64_t budget, FILE *out, tern_error *err) {
    tern_manifest man;
    char label[4200];
    snprintf(label, sizeof label, "%s/manifest.json", dir);
    if (tern_manifest_read(&man, dir, err) != 0) return -1;
    if (tern_packed_check_config(&man, c, label, err) != 0) {
        tern_manifest_free(&man);
        return -1;
    }
    fprintf(out, "packed format v%d, quantization:", man.version);
    for (int q = 0; q < TERN_QC_COUNT; q++)
        fprintf(out, " %s %d%s", qclass_names[q], man.quant[q].bits, man.quant[q].bits == 16 ? "(float)" : "");
    fprintf(out, "\n");
    uint64_t resident = 0, embed = 0;
    for (int i = 0; i < man.n_files; i++)
        if (!strcmp(man.files[i].path, "resident.bin")) resident = man.files[i].size;
    const tern_pk_tensor *e = tern_manifest_tensor(&man, "model.language_model.embed_tokens.weight");
    if (e) embed = e->data.size + e->scales.size + e->biases.size;
    int n_files = man.n_layer_files + (man.mtp_file ? 1 : 0);
    uint64_t experts = (uint64_t)n_files * man.n_experts * man.stride;
    char b1[32], b2[32], b3[32], b4[32];
    fprintf(out, "files: resident.bin %s, %d expert files %s (%d experts x %s blobs)\n", human(resident, b1, 32),
            n_files, human(experts, b2, 32), man.n_experts, human(man.stride, b3, 32));
    /* a token reads every resident tensor but the embedding (one row) and
     * top_k expert blobs per decoder layer */
    double per_token = (double)(resident - embed) + (double)embed / c->vocab +
                       (double)c->top_k * man.stride * man.n_layer_files;
    fprintf(out, "weights read per token: %s\n", human(per_token, b4, 32));
    if (budget) {
        uint64_t slots = budget / (man.stride * (uint64_t)n_files);
        if (slots > (uint64_t)man.n_experts) slots = (uint64_t)man.n_experts;
        fprintf(out, "expert budget %s: %llu slots per layer (%.1f%% of the experts), expert RAM %s, "
                     "total with resident weights %s%s\n",
                human(budget, b1, 32), (unsigned long long)slots, 100.0 * slots / man.n_experts,
                human(slots * man.stride * (double)n_files, b2, 32),
                human(slots * man.stride * (double)n_files + resident, b3, 32),
                slots < (uint64_t)c->top_k ? " -- TOO SMALL: fewer slots than top_k experts per token" : "");
        describe_gpu_budget(&man, c, budget, resident, out);
    }
    tern_manifest_free(&man);
    return 0;
}

int tern_model_dir_probe(const char *dir, const tern_load_params *params, int ctx, tern_model_dir_info *out,
                         tern_error *err) {
    tern_config c;
    if (tern_config_load(&c, dir, err) != 0 || tern_rope_apply(&c, params, err) != 0) return -1;
    if (ctx > 0 && tern_cfg_check_context(&c, ctx, err) != 0) return -1;
    memset(out, 0, sizeof *out);
    out->max_context = tern_cfg_max_context(&c);
    out->vocab_size = c.vocab;
    for (int i = 0; i < c.n_eos && out->n_eos < TERN_SAMPLER_MAX_EOS; i++) out->eos[out->n_eos++] = c.eos[i];
    return 0;
}

int tern_model_describe(const char *dir, const tern_load_params *params, FILE *out, tern_error *err) {
    tern_config c;
    if (tern_config_load(&c, dir, err) != 0 || tern_rope_apply(&c, params, err) != 0) return -1;
    uint64_t expert_budget = params ? params->expert_budget : 0;
    tern_tensor_set ts;
    if (tern_tensors_open(&ts, dir, 1, err) != 0) return -1;

    int n_attn = 0;
    for (int l = 0; l < c.n_layers; l++) n_attn += c.layer_kind[l] == TERN_LAYER_ATTN;
    fprintf(out, "model: %s (%s)\n", dir, c.model_type);
    fprintf(out, "architecture: %d layers (%d Gated DeltaNet, %d gated attention), hidden %d, vocab %d\n",
            c.n_layers, c.n_layers - n_attn, n_attn, c.hidden, c.vocab);
    fprintf(out, "  attention: %d q heads, %d kv heads, head_dim %d, rotary dims %d, theta %g\n", c.n_heads,
            c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_theta);
    fprintf(out, "  deltanet: %d k heads x %d, %d v heads x %d, conv kernel %d\n", c.gdn_k_heads, c.gdn_k_dim,
            c.gdn_v_heads, c.gdn_v_dim, c.gdn_conv_kernel);
    fprintf(out, "  moe: %d experts, top %d, expert intermediate %d, shared intermediate %d\n", c.n_experts,
            c.top_k, c.expert_inter, c.shared_inter);
    fprintf(out, "  mtp layers: %d, max positions %d\n", c.mtp_layers, c.max_pos);
    char rope[192];
    tern_rope_describe(&c, rope, sizeof rope);
    fprintf(out, "  rope scaling: %s; context %d positions\n", rope, tern_cfg_max_context(&c));

    if (tern_is_packed_dir(dir)) {
        param_parts p = count_params(&c);
        fprintf(out, "parameters (text model, without MTP and vision):\n");
        print_count(out, "total", total_of(&p));
        print_count(out, "active per token", active_of(&p, &c));
        tern_tensors_close(&ts);
        return describe_packed(dir, &c, expert_budget, out, err);
    }
    double text_params = 0;
    if (ts.n_files == 0) fprintf(out, "tensors: none in %s (config only: counts below come from config.json)\n", dir);
    else print_inventory(out, &ts, &text_params);

    param_parts p = count_params(&c);
    double total = total_of(&p), active = active_of(&p, &c);
    fprintf(out, "parameters (text model, without MTP and vision):\n");
    print_count(out, "total", total);
    print_count(out, "active per token", active);
    if (ts.n_files > 0) print_count(out, "stored text tensors", text_params);
    const char *src;
    double bpe = dtype_bytes(&c, &ts, &src);
    char hb[32];
    fprintf(out, "weights read per token at %s: %s\n", src, human(active * bpe, hb, sizeof hb));
    tern_tensors_close(&ts);
    return 0;
}

/* Weights: every resident tensor a decoder step touches (all but the MTP
 * head's and the embedding table, of which one row), plus top_k expert
 * blobs per layer. State: the KV rows of the context in every attention
 * layer, and each DeltaNet layer's fp32 state read and written. */
uint64_t tern_model_decode_bytes(const tern_model *m, int ctx, int kv_bits) {
    if (!m->packed) return 0;
    const tern_config *c = &m->cfg;
    double bytes = 0;
    for (int i = 0; i < m->man.n_tensors; i++) {
        const tern_pk_tensor *t = &m->man.tensors[i];
        double b = (double)(t->data.size + t->scales.size + t->biases.size);
        if (!strncmp(t->name, "mtp.", 4)) continue;
        if (strstr(t->name, "embed_tokens.")) b /= c->vocab;
        bytes += b;
    }
    bytes += (double)c->top_k * m->man.stride * c->n_layers;
    int row_len = c->n_kv_heads * c->head_dim;
    double kv_row = kv_bits >= 32 || kv_bits == 0 ? 4.0 * row_len
                                                  : (double)tern_kv_row_bytes(row_len, tern_kv_group(c->head_dim), kv_bits);
    double gdn = 2.0 * sizeof(float) * (double)tern_cfg_gdn_state_floats(c);
    for (int l = 0; l < c->n_layers; l++)
        bytes += c->layer_kind[l] == TERN_LAYER_ATTN ? 2.0 * kv_row * ctx : gdn;
    return (uint64_t)bytes;
}
