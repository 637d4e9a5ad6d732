#include <errno.h>
#include <stdint.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/flag_names.h"

void cli_usage(FILE *f) {
    fprintf(f,
        "usage: tern <command> [options]\n"
        "\n"
        "commands:\n"
        "  run       -p TEXT | -f FILE | --tokens IDS    stream a raw completion\n"
        "  chat      [--system TEXT] [--no-think] [--concise]   interactive multi-turn chat (reads stdin)\n"
        "  info                                            architecture, tensors, parameter counts\n"
        "  tokenize  TEXT | --decode IDS                   text -> ids, or ids -> text\n"
        "  perplexity -f FILE [--ctx N]                    perplexity of a text in windows of N tokens\n"
        "  pull      REPO[@REV] [DST] [options]            download a Hugging Face model and pack it (--help)\n"
        "  pack      SRC DST [options]                     convert to tern's packed format (tern pack --help)\n"
        "  verify    DIR                                   rehash a packed model against its manifest\n"
        "  synth     DST [options]                         write a random-weight model at an exact shape (--help)\n"
        "  bench     (-m DIR | --synth SHAPE) [options]    measure prefill, decode, TTFT, memory (--help)\n"
        "  serve     [options]                             OpenAI/Anthropic-compatible HTTP server (--help)\n"
        "\n"
        "model:\n"
        "  -m, --model DIR          model directory (default: $TERN_MODEL, else models/tern-tiny)\n"
        "  -t, --threads N          threads for the matrix products (default: all cores)\n"
        "  --ctx N                  context length (default: the model's maximum)\n"
        "  --rope-scaling none|yarn RoPE scaling (default: as config.json says); yarn reaches past the native\n"
        "                           context (262,144 for Qwen3.6), e.g. --rope-scaling yarn --ctx 1048576\n"
        "  --rope-factor F          YaRN's factor (default: --ctx over the native context)\n"
        "  --kv-bits 32|16|8|4      KV cache precision (default 16; 32 = fp32 reference)\n"
        "  --expert-budget SIZE     RAM for routed experts of a packed model, e.g. 8G (default: all)\n"
        "  --expert-policy lfu|lru  slot-cache eviction (default lfu)\n"
        "  --expert-home ram|disk   with --device cuda and a budget: where the other experts live (default ram:\n"
        "                           page-locked host memory; disk: read from the model's files with O_DIRECT)\n"
        "  --stats                  print expert-streaming statistics after the run\n"
        "  --reference              plain fp32 reference kernels only (no SIMD)\n"
        "  --mlock                  lock the weights in RAM (read in at load; never paged out)\n"
        "  --device auto|cpu|cuda[:N]  where the model runs (default auto: the GPU when this build has CUDA and\n"
        "                           the model is packed with resident experts, else the CPU)\n"
        "generation:\n"
        "  -n, --n-predict N        tokens to generate (default 256 for run, 1024 for chat; -1 = no limit)\n"
        "  --temp T --top-k K --top-p P --min-p P     sampling (defaults: generation_config.json)\n"
        "  --repeat-penalty R --presence-penalty P --frequency-penalty F\n"
        "  --seed N                 sampling seed (default: time-based)\n"
        "  --mtp N|auto             speculative decoding with the model's MTP head: N drafts a step, 1..3,\n"
        "                           or auto: each step the depth (0 too) measured fastest on this\n"
        "                           generation (default 0: off); the same output (greedy: the same\n"
        "                           tokens), the CPU only\n"
        "  --stop TEXT              stop string (repeatable)\n"
        "  --ignore-eos             keep generating past end-of-sequence ids\n"
        "  --json-schema FILE       run: the output is JSON valid under this JSON Schema (constrained decoding)\n"
        "  --grammar-file FILE      run: the output matches this GBNF grammar (llama.cpp's syntax)\n"
        "  --think / --no-think     chat: reasoning on (default) or off\n"
        "  --concise                chat: ask for short answers (the system prompt of tern serve --concise)\n"
        "  --hide-reasoning         run, chat: print the answer only (the reasoning is dimmed on a terminal,\n"
        "                           between <think> tags elsewhere)\n"
        "  --json                   one JSON object per run: text (the answer), reasoning, token counts, timings\n");
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno || v < lo || v > hi) {
        fprintf(stderr, "tern: %s needs an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "tern: %s needs a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* Options that take a value; returns 1 if `a` was one of them, -1 on a bad
 * value, 0 if unknown. */
static int value_opt(cli_opts *o, const char *a, const char *v) {
    long n;
    tern_error err;
#define IS(x) (strcmp(a, x) == 0)
    if (IS("-m") || IS("--model")) o->model = v;
    else if (IS("-p") || IS("--prompt")) o->prompt = v;
    else if (IS("-f") || IS("--file")) o->prompt_file = v;
    else if (IS("--tokens")) o->tokens = v;
    else if (IS("--system")) o->system = v;
    else if (IS("--decode")) o->decode = v;
    else if (IS("--device")) o->device = v;
    else if (IS("--json-schema")) o->json_schema = v;
    else if (IS("--grammar-file")) o->grammar_file = v;
    else if (IS("-n") || IS("--n-predict")) { if (parse_long(a, v, -1, INT_MAX, &n)) return -1; o->n_predict = (int)n; }
    else if (IS("-t") || IS("--threads")) { if (parse_long(a, v, 1, 1024, &n)) return -1; o->threads = (int)n; }
    else if (IS("--kv-bits")) {
        if (parse_long(a, v, 4, 32, &n) || (n != 4 && n != 8 && n != 16 && n != 32)) {
            fprintf(stderr, "tern: --kv-bits must be 4, 8, 16 or 32\n");
            return -1;
        }
        o->kv_bits = (int)n;
    } else if (IS("--ctx")) { if (parse_long(a, v, 1, INT_MAX, &n)) return -1; o->ctx = (int)n; }
    else if (IS("--rope-scaling")) {
        if (!strcmp(v, "none")) o->rope_scaling = TERN_ROPE_NONE;
        else if (!strcmp(v, "yarn")) o->rope_scaling = TERN_ROPE_YARN;
        else { fprintf(stderr, "tern: --rope-scaling must be none or yarn, got '%s'\n", v); return -1; }
    } else if (IS("--rope-factor")) {
        float f;
        if (parse_float(a, v, 1, 1 << 20, &f)) return -1;
        o->rope_factor = f;
    }
    else if (IS("--top-k")) { if (parse_long(a, v, 0, INT_MAX, &n)) return -1; o->top_k = (int)n; }
    else if (IS("--seed")) { if (parse_long(a, v, 0, LONG_MAX, &n)) return -1; o->seed = n; }
    else if (IS("--mtp") && !strcmp(v, "auto")) o->mtp = TERN_MTP_AUTO;
    else if (IS("--mtp")) { if (parse_long(a, v, 0, TERN_MTP_MAX_DEPTH, &n)) return -1; o->mtp = (int)n; }
    else if (IS("--temp")) return parse_float(a, v, 0, 100, &o->temp) ? -1 : 1;
    else if (IS("--top-p")) return parse_float(a, v, 0, 1, &o->top_p) ? -1 : 1;
    else if (IS("--min-p")) return parse_float(a, v, 0, 1, &o->min_p) ? -1 : 1;
    else if (IS("--repeat-penalty")) return parse_float(a, v, 0.01f, 100, &o->repeat_penalty) ? -1 : 1;
    else if (IS("--presence-penalty")) return parse_float(a, v, -10, 10, &o->presence_penalty) ? -1 : 1;
    else if (IS("--frequency-penalty")) return parse_float(a, v, -10, 10, &o->frequency_penalty) ? -1 : 1;
    else if (IS("--stop")) {
        if (o->n_stop == CLI_MAX_STOP) { fprintf(stderr, "tern: at most %d --stop strings\n", CLI_MAX_STOP); return -1; }
        if (!*v) { fprintf(stderr, "tern: --stop needs a non-empty string\n"); return -1; }
        o->stop[o->n_stop++] = v;
    } else if (IS("--expert-budget")) {
        if (tern_parse_size(v, &o->expert_budget, &err)) { fprintf(stderr, "tern: --expert-budget: %s\n", err.msg); return -1; }
    } else if (IS("--expert-policy")) {
        if (!strcmp(v, "lfu")) o->expert_policy = TERN_POLICY_LFU;
        else if (!strcmp(v, "lru")) o->expert_policy = TERN_POLICY_LRU;
        else { fprintf(stderr, "tern: --expert-policy must be lfu or lru, got '%s'\n", v); return -1; }
    } else if (IS("--expert-home")) {
        if (!strcmp(v, "ram")) o->expert_home = TERN_HOME_RAM;
        else if (!strcmp(v, "disk")) o->expert_home = TERN_HOME_DISK;
        else { fprintf(stderr, "tern: --expert-home must be ram or disk, got '%s'\n", v); return -1; }
    } else return 0;
#undef IS
    return 1;
}

int cli_parse(int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = INT_MIN;   /* command default */
    o->kv_bits = 16;
    o->device = "auto";
    o->think = 1;
    o->temp = o->top_p = o->min_p = o->repeat_penalty = o->presence_penalty = o->frequency_penalty = NAN;
    o->top_k = -1;
    o->seed = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--stats")) o->stats = 1;
        else if (!strcmp(a, "--reference")) o->reference = 1;
        else if (!strcmp(a, "--mlock")) o->mlock = 1;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--think")) o->think = 1;
        else if (!strcmp(a, "--no-think")) o->think = 0;
        else if (!strcmp(a, "--concise")) o->concise = 1;
        else if (!strcmp(a, "--hide-reasoning")) o->hide_reasoning = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { cli_usage(stdout); exit(0); }
        else if (a[0] == '-' && a[1] != '\0') {
            if (i + 1 >= argc) {
                if (value_opt(o, a, "") == 0) fprintf(stderr, "tern: unknown option '%s' (see tern --help)\n", a);
                else fprintf(stderr, "tern: %s needs a value\n", a);
                return -1;
            }
            int r = value_opt(o, a, argv[i + 1]);
            if (r == 0) { fprintf(stderr, "tern: unknown option '%s' (see tern --help)\n", a); return -1; }
            if (r < 0) return -1;
            i++;
        } else if (!o->positional) {
            o->positional = a;
        } else {
            fprintf(stderr, "tern: unexpected argument '%s'\n", a);
            return -1;
        }
    }
    if (o->mtp && !strncmp(o->device, "cuda", 4)) {
        fprintf(stderr, "tern: --mtp: speculative decoding does not run on the GPU yet (--device cpu runs it)\n");
        return -1;
    }
    return 0;
}

/* The embedded default: models/tern-tiny beside the working directory, or
 * beside the binary (build/tern -> ../models/tern-tiny). */
const char *cli_model_dir(const cli_opts *o) {
    static char buf[4096];
    if (o->model) return o->model;
    const char *env = getenv("TERN_MODEL");
    if (env && *env) return env;
    if (access("models/tern-tiny/config.json", R_OK) == 0) return "models/tern-tiny";
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 64);
    if (n > 0) {
        buf[n] = '\0';
        char *slash = strrchr(buf, '/');
        if (slash) {
            strcpy(slash, "/../models/tern-tiny");
            char probe[4160];
            snprintf(probe, sizeof probe, "%s/config.json", buf);
            if (access(probe, R_OK) == 0) return buf;
        }
    }
    return "models/tern-tiny";
}

