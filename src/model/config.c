#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/rope.h"
#include "util/err.h"
#include "util/file.h"

typedef struct {
    const char *path;
    json_t *text;     /* the object holding the text fields */
    json_t *top;      /* the file's root (flat form: same as text) */
    tern_error *err;
} reader;

static json_t *field(reader *r, const char *key) {
    json_t *v = json_object_get(r->text, key);
    return v ? v : json_object_get(r->top, key);
}

/* A required positive integer field. */
static int req_int(reader *r, const char *key, int *out) {
    json_t *v = field(r, key);
    if (!v) return tern_fail(r->err, "%s: missing field '%s'", r->path, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30))
        return tern_fail(r->err, "%s: field '%s' must be a positive integer", r->path, key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int opt_int(reader *r, const char *key, int dflt, int *out) {
    if (!field(r, key)) { *out = dflt; return 0; }
    return req_int(r, key, out);
}

static int opt_num(reader *r, json_t *obj, const char *key, double dflt, double *out) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v) { *out = dflt; return 0; }
    if (!json_is_number(v)) return tern_fail(r->err, "%s: field '%s' must be a number", r->path, key);
    *out = json_number_value(v);
    return 0;
}

static int read_layer_types(reader *r, tern_config *c) {
    if (c->n_layers > TERN_MAX_LAYERS)
        return tern_fail(r->err, "%s: num_hidden_layers %d exceeds %d", r->path, c->n_layers, TERN_MAX_LAYERS);
    json_t *lt = field(r, "layer_types");
    if (!lt) {
        /* Without layer_types the reference uses full_attention_interval:
         * layer i is full attention when (i + 1) % interval == 0. */
        int interval;
        if (opt_int(r, "full_attention_interval", 4, &interval) != 0) return -1;
        for (int i = 0; i < c->n_layers; i++)
            c->layer_kind[i] = (i + 1) % interval == 0 ? TERN_LAYER_ATTN : TERN_LAYER_GDN;
        return 0;
    }
    if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layers)
        return tern_fail(r->err, "%s: layer_types must list %d layers", r->path, c->n_layers);
    for (int i = 0; i < c->n_layers; i++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)i));
        if (s && strcmp(s, "linear_attention") == 0) c->layer_kind[i] = TERN_LAYER_GDN;
        else if (s && strcmp(s, "full_attention") == 0) c->layer_kind[i] = TERN_LAYER_ATTN;
        else return tern_fail(r->err, "%s: layer_types[%d] is '%s', expected linear_attention or full_attention",
                              r->path, i, s ? s : "(not a string)");
    }
    return 0;
}

/* A number of rp that may be absent or null (absent: *given 0). */
static int yarn_num(reader *r, json_t *rp, const char *key, double *out, int *given) {
    json_t *v = json_object_get(rp, key);
    *given = v && !json_is_null(v);
    if (!*given) return 0;
    if (!json_is_number(v)) return tern_fail(r->err, "%s: rope_parameters.%s must be a number", r->path, key);
    *out = json_number_value(v);
    return 0;
}

/* transformers' reading: beta_fast / beta_slow default (also when 0) to
 * 32 / 1; the native context is the text config's
 * original_max_position_embeddings, else rope_parameters', else
 * max_position_embeddings; a null factor is max_position_embeddings over
 * it; the attention factor, when not given, comes from factor and mscale
 * (model/rope.c). */
