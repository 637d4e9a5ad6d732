/* tern run (a raw completion) and tern chat (multi-turn, the session kept
 * between turns). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "text/concise.h"

/* Ctrl-C stops the current generation (and, at the chat prompt, the chat). */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static void install_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;   /* no SA_RESTART: a blocked read returns EINTR */
    sigaction(SIGINT, &sa, NULL);
}

/* A growing text. */
typedef struct {
    char *p;
    size_t len, cap;
} text_buf;

static int buf_add(text_buf *b, const char *text, size_t len) {
    if (b->len + len + 1 > b->cap) {
        size_t cap = (b->len + len + 1) * 2;
        char *t = realloc(b->p, cap);
        if (!t) return -1;
        b->p = t;
        b->cap = cap;
    }
    memcpy(b->p + b->len, text, len);
    b->len += len;
    b->p[b->len] = '\0';
    return 0;
}

/* Where the generated text goes: split by the output parser into reasoning
 * and answer; echoed as it streams (the reasoning dimmed on a terminal,
 * between <think> tags elsewhere, or not at all with --hide-reasoning) and
 * kept (--json, the chat transcript). */
typedef struct {
    int echo, hide, tty;
    tern_output_parser *parser;
    text_buf raw, answer, reasoning;
    int showing;                 /* the echo is inside the reasoning */
    int wrote;                   /* something was echoed */
} sink;

static void echo(sink *k, const char *text, size_t len) {
    k->wrote |= len > 0;
    fwrite(text, 1, len, stdout);
}

/* Closes the echoed reasoning before the answer (or at the end). */
static void end_reasoning(sink *k) {
    if (!k->showing) return;
    k->showing = 0;
    const char *close = k->tty ? "\033[0m\n\n" : "\n</think>\n\n";
    echo(k, close, strlen(close));
}

static int on_part(void *user, const tern_out_event *ev, tern_error *err) {
    sink *k = user;
    int reasoning = ev->kind == TERN_OUT_REASONING;
    if (ev->kind != TERN_OUT_CONTENT && !reasoning) return 0;   /* (no tool calls parsed here) */
    if (buf_add(reasoning ? &k->reasoning : &k->answer, ev->text, ev->len)) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    if (!k->echo || (reasoning && k->hide)) return 0;
    if (reasoning && !k->showing) {
        k->showing = 1;
        const char *open = k->tty ? "\033[2m" : "<think>\n";
        echo(k, open, strlen(open));
    } else if (!reasoning) {
        end_reasoning(k);
    }
    echo(k, ev->text, ev->len);
    return 0;
}

static int on_text(void *ctx, const char *text, size_t len) {
    sink *k = ctx;
    tern_error err;
    if (buf_add(&k->raw, text, len) || tern_output_parser_feed(k->parser, text, len, &err)) return 1;
    fflush(stdout);
    return interrupted != 0;
}

/* A sink for one reply; start_in_reasoning: the prompt opened a <think>
 * block. */
static int sink_init(sink *k, const cli_opts *o, int echo_on, int start_in_reasoning) {
    *k = (sink){.echo = echo_on, .hide = o->hide_reasoning, .tty = isatty(STDOUT_FILENO)};
    tern_output_params op = {.start_in_reasoning = start_in_reasoning};
    tern_error err;
    if ((k->parser = tern_output_parser_create(&op, on_part, k, &err))) return 0;
    fprintf(stderr, "tern: %s\n", err.msg);
    return -1;
}

/* The end of the reply: the parser's held-back text, the reasoning's
 * echo closed. */
static void sink_finish(sink *k) {
    tern_error err;
    tern_output_parser_finish(k->parser, &err);
    end_reasoning(k);
    fflush(stdout);
}

static void sink_free(sink *k) {
    tern_output_parser_destroy(k->parser);
    free(k->raw.p);
    free(k->answer.p);
    free(k->reasoning.p);
}

static void print_id(void *ctx, int32_t id) {
    int *count = ctx;
    printf("%s%d", (*count)++ ? " " : "", id);
    fflush(stdout);
}

static const char *reason_name(int r) {
    static const char *names[] = {"length", "eos", "stop", "interrupted", "context"};
    return r >= 0 && r <= TERN_STOP_CONTEXT ? names[r] : "?";
}

