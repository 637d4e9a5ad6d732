/* The request fields several APIs share, conversations, prompt building. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "server/api.h"

/* ---- errors ------------------------------------------------------------ */

int srv_fail(srv_err *e, int status, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = NULL;
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *openai_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static const char *anthropic_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

json_t *srv_error_json(srv_api_kind api, const srv_err *e) {
    json_t *msg = srv_json_bytes(e->msg, strlen(e->msg));
    if (api == SRV_API_ANTHROPIC)
        return json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type",
                         e->type ? e->type : anthropic_type(e->status), "message", msg);
    return json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", msg, "type",
                     e->type ? e->type : openai_type(e->status), "param",
                     e->param[0] ? json_string(e->param) : json_null(), "code",
                     e->code ? json_string(e->code) : json_null());
}

/* ---- fields ------------------------------------------------------------ */

int srv_absent(json_t *req, const char *key) {
    json_t *v = json_object_get(req, key);
    return !v || json_is_null(v);
}

int srv_check_model(const srv_ctx *c, json_t *req, int required, srv_err *e) {
    json_t *v = json_object_get(req, "model");
    if (!v || json_is_null(v)) return required ? srv_fail(e, 400, "model", "model: a model name is required") : 0;
    if (!json_is_string(v)) return srv_fail(e, 400, "model", "model must be a string");
    if (c->strict_model && strcmp(json_string_value(v), c->model_id) != 0 && !srv_model_is_fast(c, json_string_value(v))) {
        srv_fail(e, 404, "model", "model '%.200s' is not served here (this server serves '%.200s')",
                 json_string_value(v), c->model_id);
        e->code = "model_not_found";
        return -1;
    }
    return 0;
}

int srv_get_bool(json_t *req, const char *key, int dflt, int *out, srv_err *e) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    if (!json_is_boolean(v)) return srv_fail(e, 400, key, "%s must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

int srv_get_int(json_t *req, const char *key, long long lo, long long hi, long long dflt, long long *out,
                srv_err *e) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return srv_fail(e, 400, key, "%s must be an integer", key);
    if (x < lo || x > hi) return srv_fail(e, 400, key, "%s must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

int srv_get_number(json_t *req, const char *key, double lo, double hi, double dflt, double *out, srv_err *e) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) { *out = dflt; return 0; }
    if (!json_is_number(v)) return srv_fail(e, 400, key, "%s must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return srv_fail(e, 400, key, "%s must be in [%g, %g], got %g", key, lo, hi, x);
    *out = x;
    return 0;
}

static uint64_t random_u64(void) {
    uint64_t x;
    if (getrandom(&x, sizeof x, 0) == (ssize_t)sizeof x) return x;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)t.tv_sec;
}

/* mtp (a tern extension): drafts a step of speculative decoding, or
 * "auto" (TERN_MTP_AUTO). */
static int parse_mtp(const srv_ctx *c, json_t *req, srv_job *j, srv_err *e) {
    long long n = TERN_MTP_AUTO;
    json_t *v = json_object_get(req, "mtp");
    if (json_is_string(v) && strcmp(json_string_value(v), "auto"))
        return srv_fail(e, 400, "mtp", "mtp must be an integer in [0, %d] or \"auto\"", TERN_MTP_MAX_DEPTH);
    if (!json_is_string(v) && srv_get_int(req, "mtp", 0, TERN_MTP_MAX_DEPTH, c->mtp, &n, e)) return -1;
    if (n && c->mtp_why) return srv_fail(e, 400, "mtp", "mtp: %s", c->mtp_why);
    j->mtp = (int)n;
    return 0;
}