tern_load_params cli_load_params(const cli_opts *o) {
    return (tern_load_params){.n_threads = o->threads, .expert_budget = o->expert_budget,
                              .expert_policy = o->expert_policy, .expert_home = o->expert_home,
                              .reference_kernels = o->reference, .device = o->device,
                              .rope_scaling = o->rope_scaling, .rope_factor = o->rope_factor, .rope_context = o->ctx};
}

tern_model *cli_load_model(const cli_opts *o) {
    tern_load_params lp = cli_load_params(o);
    tern_error err;
    const char *dir = cli_model_dir(o);
    tern_model *m = tern_model_load(dir, &lp, &err);
    if (m && o->mlock && tern_model_lock(m, &err)) {
        tern_model_free(m);
        m = NULL;
    }
    if (!m) {
        tern_flag_names(&err);
        fprintf(stderr, "tern: %s\n", err.msg);
    }
    return m;
}

int cli_context(const cli_opts *o, const tern_model *m, int dflt) {
    int ctx = o->ctx ? o->ctx : dflt ? dflt : tern_model_max_context(m);
    tern_error err;
    if (tern_model_check_context(m, ctx, &err) != 0) {
        tern_flag_names(&err);
        fprintf(stderr, "tern: --ctx: %s\n", err.msg);
        return -1;
    }
    return ctx;
}