static void footer(const cli_opts *o, const tern_model *m, const tern_gen_stats *st) {
    fprintf(stderr, "\nprompt %d tokens, prefill %.1f tok/s | generated %d tokens, decode %.1f tok/s | %s\n",
            st->n_prompt, st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0.0, st->n_generated,
            st->decode_s > 0 ? st->n_generated / st->decode_s : 0.0, reason_name(st->stop_reason));
    if (st->n_verify)
        fprintf(stderr, "mtp: %d of %d drafts kept (%.1f%%), %.2f tokens a verify step\n", st->n_accepted,
                st->n_drafted, 100.0 * st->n_accepted / st->n_drafted,
                (double)(st->n_accepted + st->n_verify) / st->n_verify);
    if (!o->stats) return;
    tern_stream_stats ss;
    tern_model_stream_stats(m, &ss);
    if (!ss.streaming) { fprintf(stderr, "experts: resident\n"); return; }
    uint64_t req = ss.hits + ss.misses;
    fprintf(stderr, "experts: %d slots/layer, hit rate %.1f%% (%llu hits, %llu misses), %.1f MB read, "
            "%.2f GB/s per reader, %.3f s waiting on I/O, %s\n",
            ss.slots_per_layer, req ? 100.0 * ss.hits / req : 0.0, (unsigned long long)ss.hits,
            (unsigned long long)ss.misses, ss.bytes_read / 1e6, ss.read_s > 0 ? ss.bytes_read / ss.read_s / 1e9 : 0.0,
            ss.wait_s, ss.direct_io ? "O_DIRECT" : "buffered + DONTNEED");
}

static void print_json(const sink *k, const tern_gen_stats *st) {
    json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:f, s:f, s:f, s:f, s:s, s:i, s:i, s:i}",
                          "text", k->answer.p ? k->answer.p : "",
                          "reasoning", k->reasoning.p ? k->reasoning.p : "",
                          "prompt_tokens", st->n_prompt, "generated_tokens", st->n_generated, "prefill_s",
                          st->prefill_s, "decode_s", st->decode_s, "prefill_tok_s",
                          st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0.0, "decode_tok_s",
                          st->decode_s > 0 ? st->n_generated / st->decode_s : 0.0, "stop_reason",
                          reason_name(st->stop_reason), "mtp_steps", st->n_verify, "mtp_drafted", st->n_drafted,
                          "mtp_accepted", st->n_accepted);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    if (s) printf("%s\n", s);
    fflush(stdout);   /* a program reading the chat's turns through a pipe waits for each */
    free(s);
    json_decref(j);
}

/* No text longer than ctx times this fits in ctx tokens: each token covers
 * at most its own bytes, and NFC (which may shorten the text before it is
 * split) never shrinks it by 4x. */
static size_t bytes_per_token_bound(const tern_tokenizer *tok) {
    size_t most = 1;
    for (int32_t id = 0; id < tern_tokenizer_vocab_size(tok); id++) {
        size_t len = 0;
        if (tern_tokenizer_token_bytes(tok, id, &len) && len > most) most = len;
    }
    return 4 * most;
}

/* The prompt of `tern run` as ids: --tokens, or -p / -f text. */
static int32_t *run_prompt(const cli_opts *o, tern_tokenizer *tok, int ctx, size_t *n) {
    if (o->tokens) return cli_parse_ids(o->tokens, n);
    size_t len = 0;
    char *owned = NULL;
    const char *text = o->prompt;
    if (o->prompt_file) {
        char why[96];
        snprintf(why, sizeof why, "the most a %d-token context can hold", ctx);
        text = owned = cli_read_text(o->prompt_file, (size_t)ctx * bytes_per_token_bound(tok), why, &len);
    } else if (text) {
        len = strlen(text);
    }
    if (!text) return NULL;
    int32_t *ids = NULL;
    tern_error err;
    if (tern_tokenizer_encode(tok, text, len, 0, &ids, n, &err) != 0) {
        fprintf(stderr, "tern: %s\n", err.msg);
        ids = NULL;
    } else if (*n == 0) {
        fprintf(stderr, "tern: the prompt is empty\n");
        free(ids);
        ids = NULL;
    }
    free(owned);
    return ids;
}

/* The ids that end a generation as tern_generate sees them: the sampling
 * parameters' (generation_config.json), else the model's. */