int srv_parse_sampling(const srv_ctx *c, json_t *req, double max_temp, srv_job *j, srv_err *e) {
    tern_sampler_params *out = &j->sampling;
    *out = c->sampling;
    double t, p, mp, pp, fp, rp;
    long long k, seed;
    if (parse_mtp(c, req, j, e)) return -1;
    if (srv_get_number(req, "temperature", 0, max_temp, NAN, &t, e) ||
        srv_get_number(req, "top_p", 0, 1, NAN, &p, e) || srv_get_int(req, "top_k", -1, 1 << 30, -2, &k, e) ||
        srv_get_number(req, "min_p", 0, 1, NAN, &mp, e) ||
        srv_get_number(req, "presence_penalty", -2, 2, NAN, &pp, e) ||
        srv_get_number(req, "frequency_penalty", -2, 2, NAN, &fp, e) ||
        srv_get_number(req, "repetition_penalty", 0.01, 10, NAN, &rp, e) ||
        srv_get_int(req, "seed", INT64_MIN, INT64_MAX, 0, &seed, e))
        return -1;
    if (!isnan(t)) { out->temperature = (float)t; out->do_sample = t > 0; }
    if (!isnan(p)) {
        if (p <= 0) return srv_fail(e, 400, "top_p", "top_p must be in (0, 1], got %g", p);
        out->top_p = (float)p;
    }
    if (k != -2) out->top_k = k < 0 ? 0 : (int)k;
    if (!isnan(mp)) out->min_p = (float)mp;
    if (!isnan(pp)) out->presence_penalty = (float)pp;
    if (!isnan(fp)) out->frequency_penalty = (float)fp;
    if (!isnan(rp)) out->repetition_penalty = (float)rp;
    out->seed = !srv_absent(req, "seed") ? (uint64_t)seed : c->fixed_seed ? c->sampling.seed : random_u64();
    return 0;
}

static int add_stop(srv_job *j, json_t *s, const char *key, srv_err *e) {
    if (!json_is_string(s)) return srv_fail(e, 400, key, "%s must be a string or a list of strings", key);
    if (json_string_length(s) == 0) return srv_fail(e, 400, key, "%s: stop strings must not be empty", key);
    if (strlen(json_string_value(s)) != json_string_length(s))
        return srv_fail(e, 400, key, "%s: stop strings must not hold NUL characters", key);
    if (json_string_length(s) > 1024) return srv_fail(e, 400, key, "%s: a stop string is at most 1024 bytes", key);
    for (int i = 0; i < j->n_stop; i++)
        if (!strcmp(j->stop[i], json_string_value(s))) return 0;
    if (j->n_stop == SRV_MAX_STOP) return srv_fail(e, 400, key, "%s: at most %d stop strings", key, SRV_MAX_STOP);
    return srv_job_add_stop(j, json_string_value(s)) ? srv_fail(e, 500, NULL, "out of memory") : 0;
}

int srv_parse_stop(json_t *req, const char *key, srv_job *j, srv_err *e) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return add_stop(j, v, key, e);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) if (add_stop(j, s, key, e)) return -1;
    return 0;
}

int srv_parse_ignore_eos(const srv_ctx *c, json_t *req, srv_job *j, srv_err *e) {
    return srv_get_bool(req, "ignore_eos", c->ignore_eos, &j->ignore_eos, e);
}

int srv_parse_max_tokens(const srv_ctx *c, json_t *req, const char *key, int required, int dflt, srv_job *j,
                         srv_err *e) {
    long long n;
    if (required && srv_absent(req, key)) return srv_fail(e, 400, key, "%s: field required", key);
    if (srv_get_int(req, key, 1, INT32_MAX, dflt, &n, e)) return -1;
    int room = c->n_ctx - j->n_prompt;
    j->max_tokens = n < 0 || n > room ? room : (int)n;
    return 0;
}

/* ---- tools ------------------------------------------------------------- */

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 128) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-' || *s == '.' || *s == ':'))
            return 0;
    return 1;
}

int srv_check_tools(json_t *tools, const char *param, json_t **out, srv_err *e) {
    *out = NULL;
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return srv_fail(e, 400, param, "%s must be a list", param);
    size_t i;
    json_t *t;
    char where[96];
    json_array_foreach(tools, i, t) {
        snprintf(where, sizeof where, "%s[%zu]", param, i);
        json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        if (!json_is_object(t)) return srv_fail(e, 400, where, "%s must be an object", where);
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return srv_fail(e, 400, where, "%s: only tools of type \"function\" are supported, got %s%.64s%s", where,
                            json_is_string(type) ? "\"" : "",
                            json_is_string(type) ? json_string_value(type) : "no type", json_is_string(type) ? "\"" : "");
        if (!json_is_object(fn)) return srv_fail(e, 400, where, "%s.function must be an object", where);
        json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters"),
               *desc = json_object_get(fn, "description");
        if (!json_is_string(name) || !valid_name(json_string_value(name)))
            return srv_fail(e, 400, where, "%s.function.name must be 1-128 letters, digits, '_', '-', '.' or ':'",
                            where);
        if (params && !json_is_null(params) && !json_is_object(params))
            return srv_fail(e, 400, where, "%s.function.parameters must be a JSON Schema object", where);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return srv_fail(e, 400, where, "%s.function.description must be a string", where);
        for (size_t k = 0; k < i; k++) {
            json_t *other = json_object_get(json_object_get(json_array_get(tools, k), "function"), "name");
            if (json_equal(other, name))
                return srv_fail(e, 400, where, "%s: two tools are named '%s'", where, json_string_value(name));
        }
    }
    *out = json_array_size(tools) ? json_incref(tools) : NULL;
    return 0;
}