static int read_yarn(reader *r, json_t *rp, tern_config *c) {
    tern_rope_cfg *y = &c->rope;
    double native = c->max_pos;
    int given;
    json_t *top = json_object_get(r->text, "original_max_position_embeddings");
    if (top && !json_is_number(top))
        return tern_fail(r->err, "%s: original_max_position_embeddings must be a number", r->path);
    if (top) native = json_number_value(top);
    else if (yarn_num(r, rp, "original_max_position_embeddings", &native, &given) != 0) return -1;
    if (!(native >= 1 && native <= (1 << 30)) || native != floor(native))
        return tern_fail(r->err, "%s: original_max_position_embeddings must be a positive integer", r->path);
    y->native = (int)native;
    if (!json_object_get(rp, "factor"))
        return tern_fail(r->err, "%s: rope_parameters of rope_type 'yarn' needs 'factor'", r->path);
    if (yarn_num(r, rp, "factor", &y->factor, &given) != 0) return -1;
    if (!given) y->factor = (double)c->max_pos / y->native;
    if (!(y->factor >= 1 && y->factor <= (1 << 20)))
        return tern_fail(r->err, "%s: rope_parameters.factor must be in [1, 2^20], got %g", r->path, y->factor);
    if (yarn_num(r, rp, "beta_fast", &y->beta_fast, &given) != 0) return -1;
    if (!given || y->beta_fast == 0) y->beta_fast = 32;
    if (yarn_num(r, rp, "beta_slow", &y->beta_slow, &given) != 0) return -1;
    if (!given || y->beta_slow == 0) y->beta_slow = 1;
    if (!(y->beta_fast > 0 && y->beta_slow > 0))
        return tern_fail(r->err, "%s: rope_parameters.beta_fast and beta_slow must be positive", r->path);
    if (yarn_num(r, rp, "attention_factor", &y->attn_factor, &y->attn_given) != 0) return -1;
    if (y->attn_given && !(y->attn_factor > 0 && y->attn_factor < 1e6))
        return tern_fail(r->err, "%s: rope_parameters.attention_factor must be a positive number", r->path);
    if (yarn_num(r, rp, "mscale", &y->mscale, &given) != 0 ||
        yarn_num(r, rp, "mscale_all_dim", &y->mscale_all_dim, &given) != 0)
        return -1;
    json_t *tr = json_object_get(rp, "truncate");
    if (tr && !json_is_boolean(tr) && !json_is_null(tr))
        return tern_fail(r->err, "%s: rope_parameters.truncate must be true or false", r->path);
    y->truncate = !tr || json_is_true(tr);   /* (null reads as false, as in Python) */
    return 0;
}

static int read_rope(reader *r, tern_config *c) {
    json_t *rp = field(r, "rope_parameters");
    if (!rp) rp = field(r, "rope_scaling");
    if (rp && !json_is_object(rp)) return tern_fail(r->err, "%s: rope_parameters is not an object", r->path);
    json_t *tv = rp ? json_object_get(rp, "rope_type") : NULL;
    if (!tv && rp) tv = json_object_get(rp, "type");   /* the older spelling */
    if (tv && !json_is_string(tv)) return tern_fail(r->err, "%s: rope_parameters.rope_type is not a string", r->path);
    const char *type = tv ? json_string_value(tv) : "default";
    c->rope.type = TERN_ROPE_NONE;
    c->rope.attn_factor = 1;
    if (strcmp(type, "yarn") == 0) {
        c->rope.type = TERN_ROPE_YARN;
        if (read_yarn(r, rp, c) != 0) return -1;
    } else if (strcmp(type, "default") != 0) {
        return tern_fail(r->err, "%s: rope_type '%s' is not supported (tern runs 'default' and 'yarn')", r->path,
                         type);
    }
    c->rope.config_type = c->rope.type;
    double theta, partial;
    if (opt_num(r, r->text, "rope_theta", 10000.0, &theta) != 0) return -1;
    if (opt_num(r, rp, "rope_theta", theta, &theta) != 0) return -1;
    if (opt_num(r, r->text, "partial_rotary_factor", 1.0, &partial) != 0) return -1;
    if (opt_num(r, rp, "partial_rotary_factor", partial, &partial) != 0) return -1;
    if (!(theta > 0) || !(partial > 0 && partial <= 1))
        return tern_fail(r->err, "%s: rope_theta must be > 0 and partial_rotary_factor in (0, 1]", r->path);
    c->rope_theta = theta;
    c->rope_dim = (int)(c->head_dim * partial);
    if (c->rope_dim % 2 != 0 || c->rope_dim == 0)
        return tern_fail(r->err, "%s: rotary dimension %d (head_dim x partial_rotary_factor) must be even and > 0",
                         r->path, c->rope_dim);
    return tern_rope_finish(c, r->path, r->err);
}

