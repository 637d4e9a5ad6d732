/* Views of a conversation the server renders instead of the one sent: the
 * fast view, asked for by naming the model "<id>-fast" (an agent's long
 * system prompt, its tools and their traffic, and its reminder blocks
 * left out, for a machine where each prompt token costs), and the concise
 * system prompt of tern serve --concise. docs/SERVER.md, "Fast view and
 * concise answers". */
#include <stdlib.h>
#include <string.h>

#include "server/api.h"
#include "text/concise.h"

#define FAST_SUFFIX "-fast"
#define REMINDER_OPEN "<system-reminder>"
#define REMINDER_CLOSE "</system-reminder>"

/* "<id>-fast"; without --strict-model, any other name ending in "-fast" too
 * (clients name the model as they please). */
int srv_model_is_fast(const srv_ctx *c, const char *model) {
    size_t n = model ? strlen(model) : 0, k = strlen(FAST_SUFFIX);
    if (n <= k || strcmp(model + n - k, FAST_SUFFIX) || !strcmp(model, c->model_id)) return 0;
    return !c->strict_model || (n - k == strlen(c->model_id) && !strncmp(model, c->model_id, n - k));
}

int srv_model_fast(const srv_ctx *c, json_t *req) {
    return srv_model_is_fast(c, json_string_value(json_object_get(req, "model")));
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return 0;
    return 1;
}

/* text without its <system-reminder> blocks (an unclosed one stays), or
 * NULL when that leaves nothing but white space (new reference). */
static json_t *without_reminders(json_t *text) {
    const char *s = json_string_value(text), *end = s + json_string_length(text);
    sbuf out = {0};
    while (s < end) {
        const char *open = memmem(s, (size_t)(end - s), REMINDER_OPEN, strlen(REMINDER_OPEN));
        const char *close = open ? memmem(open, (size_t)(end - open), REMINDER_CLOSE, strlen(REMINDER_CLOSE)) : NULL;
        if (!close) break;
        sbuf_add(&out, s, (size_t)(open - s));
        s = close + strlen(REMINDER_CLOSE);
    }
    sbuf_add(&out, s, (size_t)(end - s));
    json_t *v = out.len && !blank(out.data, out.len) ? json_stringn(out.data, out.len) : NULL;
    sbuf_free(&out);
    return v;
}

/* A message's content without reminder blocks: a string, or text parts
 * (a part left empty goes); NULL when nothing would be left (new
 * reference). */
static json_t *content_view(json_t *content) {
    if (json_is_string(content)) return without_reminders(content);
    if (!json_is_array(content)) return json_incref(content);
    json_t *parts = json_array(), *p;
    size_t i;
    json_array_foreach(content, i, p) {
        json_t *text = json_object_get(p, "text");
        if (!json_is_string(text)) {
            json_array_append(parts, p);
            continue;
        }
        json_t *v = without_reminders(text);
        if (!v) continue;
        json_t *q = json_deep_copy(p);
        json_object_set_new(q, "text", v);
        json_array_append_new(parts, q);
    }
    if (json_array_size(parts)) return parts;
    json_decref(parts);
    return NULL;
}

static int is_role(json_t *m, const char *role) {
    const char *r = json_string_value(json_object_get(m, "role"));
    return r && !strcmp(r, role);
}

/* Whether a user turn keeps text once its reminders are cut. */
static int has_text(json_t *m) {
    json_t *v = content_view(json_object_get(m, "content"));
    json_decref(v);
    return v != NULL;
}

/* The fast view of a conversation (srv_fast_view): system, developer and
 * tool messages left out, assistant messages without their tool calls
 * (one left with no text goes too), reminder blocks cut from user turns;
 * a user turn the cuts empty goes too (an agent's tool results come back
 * as a user turn of reminders), unless no user turn keeps text: then
 * those keep their content as sent. Other messages as they are. NULL when
 * no user turn is left. */
static json_t *fast_messages(json_t *msgs) {
    json_t *out = json_array(), *m;
    size_t i;
    int turns = 0, with_text = 0;
    json_array_foreach(msgs, i, m) with_text += is_role(m, "user") && has_text(m);
    json_array_foreach(msgs, i, m) {
        if (is_role(m, "system") || is_role(m, "developer") || is_role(m, "tool")) continue;
        if (!is_role(m, "user") && !is_role(m, "assistant")) {
            json_array_append(out, m);
            continue;
        }
        json_t *c = json_deep_copy(m);
        json_object_del(c, "tool_calls");
        if (is_role(m, "assistant")) {
            json_t *t = json_object_get(c, "content");
            if (!t || json_is_null(t) || (json_is_string(t) && blank(json_string_value(t), json_string_length(t))) ||
                (json_is_array(t) && !json_array_size(t))) {
                json_decref(c);
                continue;
            }
        } else {
            json_t *v = content_view(json_object_get(m, "content"));
            if (!v && with_text) {
                json_decref(c);
                continue;
            }
            if (v) json_object_set_new(c, "content", v);
            turns++;
        }
        json_array_append_new(out, c);
    }
    if (turns) return out;
    json_decref(out);
    return NULL;
}

void srv_fast_view(json_t **msgs, json_t **tools, srv_constraint *k) {
    json_t *v = fast_messages(*msgs);
    if (!v) return;   /* (a conversation of no user turn: rendered as sent) */
    json_decref(*msgs);
    *msgs = v;
    json_decref(*tools);
    *tools = NULL;
    if (k) {
        k->tools_required = 0;
        k->tool_name = NULL;
    }
}

json_t *srv_concise_view(json_t *msgs) {
    json_t *out = json_copy(msgs), *first = json_array_get(msgs, 0);
    const char *role = json_string_value(json_object_get(first, "role"));
    json_t *text = json_object_get(first, "content");
    if (role && !strcmp(role, "system") && json_is_string(text)) {
        sbuf s = {0};
        sbuf_add(&s, json_string_value(text), json_string_length(text));
        if (s.len) sbuf_puts(&s, "\n\n");
        sbuf_puts(&s, tern_concise_prompt);
        json_array_set_new(out, 0, json_pack("{s:s, s:s%}", "role", "system", "content", s.data, s.len));
        sbuf_free(&s);
    } else {
        json_array_insert_new(out, 0, json_pack("{s:s, s:s}", "role", "system", "content", tern_concise_prompt));
    }
    return out;
}