/* ---- conversations ----------------------------------------------------- */

json_t *srv_text_content(json_t *content, const char *param, const char *sep, srv_err *e) {
    if (!content || json_is_null(content)) return json_string("");
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) {
        srv_fail(e, 400, param, "%s must be a string or a list of content parts", param);
        return NULL;
    }
    sbuf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        const char *t = json_string_value(type);
        if (!t) {
            srv_fail(e, 400, param, "%s[%zu] needs a type", param, i);
            break;
        }
        if (!strcmp(t, "text") || !strcmp(t, "input_text") || !strcmp(t, "output_text")) {
            if (!json_is_string(text)) {
                srv_fail(e, 400, param, "%s[%zu].text must be a string", param, i);
                break;
            }
            if (i) sbuf_puts(&b, sep);
            sbuf_add(&b, json_string_value(text), json_string_length(text));
        } else if (!strcmp(t, "refusal")) {
            json_t *r = json_object_get(part, "refusal");
            if (json_is_string(r)) sbuf_add(&b, json_string_value(r), json_string_length(r));
        } else {
            srv_fail(e, 400, param, "%s[%zu]: content of type '%.64s' is not supported (text only)", param, i, t);
            break;
        }
    }
    json_t *out = NULL;
    if (i == json_array_size(content)) out = b.oom ? NULL : json_stringn(b.data ? b.data : "", b.len);
    if (!out && i == json_array_size(content)) srv_fail(e, 500, NULL, "out of memory");
    sbuf_free(&b);
    return out;
}

void srv_late_system_as_user(json_t *msgs) {
    int began = 0;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        int sys = role && (!strcmp(role, "system") || !strcmp(role, "developer"));
        if (sys && began) {   /* (a copy: the item may be a stored conversation's) */
            json_t *u = json_copy(m);
            json_object_set_new(u, "role", json_string("user"));
            json_array_set_new(msgs, i, u);
        }
        began |= !sys;
    }
}

/* The ids of the calls an assistant message made, not yet answered. */
typedef struct pending {
    json_t *ids;                     /* array of strings */
} pending;

static int pending_has(pending *p, const char *id, size_t *at) {
    size_t i;
    json_t *v;
    json_array_foreach(p->ids, i, v) if (!strcmp(json_string_value(v), id)) { *at = i; return 1; }
    return 0;
}

static int check_tool_calls(json_t *calls, const char *where, pending *p, srv_err *e) {
    if (!json_is_array(calls)) return srv_fail(e, 400, where, "%s.tool_calls must be a list", where);
    size_t i, at;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *id = json_object_get(call, "id"), *fn = json_object_get(call, "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_string(id) || !json_string_length(id))
            return srv_fail(e, 400, where, "%s.tool_calls[%zu].id must be a non-empty string", where, i);
        if (!json_is_object(fn) || !json_is_string(name))
            return srv_fail(e, 400, where, "%s.tool_calls[%zu].function.name must be a string", where, i);
        if (args && !json_is_null(args) && !json_is_object(args)) {
            json_t *parsed = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : NULL;
            int ok = json_string_length(args) == 0 || json_is_object(parsed);
            json_decref(parsed);
            if (!ok)
                return srv_fail(e, 400, where, "%s.tool_calls[%zu].function.arguments must be a JSON object", where, i);
        }
        if (pending_has(p, json_string_value(id), &at))
            return srv_fail(e, 400, where, "%s.tool_calls[%zu]: the id '%.64s' is used twice", where, i,
                            json_string_value(id));
        json_array_append(p->ids, id);
    }
    return 0;
}

static int check_unanswered(pending *p, const char *where, srv_err *e) {
    if (!json_array_size(p->ids)) return 0;
    return srv_fail(e, 400, where, "%s: the tool call '%.64s' was not answered by a tool message before it", where,
                    json_string_value(json_array_get(p->ids, 0)));
}

/* One message as the template takes it: role, content as a string; the
 * assistant's reasoning and tool calls; a tool result's content. */