static int eos_id(const tern_config *c, json_t *v, const char *path, size_t i, tern_error *err) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->vocab)
        return tern_fail(err, "%s: eos_token_id[%zu] must be a token id in [0, %d)", path, i, c->vocab);
    return (int)json_integer_value(v);
}

/* eos_token_id of obj (an id or a list of ids), each a token of the
 * vocabulary; absent or null leaves c's list as it is. */
static int read_eos(tern_config *c, json_t *obj, const char *path, tern_error *err) {
    json_t *e = json_object_get(obj, "eos_token_id");
    if (!e || json_is_null(e)) return 0;
    if (!json_is_array(e)) {
        int id = eos_id(c, e, path, 0, err);
        if (id < 0) return -1;
        c->n_eos = 1;
        c->eos[0] = id;
        return 0;
    }
    if (json_array_size(e) > TERN_MAX_EOS)
        return tern_fail(err, "%s: eos_token_id lists %zu ids (at most %d)", path, json_array_size(e), TERN_MAX_EOS);
    for (size_t i = 0; i < json_array_size(e); i++)
        if ((c->eos[i] = eos_id(c, json_array_get(e, i), path, i, err)) < 0) return -1;
    c->n_eos = (int)json_array_size(e);
    return 0;
}

static int check_arch(reader *r, tern_config *c) {
    const char *mt = json_string_value(json_object_get(r->top, "model_type"));
    if (!mt) return tern_fail(r->err, "%s: missing field 'model_type'", r->path);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    if (strcmp(mt, "qwen3_5_moe") == 0) {
        r->text = json_object_get(r->top, "text_config");
        if (!json_is_object(r->text))
            return tern_fail(r->err, "%s: model_type qwen3_5_moe needs a 'text_config' object", r->path);
        const char *tt = json_string_value(json_object_get(r->text, "model_type"));
        if (tt && strcmp(tt, "qwen3_5_moe_text") != 0)
            return tern_fail(r->err, "%s: text_config.model_type '%s' is not qwen3_5_moe_text", r->path, tt);
        return 0;
    }
    if (strcmp(mt, "qwen3_5_moe_text") == 0) { r->text = r->top; return 0; }
    return tern_fail(r->err, "%s: unsupported architecture: model_type '%s' (tern runs qwen3_5_moe / qwen3_5_moe_text)",
                     r->path, mt);
}

static int read_fields(reader *r, tern_config *c) {
    if (req_int(r, "hidden_size", &c->hidden) || req_int(r, "num_hidden_layers", &c->n_layers) ||
        req_int(r, "vocab_size", &c->vocab) || req_int(r, "num_attention_heads", &c->n_heads) ||
        req_int(r, "num_key_value_heads", &c->n_kv_heads) ||
        opt_int(r, "head_dim", 0, &c->head_dim) ||
        req_int(r, "linear_num_key_heads", &c->gdn_k_heads) ||
        req_int(r, "linear_num_value_heads", &c->gdn_v_heads) ||
        req_int(r, "linear_key_head_dim", &c->gdn_k_dim) ||
        req_int(r, "linear_value_head_dim", &c->gdn_v_dim) ||
        req_int(r, "linear_conv_kernel_dim", &c->gdn_conv_kernel) ||
        req_int(r, "num_experts", &c->n_experts) || req_int(r, "num_experts_per_tok", &c->top_k) ||
        req_int(r, "moe_intermediate_size", &c->expert_inter) ||
        req_int(r, "shared_expert_intermediate_size", &c->shared_inter) ||
        opt_int(r, "max_position_embeddings", 262144, &c->max_pos))
        return -1;
    if (c->head_dim == 0) c->head_dim = c->hidden / c->n_heads;
    json_t *mtp = field(r, "mtp_num_hidden_layers");
    if (mtp && (!json_is_integer(mtp) || json_integer_value(mtp) < 0 || json_integer_value(mtp) > 1))
        return tern_fail(r->err, "%s: mtp_num_hidden_layers must be 0 or 1 (the layers tern supports)", r->path);
    c->mtp_layers = mtp ? (int)json_integer_value(mtp) : 0;
    double eps;
    if (opt_num(r, r->text, "rms_norm_eps", 1e-6, &eps) != 0) return -1;
    /* as a float: a positive double below float's range would become 0 */
    if (!(eps < 1) || !((float)eps > 0))
        return tern_fail(r->err, "%s: rms_norm_eps must be in (0, 1), got %g", r->path, eps);
    c->norm_eps = (float)eps;
    json_t *tie = field(r, "tie_word_embeddings");
    c->tie_embeddings = json_is_true(tie);
    json_t *ntp = field(r, "norm_topk_prob");
    c->norm_topk = ntp ? json_is_true(ntp) : 1;
    const char *dt = json_string_value(field(r, "dtype"));
    if (!dt) dt = json_string_value(field(r, "torch_dtype"));
    snprintf(c->dtype, sizeof c->dtype, "%s", dt ? dt : "bfloat16");
    return read_eos(c, r->text, r->path, r->err);
}