static int eos_ids(const tern_model *m, const tern_tokenizer *tok, const tern_sampler_params *sp, int32_t *out) {
    int n = 0;
    for (int i = 0; i < sp->n_eos; i++) out[n++] = sp->eos_ids[i];
    for (int32_t id = 0; !sp->n_eos && id < tern_tokenizer_vocab_size(tok) && n < TERN_SAMPLER_MAX_EOS; id++)
        if (tern_model_is_eos(m, id)) out[n++] = id;
    return n;
}

/* --json-schema / --grammar-file: the grammar the generation follows
 * (*v: its vocabulary). 1: none asked for; -1: failed (printed). */
static int run_grammar(const cli_opts *o, const tern_model *m, const tern_tokenizer *tok, const tern_gen_params *gp,
                       tern_grammar_vocab **v, tern_grammar **g) {
    const char *file = o->json_schema ? o->json_schema : o->grammar_file;
    if (!file) return 1;
    if (o->json_schema && o->grammar_file) {
        fprintf(stderr, "tern run: give one of --json-schema and --grammar-file\n");
        return -1;
    }
    size_t len;
    char *text = cli_read_text(file, (size_t)1 << 20, "1 MiB", &len);
    if (!text) return -1;
    int32_t eos[TERN_SAMPLER_MAX_EOS];
    tern_error err;
    tern_grammar_spec spec = {.json_schema = o->json_schema ? text : NULL, .gbnf = o->grammar_file ? text : NULL};
    *v = tern_grammar_vocab_create(tok, tern_model_vocab_size(m), eos, eos_ids(m, tok, &gp->sampling, eos), &err);
    *g = *v ? tern_grammar_create(&spec, *v, &err) : NULL;
    free(text);
    if (*g) return 0;
    fprintf(stderr, "tern: %s: %s\n", file, err.msg);
    return -1;
}

int cmd_run(const cli_opts *o) {
    if (!!o->prompt + !!o->prompt_file + !!o->tokens != 1) {
        fprintf(stderr, "tern run: give exactly one of -p TEXT, -f FILE, --tokens IDS\n");
        return 2;
    }
    if (o->tokens && (o->json_schema || o->grammar_file)) {
        fprintf(stderr, "tern run: --json-schema and --grammar-file need text (-p or -f), not --tokens\n");
        return 2;
    }
    tern_model *m = cli_load_model(o);
    if (!m) return 1;
    int ctx = cli_context(o, m, 0);
    if (ctx < 0) {
        tern_model_free(m);
        return 2;
    }
    tern_error err;
    tern_tokenizer *tok = NULL;
    if (!o->tokens && !(tok = tern_tokenizer_load(cli_model_dir(o), &err))) {
        fprintf(stderr, "tern: %s\n", err.msg);
        tern_model_free(m);
        return 1;
    }
    size_t n_prompt = 0;
    int32_t *prompt = run_prompt(o, tok, ctx, &n_prompt);
    tern_gen_params gp;
    tern_session_params sp = {.max_context = ctx, .gdn_mode = TERN_GDN_CHUNKED, .kv_bits = o->kv_bits};
    int params_ok = prompt && cli_gen_params(o, &gp) == 0;   /* a bad one printed its line */
    tern_grammar_vocab *gv = NULL;
    tern_grammar *gram = NULL;
    int gr = params_ok ? run_grammar(o, m, tok, &gp, &gv, &gram) : 1;
    if (gr < 0) params_ok = 0;
    gp.grammar = gram;
    tern_session *s = params_ok ? tern_session_create(m, &sp, &err) : NULL;
    int rc = 1, ids_printed = 0;
    if (s) {
        gp.n_predict = o->n_predict == INT_MIN ? 256 : o->n_predict;
        if (o->tokens) gp.on_token = print_id;
        sink k;
        tern_gen_stats st;
        install_sigint();
        void *out = o->tokens ? (void *)&ids_printed : (void *)&k;
        if (sink_init(&k, o, !o->json, 0)) {
            rc = 1;
        } else {
            rc = tern_generate(s, o->tokens ? NULL : tok, prompt, n_prompt, &gp, on_text, out, &st, &err) ? 1 : 0;
            sink_finish(&k);
        }
        if (rc && k.parser) fprintf(stderr, "%stern: %s\n", ids_printed || k.wrote ? "\n" : "", err.msg);
        if (o->json && !o->tokens && rc == 0) print_json(&k, &st);
        else if (o->tokens && (rc == 0 || ids_printed)) printf("\n");
        fflush(stdout);
        if (rc == 0) footer(o, m, &st);   /* after an error its numbers mean nothing */
        sink_free(&k);
    } else if (params_ok) {
        fprintf(stderr, "tern: %s\n", err.msg);
    } else if (prompt && gr < 0) {
        rc = 2;   /* the grammar was bad */
    } else if (prompt) {
        rc = 1;
    } else {
        rc = 2;   /* the prompt itself was bad */
    }
    tern_session_destroy(s);
    tern_grammar_destroy(gram);
    tern_grammar_vocab_destroy(gv);
    free(prompt);
    tern_tokenizer_free(tok);
    tern_model_free(m);
    return rc;
}

