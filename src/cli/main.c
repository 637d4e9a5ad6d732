/* The tern command line. It speaks only the public API (tern.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tern.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern <command> [options]\n"
            "commands:\n"
            "  run   -m DIR --tokens \"ID ID ...\" [-n N] [-t THREADS]   greedy generation from token ids\n"
            "  info  -m DIR                                           architecture, tensors, parameter counts\n"
            "options:\n"
            "  -m, --model DIR     Hugging Face model directory\n"
            "  --tokens IDS        prompt as token ids separated by spaces\n"
            "  -n, --n-predict N   tokens to generate (default 32)\n"
            "  -t, --threads N     threads for the matrix products (default: all cores)\n"
            "  --ignore-eos        keep generating past end-of-sequence ids\n");
}

typedef struct {
    const char *model;
    const char *tokens;
    int n_predict;
    int threads;
    int ignore_eos;
} cli_opts;

static int parse_int(const char *flag, const char *s, int lo, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s ? s : "", &end, 10);
    if (!s || *s == '\0' || *end != '\0' || errno || v < lo || v > 1 << 30) {
        fprintf(stderr, "tern: %s needs an integer >= %d, got '%s'\n", flag, lo, s ? s : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_opts(int argc, char **argv, cli_opts *o) {
    *o = (cli_opts){NULL, NULL, 32, 0, 0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--tokens")) o->tokens = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { if (parse_int(a, v, 0, &o->n_predict)) return -1; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (parse_int(a, v, 1, &o->threads)) return -1; }
        else if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = 1; takes = 0; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        else { fprintf(stderr, "tern: unknown option '%s' (see tern --help)\n", a); return -1; }
        if (takes && !v) { fprintf(stderr, "tern: %s needs a value\n", a); return -1; }
        i += takes;
    }
    if (!o->model) { fprintf(stderr, "tern: -m DIR is required\n"); return -1; }
    return 0;
}

/* "1 2 3" -> ids; every entry must be a non-negative integer. */
static int32_t *parse_tokens(const char *s, int *n) {
    int cap = 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    *n = 0;
    while (ids && s && *s) {
        while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "tern: --tokens: '%.*s' is not a token id\n", (int)strcspn(s, " ,\t\n"), s);
            free(ids);
            return NULL;
        }
        if (*n == cap) {
            int32_t *g = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!g) { free(ids); return NULL; }
            ids = g;
        }
        ids[(*n)++] = (int32_t)v;
        s = end;
    }
    if (ids && *n == 0) {
        fprintf(stderr, "tern: --tokens is empty\n");
        free(ids);
        return NULL;
    }
    return ids;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

static int cmd_run(const cli_opts *o) {
    if (!o->tokens) { fprintf(stderr, "tern run: --tokens is required (text prompts need a tokenizer)\n"); return 2; }
    int n_prompt;
    int32_t *prompt = parse_tokens(o->tokens, &n_prompt);
    if (!prompt) return 2;
    tern_error err;
    tern_load_params lp = {o->threads};
    tern_model *m = tern_model_load(o->model, &lp, &err);
    if (!m) { fprintf(stderr, "tern: %s\n", err.msg); free(prompt); return 1; }
    tern_session *s = tern_session_create(m, NULL, &err);
    int V = tern_model_vocab_size(m), rc = 0;
    float *logits = malloc((size_t)V * sizeof(float));
    double t0 = now_s(), t1 = t0, t2;
    int generated = 0;
    if (!s || !logits || tern_session_eval(s, prompt, n_prompt, logits, 0, &err)) {
        fprintf(stderr, "tern: %s\n", s ? err.msg : "cannot create a session");
        rc = 1;
        goto done;
    }
    t1 = now_s();
    for (; generated < o->n_predict; generated++) {
        int32_t next = argmax(logits, V);
        printf("%s%d", generated ? " " : "", next);
        fflush(stdout);
        if (!o->ignore_eos && tern_model_is_eos(m, next)) { generated++; break; }
        if (generated + 1 < o->n_predict && tern_session_eval(s, &next, 1, logits, 0, &err)) {
            fprintf(stderr, "\ntern: %s\n", err.msg);
            rc = 1;
            break;
        }
    }
    printf("\n");
    fflush(stdout);
    t2 = now_s();
    fprintf(stderr, "prompt %d tokens, prefill %.1f tok/s | generated %d tokens, decode %.1f tok/s | %d threads\n",
            n_prompt, n_prompt / (t1 - t0), generated, generated > 1 ? (generated - 1) / (t2 - t1) : 0.0,
            tern_model_n_threads(m));
done:
    free(logits);
    free(prompt);
    tern_session_destroy(s);
    tern_model_free(m);
    return rc;
}

static int cmd_info(const cli_opts *o) {
    tern_error err;
    if (tern_model_describe(o->model, stdout, &err) != 0) {
        fprintf(stderr, "tern: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    cli_opts o;
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") && strcmp(cmd, "info")) {
        fprintf(stderr, "tern: unknown command '%s' (see tern --help)\n", cmd);
        return 2;
    }
    if (parse_opts(argc, argv, &o) != 0) return 2;
    return !strcmp(cmd, "run") ? cmd_run(&o) : cmd_info(&o);
}