char *cli_read_text(const char *path, size_t max_bytes, const char *why, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "tern: %s: %s\n", path, strerror(errno)); return NULL; }
    struct stat st;
    const char *bad = NULL;
    if (fstat(fileno(f), &st) != 0) bad = strerror(errno);
    else if (S_ISDIR(st.st_mode)) bad = "is a directory";
    else if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max_bytes) bad = "too long";
    size_t cap = 1 << 16, n = 0, r;
    char *buf = bad ? NULL : malloc(cap);
    if (!bad && !buf) bad = "out of memory";
    while (buf && n <= max_bytes && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 < cap) continue;
        char *b = realloc(buf, cap *= 2);
        if (!b) { free(buf); buf = NULL; bad = "out of memory"; } else buf = b;
    }
    if (buf && ferror(f)) bad = strerror(errno);
    if (buf && n > max_bytes) bad = "too long";
    fclose(f);
    if (bad && !strcmp(bad, "too long"))
        fprintf(stderr, "tern: %s: longer than %zu bytes, %s\n", path, max_bytes, why);
    else if (bad)
        fprintf(stderr, "tern: %s: %s\n", path, bad);
    if (bad) { free(buf); return NULL; }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int cli_gen_params(const cli_opts *o, tern_gen_params *p) {
    memset(p, 0, sizeof *p);
    tern_error err;
    if (tern_sampler_params_load(&p->sampling, cli_model_dir(o), &err) != 0) {
        fprintf(stderr, "tern: %s\n", err.msg);
        return -1;
    }
    tern_sampler_params *s = &p->sampling;
    if (!isnan(o->temp)) { s->temperature = o->temp; s->do_sample = o->temp > 0; }
    if (o->top_k >= 0) s->top_k = o->top_k;
    if (!isnan(o->top_p)) s->top_p = o->top_p;
    if (!isnan(o->min_p)) s->min_p = o->min_p;
    if (!isnan(o->repeat_penalty)) s->repetition_penalty = o->repeat_penalty;
    if (!isnan(o->presence_penalty)) s->presence_penalty = o->presence_penalty;
    if (!isnan(o->frequency_penalty)) s->frequency_penalty = o->frequency_penalty;
    s->seed = o->seed >= 0 ? (uint64_t)o->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    p->stop = o->stop;
    p->n_stop = o->n_stop;
    p->ignore_eos = o->ignore_eos;
    p->mtp_depth = o->mtp;
    return 0;
}

/* "1 2 3" (spaces, commas or newlines between) -> ids; every entry must be
 * a non-negative integer. Prints what is wrong and returns NULL. */
int32_t *cli_parse_ids(const char *s, size_t *n) {
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    *n = 0;
    while (ids && *s) {
        while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "tern: '%.*s' is not a token id\n", (int)strcspn(s, " ,\t\n"), s);
            free(ids);
            return NULL;
        }
        if (*n == cap) { int32_t *g = realloc(ids, (cap *= 2) * sizeof *ids); if (!g) { free(ids); return NULL; } ids = g; }
        ids[(*n)++] = (int32_t)v;
        s = end;
    }
    if (ids && *n == 0) { fprintf(stderr, "tern: no token ids given\n"); free(ids); return NULL; }
    return ids;
}


int cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s ? s : "", &end, 10);
    if (!s || !*s || *end || errno || s[0] == '-' || v > max) {
        fprintf(stderr, "tern %s: %s needs a number up to %llu, got '%s'\n", cmd, flag, (unsigned long long)max,
                s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}