/* ---- chat --------------------------------------------------------------- */

typedef struct {
    tern_model *m;
    tern_tokenizer *tok;
    tern_session *s;
    json_t *messages;
    tern_chat_options opt;
    int32_t im_end;              /* <|im_end|>: whether the last reply closed its turn */
    int32_t last_token;
} chat_state;

static char *render(chat_state *c, int gen_prompt, tern_error *err) {
    char *js = json_dumps(c->messages, JSON_COMPACT);
    tern_chat_options opt = c->opt;
    opt.add_generation_prompt = gen_prompt;
    char *out = js ? tern_chat_render(js, NULL, &opt, err) : NULL;
    free(js);
    return out;
}

/* The text to append to the session for the newest user message: the whole
 * rendered prompt on the first turn; afterwards only what the template adds
 * after the previous reply. Rendering with preserve_thinking keeps earlier
 * turns byte-identical between renders, so the difference is exactly the
 * new turn; the session already holds the previous reply as generated. */
static char *turn_text(chat_state *c, const char *prev, tern_error *err) {
    char *full = render(c, 1, err);
    if (!full || !prev) return full;
    size_t pl = strlen(prev);
    const char *close = "<|im_end|>";
    size_t cl = strlen(close);
    if (strncmp(full, prev, pl) != 0 || pl < cl + 1 || strncmp(prev + pl - cl - 1, close, cl) != 0) {
        free(full);
        snprintf(err->msg, sizeof err->msg, "chat template output is not an extension of the previous turn");
        return NULL;
    }
    /* prev ends "<|im_end|>\n"; the session holds the reply up to its EOS */
    const char *glue = c->last_token == c->im_end ? "\n" : "<|im_end|>\n";
    char *out = malloc(strlen(glue) + strlen(full + pl) + 1);
    if (out) { strcpy(out, glue); strcat(out, full + pl); }
    free(full);
    return out;
}

/* The reply as an assistant message: reasoning before "</think>", content
 * after (the generation prompt opened the think block). */
static void add_reply(chat_state *c, const char *text) {
    const char *end = strstr(text, "</think>");
    json_t *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    if (end) {
        const char *r = text, *re = end;
        while (*r == '\n') r++;
        while (re > r && re[-1] == '\n') re--;
        const char *content = end + strlen("</think>");
        while (*content == '\n') content++;
        json_object_set_new(msg, "reasoning_content", json_stringn(r, (size_t)(re - r)));
        json_object_set_new(msg, "content", json_string(content));
    } else {
        json_object_set_new(msg, "content", json_string(text));
    }
    json_array_append_new(c->messages, msg);
}

static int chat_turn(chat_state *c, const cli_opts *o, const char *user, int *turn) {
    tern_error err;
    char *prev = *turn ? render(c, 0, &err) : NULL;
    if (*turn && !prev) { fprintf(stderr, "tern: %s\n", err.msg); return -1; }
    json_array_append_new(c->messages, json_pack("{s:s, s:s}", "role", "user", "content", user));
    char *text = turn_text(c, prev, &err);
    free(prev);
    if (!text) { fprintf(stderr, "tern: %s\n", err.msg); return -1; }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tern_tokenizer_encode(c->tok, text, strlen(text), 0, &ids, &n, &err);
    free(text);
    if (rc != 0) { fprintf(stderr, "tern: %s\n", err.msg); return -1; }
    tern_gen_params gp;
    if (cli_gen_params(o, &gp) != 0) { free(ids); return -1; }
    gp.n_predict = o->n_predict == INT_MIN ? 1024 : o->n_predict;
    sink k;   /* keeps the reply for the transcript */
    if (sink_init(&k, o, !o->json, c->opt.enable_thinking)) { free(ids); return -1; }
    tern_gen_stats st;
    interrupted = 0;
    rc = tern_generate(c->s, c->tok, ids, n, &gp, on_text, &k, &st, &err);
    free(ids);
    sink_finish(&k);
    if (rc != 0) { fprintf(stderr, "\ntern: %s\n", err.msg); sink_free(&k); return -1; }
    c->last_token = st.last_token;
    add_reply(c, k.raw.p ? k.raw.p : "");
    if (o->json) print_json(&k, &st);
    footer(o, c->m, &st);
    sink_free(&k);
    (*turn)++;
    return 0;
}