static json_t *check_message(json_t *m, const char *where, int i, pending *p, srv_err *e) {
    if (!json_is_object(m)) { srv_fail(e, 400, where, "%s must be an object", where); return NULL; }
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role) { srv_fail(e, 400, where, "%s.role must be a string", where); return NULL; }
    char cw[128];
    snprintf(cw, sizeof cw, "%s.content", where);
    json_t *content = srv_text_content(json_object_get(m, "content"), cw, "", e);
    if (!content) return NULL;
    json_t *out = json_pack("{s:s, s:o}", "role", role, "content", content);
    size_t at;
    if (!strcmp(role, "system")) {
        if (i > 0) { srv_fail(e, 400, where, "%s: system messages must come before the conversation", where); goto fail; }
    } else if (!strcmp(role, "user")) {
        if (check_unanswered(p, where, e)) goto fail;
    } else if (!strcmp(role, "assistant")) {
        if (check_unanswered(p, where, e)) goto fail;
        json_t *calls = json_object_get(m, "tool_calls");
        json_t *r = json_object_get(m, "reasoning_content");
        if (!r || json_is_null(r)) r = json_object_get(m, "reasoning");
        if (r && !json_is_null(r)) {
            if (!json_is_string(r)) { srv_fail(e, 400, where, "%s.reasoning_content must be a string", where); goto fail; }
            json_object_set(out, "reasoning_content", r);
        }
        if (calls && !json_is_null(calls)) {
            if (check_tool_calls(calls, where, p, e)) goto fail;
            if (json_array_size(calls)) json_object_set(out, "tool_calls", calls);
        }
    } else if (!strcmp(role, "tool")) {
        json_t *id = json_object_get(m, "tool_call_id");
        if (!json_is_string(id)) { srv_fail(e, 400, where, "%s.tool_call_id must be a string", where); goto fail; }
        if (!pending_has(p, json_string_value(id), &at)) {
            srv_fail(e, 400, where, "%s: tool_call_id '%.64s' answers no open tool call (unknown, or answered already)",
                     where, json_string_value(id));
            goto fail;
        }
        json_array_remove(p->ids, at);
        json_object_set(out, "tool_call_id", id);
    } else {
        srv_fail(e, 400, where, "%s.role '%.32s' is not one of system, developer, user, assistant, tool", where, role);
        goto fail;
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

json_t *srv_check_conversation(json_t *messages, const char *param, srv_err *e) {
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        srv_fail(e, 400, param, "%s must be a non-empty list", param);
        return NULL;
    }
    json_t *out = json_array();
    pending p = {json_array()};
    sbuf sys = {0};
    int n_sys = 0;
    size_t i = 0;
    json_t *m;
    char where[96];
    /* leading system and developer messages become one system message */
    for (; i < json_array_size(messages); i++) {
        m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "system") && strcmp(role, "developer"))) break;
        snprintf(where, sizeof where, "%s[%zu].content", param, i);
        json_t *c = srv_text_content(json_object_get(m, "content"), where, "", e);
        if (!c) goto fail;
        if (n_sys++) sbuf_puts(&sys, "\n\n");
        sbuf_add(&sys, json_string_value(c), json_string_length(c));
        json_decref(c);
    }
    if (n_sys) json_array_append_new(out, json_pack("{s:s, s:s%}", "role", "system", "content",
                                                    sys.data ? sys.data : "", sys.len));
    for (; i < json_array_size(messages); i++) {
        snprintf(where, sizeof where, "%s[%zu]", param, i);
        m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && !strcmp(role, "developer")) {
            srv_fail(e, 400, where, "%s: developer messages must come before the conversation", where);
            goto fail;
        }
        json_t *msg = check_message(m, where, (int)json_array_size(out), &p, e);
        if (!msg) goto fail;
        json_array_append_new(out, msg);
    }
    if (json_array_size(out) == (n_sys ? 1u : 0u)) {
        srv_fail(e, 400, param, "%s holds no user or assistant message", param);
        goto fail;
    }
    if (check_unanswered(&p, param, e)) goto fail;
    json_decref(p.ids);
    sbuf_free(&sys);
    return out;
fail:
    json_decref(p.ids);
    sbuf_free(&sys);
    json_decref(out);
    return NULL;
}

/* ---- prompts ----------------------------------------------------------- */

int srv_tokenize(srv_ctx *c, const char *text, size_t len, int32_t **ids, size_t *n, srv_err *e) {
    tern_error err;
    pthread_mutex_lock(&c->tok_mu);
    int rc = tern_tokenizer_encode(c->tok, text, len, 0, ids, n, &err);
    pthread_mutex_unlock(&c->tok_mu);
    return rc ? srv_fail(e, 400, NULL, "%s", err.msg) : 0;
}