static int check_consistency(reader *r, tern_config *c) {
    if (c->n_heads % c->n_kv_heads != 0)
        return tern_fail(r->err, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                         r->path, c->n_heads, c->n_kv_heads);
    if (c->gdn_v_heads % c->gdn_k_heads != 0)
        return tern_fail(r->err, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                         r->path, c->gdn_v_heads, c->gdn_k_heads);
    /* the derived sizes are ints: each must fit with room to spare */
    int64_t heads = c->n_heads, kv = c->n_kv_heads, hd = c->head_dim;
    int64_t kdim = (int64_t)c->gdn_k_heads * c->gdn_k_dim, vdim = (int64_t)c->gdn_v_heads * c->gdn_v_dim;
    if (2 * heads * hd > (1 << 30) || kv * hd > (1 << 30) || 2 * kdim + vdim > (1 << 30))
        return tern_fail(r->err, "%s: the attention or linear-attention sizes (heads x head dims) exceed 2^30",
                         r->path);
    if (c->top_k > c->n_experts)
        return tern_fail(r->err, "%s: num_experts_per_tok %d exceeds num_experts %d", r->path, c->top_k,
                         c->n_experts);
    return 0;
}

static int config_from_json(tern_config *c, json_t *root, const char *path, tern_error *err) {
    memset(c, 0, sizeof *c);
    reader r = {path, NULL, root, err};
    int rc = json_is_object(root) ? 0 : tern_fail(err, "%s: not a JSON object", path);
    if (rc == 0) rc = check_arch(&r, c);
    if (rc == 0) rc = read_fields(&r, c);
    if (rc == 0) rc = read_layer_types(&r, c);
    if (rc == 0) rc = read_rope(&r, c);
    if (rc == 0) rc = check_consistency(&r, c);
    return rc;
}

int tern_config_parse(tern_config *c, const char *text, const char *label, tern_error *err) {
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root) return tern_fail(err, "%s: not valid JSON (%s, line %d)", label, jerr.text, jerr.line);
    int rc = config_from_json(c, root, label, err);
    json_decref(root);
    return rc;
}

int tern_config_load(tern_config *c, const char *dir, tern_error *err) {
    memset(c, 0, sizeof *c);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = tern_json_load(path, 0, TERN_JSON_SMALL_MAX, err);
    if (!root) return errno == ENOENT ? tern_fail(err, "%s: no such file", path) : -1;
    int rc = config_from_json(c, root, path, err);
    json_decref(root);
    if (rc != 0) return rc;

    /* generation_config.json's eos list wins over config.json's. */
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *gen = tern_json_load(path, 0, TERN_JSON_SMALL_MAX, err);
    if (gen) {
        rc = json_is_object(gen) ? read_eos(c, gen, path, err) : tern_fail(err, "%s: not a JSON object", path);
        json_decref(gen);
        if (rc != 0) return rc;
    } else if (errno != ENOENT) {
        return -1;
    }
    return 0;
}