/* The next user message from in (malloc'ed; NULL at EOF or Ctrl-C): a line, or
 * several where a line ends with a backslash (dropped, the newline kept)
 * or between lines of three double quotes (`"""` alone opens a block;
 * a line ending with `"""` closes it). */
static char *read_message(FILE *in, int tty, char **line, size_t *cap) {
    char *msg = NULL;
    size_t len = 0;
    int block = 0, more = 1;
    while (more) {
        if (tty && (len || block)) { fprintf(stderr, ". "); fflush(stderr); }
        ssize_t n = getline(line, cap, in);
        if (n < 0) break;
        while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r')) (*line)[--n] = '\0';
        char *t = *line;
        more = 0;
        if (!block && !len && !strcmp(t, "\"\"\"")) {
            block = more = 1;
            continue;
        }
        if (block) {
            more = !(n >= 3 && !strcmp(t + n - 3, "\"\"\""));
            if (!more) t[n -= 3] = '\0';
        } else if (n > 0 && t[n - 1] == '\\') {
            t[--n] = '\0';
            more = 1;
        }
        char *m = realloc(msg, len + (size_t)n + 2);
        if (!m) break;
        msg = m;
        if (len) msg[len++] = '\n';
        memcpy(msg + len, t, (size_t)n);
        len += (size_t)n;
        msg[len] = '\0';
    }
    /* a block left open at the end of input is what was read; Ctrl-C ends
     * the chat as at the prompt, the message unsent */
    if (interrupted) {
        free(msg);
        return NULL;
    }
    return msg;
}

int cmd_chat(const cli_opts *o) {
    chat_state c;
    memset(&c, 0, sizeof c);
    tern_error err;
    if (!(c.m = cli_load_model(o))) return 1;
    int rc = 1;
    int ctx = cli_context(o, c.m, 0);
    if (ctx < 0) goto done;
    tern_session_params sp = {.max_context = ctx, .gdn_mode = TERN_GDN_CHUNKED, .kv_bits = o->kv_bits};
    if (!(c.tok = tern_tokenizer_load(cli_model_dir(o), &err)) || !(c.s = tern_session_create(c.m, &sp, &err))) {
        fprintf(stderr, "tern: %s\n", err.msg);
        goto done;
    }
    c.im_end = tern_tokenizer_token_id(c.tok, "<|im_end|>");
    c.last_token = -1;
    c.messages = json_array();
    tern_chat_options_default(&c.opt);
    c.opt.enable_thinking = o->think;
    c.opt.preserve_thinking = 1;
    if ((o->system && *o->system) || o->concise) {
        char *sys = NULL;
        int both = o->system && *o->system && o->concise;
        if (asprintf(&sys, "%s%s%s", o->system ? o->system : "", both ? "\n\n" : "",
                     o->concise ? tern_concise_prompt : "") < 0) {
            fprintf(stderr, "tern: out of memory\n");
            goto done;
        }
        json_array_append_new(c.messages, json_pack("{s:s, s:s}", "role", "system", "content", sys));
        free(sys);
    }
    install_sigint();
    int tty = isatty(STDIN_FILENO), turn = 0;
    char *line = NULL, *msg;
    size_t cap = 0;
    rc = 0;
    for (;;) {
        if (tty) { fprintf(stderr, "> "); fflush(stderr); }
        interrupted = 0;
        if (!(msg = read_message(stdin, tty, &line, &cap))) break;   /* EOF, or Ctrl-C at the prompt */
        if (!*msg) { free(msg); continue; }
        if (!o->json) printf("\n");
        int failed = chat_turn(&c, o, msg, &turn) != 0;
        free(msg);
        if (failed) { rc = 1; break; }
        if (!o->json) printf("\n");
    }
    free(line);
done:
    json_decref(c.messages);
    tern_session_destroy(c.s);
    tern_tokenizer_free(c.tok);
    tern_model_free(c.m);
    return rc;
}