static int append_ids(srv_job *j, const int32_t *ids, size_t n) {
    int32_t *p = realloc(j->prompt, ((size_t)j->n_prompt + n + 1) * sizeof *p);
    if (!p) return -1;
    if (n) memcpy(p + j->n_prompt, ids, n * sizeof *ids);
    j->prompt = p;
    j->n_prompt += (int)n;
    return 0;
}

/* The start of the generation prompt the template appends after the last
 * message (its thinking part follows). */
static const char GEN_PROMPT[] = "<|im_start|>assistant\n";
static const char MSG_START[] = "<|im_start|>";

/* The last occurrence of needle in s[0..n), or NULL. */
static const char *last_of(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = n >= m ? n - m + 1 : 0; i-- > 0;)
        if (memcmp(s + i, needle, m) == 0) return s + i;
    return NULL;
}

/* Tokenizes text[0..n) onto the job's prompt. */
static int append_text(srv_ctx *c, srv_job *j, const char *text, size_t n, srv_err *e) {
    int32_t *ids = NULL;
    size_t k = 0;
    if (srv_tokenize(c, text, n, &ids, &k, e)) return -1;
    int rc = append_ids(j, ids, k);
    free(ids);
    if (rc) srv_fail(e, 500, NULL, "out of memory");
    return rc;
}

/* Tokenizes the rendered conversation, cut before added tokens (so the
 * pieces tokenize as the whole does) where checkpoints belong: the end of
 * the first message (the system prompt and tools, which conversations
 * share) and the end of the last one (before the generation prompt). */
static int tokenize_chat(srv_ctx *c, srv_job *j, const char *text, srv_err *e) {
    size_t len = strlen(text);
    const char *gen = last_of(text, len, GEN_PROMPT);
    size_t head = gen ? (size_t)(gen - text) : len;
    const char *second = head > 1 ? memmem(text + 1, head - 1, MSG_START, strlen(MSG_START)) : NULL;
    size_t first = second ? (size_t)(second - text) : 0;
    if (first && append_text(c, j, text, first, e)) return -1;
    j->first_boundary = j->n_prompt;
    if (append_text(c, j, text + first, head - first, e)) return -1;
    j->boundary = gen ? j->n_prompt : 0;
    return append_text(c, j, text + head, len - head, e);
}

int srv_check_prompt_len(const srv_ctx *c, const srv_job *j, const char *param, srv_err *e) {
    srv_kv_stats kv = {0};
    if (c->sched) srv_sched_kv_stats(c->sched, &kv);
    if (j->n_prompt >= c->n_ctx)
        srv_fail(e, 400, param, "the prompt is %d tokens; the context holds %d (tern serve --ctx)", j->n_prompt,
                 c->n_ctx);
    else if (kv.max_tokens && j->n_prompt > kv.max_tokens)
        srv_fail(e, 400, param, "the prompt is %d tokens; the server's KV budget holds %d for one request (tern serve "
                 "--kv-budget)", j->n_prompt, kv.max_tokens);
    else
        return 0;
    e->code = "context_length_exceeded";
    return -1;
}

int srv_build_chat_prompt(srv_ctx *c, json_t *messages, json_t *tools, const srv_prompt_opts *o, srv_job *j,
                          srv_err *e) {
    json_t *view = c->concise ? srv_concise_view(messages) : json_incref(messages);
    char *mj = view ? json_dumps(view, JSON_COMPACT) : NULL, *tj = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
    json_decref(view);
    tern_chat_options opt;
    tern_chat_options_default(&opt);
    opt.enable_thinking = o->thinking;
    opt.preserve_thinking = o->preserve_thinking;
    opt.add_generation_prompt = 1;
    tern_error err;
    char *text = NULL;
    int rc = -1;
    if (!mj || (tools && !tj)) { srv_fail(e, 500, NULL, "out of memory"); goto done; }
    if (!(text = tern_chat_render(mj, tj, &opt, &err))) { srv_fail(e, 400, "messages", "%s", err.msg); goto done; }
    if (tokenize_chat(c, j, text, e)) goto done;
    size_t len = strlen(text);
    const char *open = "<think>\n";
    j->start_in_reasoning = len >= strlen(open) && !strcmp(text + len - strlen(open), open);
    if (srv_check_prompt_len(c, j, "messages", e)) goto done;
    rc = 0;
done:
    free(mj);
    free(tj);
    free(text);
    return rc;
}

/* ---- ids and bytes ----------------------------------------------------- */

void srv_new_id(char *out, size_t cap, const char *prefix) {
    uint64_t a = random_u64(), b = random_u64();
    snprintf(out, cap, "%s%016llx%016llx", prefix, (unsigned long long)a, (unsigned long long)b);
}

json_t *srv_json_bytes(const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    if (v) return v;
    /* not valid UTF-8: keep the valid characters, U+FFFD for the rest */
    sbuf b = {0};
    size_t i = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)s[i];
        size_t need = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 0;
        json_t *probe = need && i + need <= n ? json_stringn(s + i, need) : NULL;
        if (probe && ch) sbuf_add(&b, s + i, need);
        else sbuf_puts(&b, "\xEF\xBF\xBD");
        json_decref(probe);
        i += probe ? need : 1;
    }
    v = b.oom ? NULL : json_stringn(b.data ? b.data : "", b.len);
    sbuf_free(&b);
    return v;
}

json_t *srv_json_byte_list(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* ---- structured output ------------------------------------------------- */

int srv_parse_format(json_t *fmt, const char *param, int schema_in_member, srv_constraint *k, srv_err *e) {
    if (!fmt || json_is_null(fmt)) return 0;
    const char *type = json_string_value(json_object_get(fmt, "type"));
    if (!json_is_object(fmt) || !type) return srv_fail(e, 400, param, "%s must be an object with a type", param);
    k->form_param = param;
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) { k->json_object = 1; return 0; }
    if (strcmp(type, "json_schema"))
        return srv_fail(e, 400, param, "%s.type must be \"text\", \"json_object\" or \"json_schema\", got \"%.64s\"",
                        param, type);
    json_t *holder = schema_in_member ? json_object_get(fmt, "json_schema") : fmt;
    if (schema_in_member && !json_is_object(holder))
        return srv_fail(e, 400, param, "%s.json_schema must be an object with a schema", param);
    json_t *schema = json_object_get(holder, "schema");
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return srv_fail(e, 400, param, "%s%s.schema must be a JSON Schema object", param,
                        schema_in_member ? ".json_schema" : "");
    k->schema = schema;
    return 0;
}

int srv_build_grammar(srv_ctx *c, const srv_constraint *k, json_t *tools, int parallel, srv_job *j, srv_err *e) {
    int form = k->schema || k->json_object || k->gbnf;
    if (!form && !k->tools_required) return 0;
    const char *param = k->tools_required && (!form || !k->form_param) ? k->tool_param : k->form_param;
    if (k->tools_required && !tools)
        return srv_fail(e, 400, k->tool_param, "%s: a tool call is required but no tools are given", k->tool_param);
    if (k->tools_required && form)
        return srv_fail(e, 400, k->tool_param, "%s: a required tool call and %s cannot both be enforced",
                        k->tool_param, k->form_param);
    if (j->ignore_eos) return srv_fail(e, 400, "ignore_eos", "ignore_eos cannot be combined with structured output");
    if (!c->gvocab) return srv_fail(e, 500, NULL, "structured output is not available (no vocabulary)");
    char *schema = k->schema ? json_dumps(k->schema, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *tj = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
    tern_grammar_spec spec = {.json_schema = schema, .json_object = k->json_object, .gbnf = k->gbnf,
                              .tools_json = tj, .tool_name = k->tool_name, .tools_required = k->tools_required,
                              .parallel_tool_calls = parallel, .after_think = j->start_in_reasoning};
    tern_error err;
    int rc = 0;
    if ((k->schema && !schema) || (tools && !tj)) {
        rc = srv_fail(e, 500, NULL, "out of memory");
    } else if (!(j->grammar = tern_grammar_create(&spec, c->gvocab, &err))) {
        /* optional calls beside an answer form: a tool the grammar cannot
         * write is the tools' fault, not the form's */
        tern_grammar_spec calls = {.tools_json = tj, .tools_required = 1};
        tern_error terr;
        tern_grammar *probe = tj && !k->tools_required ? tern_grammar_create(&calls, NULL, &terr) : NULL;
        if (tj && !k->tools_required && !probe)
            rc = srv_fail(e, 400, "tools", "%s (with %s, tool calls follow their schemas too)", terr.msg, param);
        else
            rc = srv_fail(e, 400, param, "%s: %s", param, err.msg);
        tern_grammar_destroy(probe);
    }
    free(schema);
    free(tj);
    return rc;
}
