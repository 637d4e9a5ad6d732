/* A packed model end to end: tests/fixtures/tiny packed with 4-bit
 * experts (once, in LLVMFuzzerInitialize, by tern_pack) is the template;
 * each input replaces one of its small files, then the model is loaded
 * (tern_model_load, which checks the manifest against the config and every
 * file's hash), described as `tern info` does, and runs a prefill and one
 * decode step. The first byte of the input:
 *   bits 0-1  the file the rest replaces: 0 manifest.json, 1 config.json,
 *             2 generation_config.json (for 1 and 2 the manifest is given
 *             the new file's size and SHA-256, as a hostile model would be)
 *   bit 2     stream the experts through a slot cache (an expert budget)
 *   bit 3     the reference kernels instead of the SIMD ones
 * With FUZZ_PACKED_SEEDS=DIR set, Initialize also writes the template's
 * own files there as seeds (make fuzz does, into the scratch corpus), so
 * the seeds follow the packer. */
#include <jansson.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "pack/sha256.h"
#include "tern.h"

static const char *const SMALL[3] = {"manifest.json", "config.json", "generation_config.json"};
static const char *const LINKED[] = {"resident.bin", "experts/layer_000.bin", "experts/layer_001.bin",
                                     "experts/layer_002.bin", "experts/layer_003.bin", "experts/mtp.bin"};
static char tmpl[300], work[300];
static char *tmpl_text[3];
static size_t tmpl_len[3];
static FILE *devnull;

static void path_of(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

static void write_seeds(const char *dir) {
    for (int f = 0; f < 3; f++) {
        char name[64];
        snprintf(name, sizeof name, "template-%d", f);
        uint8_t *buf = malloc(tmpl_len[f] + 1);
        if (!buf) abort();
        buf[0] = (uint8_t)f;
        memcpy(buf + 1, tmpl_text[f], tmpl_len[f]);
        fuzz_write(dir, name, buf, tmpl_len[f] + 1);
        free(buf);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    path_of(tmpl, sizeof tmpl, fuzz_dir(), "template");
    path_of(work, sizeof work, fuzz_dir(), "work");
    tern_pack_params p = {.src = FUZZ_ROOT "/tests/fixtures/tiny", .dst = tmpl, .bits = 4, .n_threads = 1,
                          .min_free_bytes = 1};
    tern_error err;
    if (tern_pack(&p, &err) != 0) { fprintf(stderr, "fuzz_packed: pack: %s\n", err.msg); abort(); }
    char path[600];
    for (int f = 0; f < 3; f++) {
        path_of(path, sizeof path, tmpl, SMALL[f]);
        if (!(tmpl_text[f] = fuzz_read(path, &tmpl_len[f]))) { fprintf(stderr, "fuzz_packed: no %s\n", path); abort(); }
    }
    path_of(path, sizeof path, work, "experts");
    if (mkdir(work, 0755) != 0 || mkdir(path, 0755) != 0) { perror(work); abort(); }
    for (size_t i = 0; i < sizeof LINKED / sizeof *LINKED; i++) {
        char from[600];
        path_of(from, sizeof from, tmpl, LINKED[i]);
        path_of(path, sizeof path, work, LINKED[i]);
        if (link(from, path) != 0) { perror(path); abort(); }
    }
    const char *seeds = getenv("FUZZ_PACKED_SEEDS");
    if (seeds && *seeds) write_seeds(seeds);
    if (!(devnull = fopen("/dev/null", "w"))) abort();
    return 0;
}

/* The template's manifest with files[name] set to the new bytes' size and hash. */
static char *manifest_for(const char *name, const uint8_t *data, size_t n) {
    char hex[65];
    tern_error err;
    if (tern_sha256_buf(data, n, hex, &err) != 0) abort();
    json_t *m = json_loads(tmpl_text[0], 0, NULL);
    json_t *entry = json_object_get(json_object_get(m, "files"), name);
    if (!entry) abort();
    json_object_set_new(entry, "sha256", json_string(hex));
    json_object_set_new(entry, "size", json_integer((json_int_t)n));
    char *text = json_dumps(m, JSON_SORT_KEYS | JSON_INDENT(1));
    json_decref(m);
    if (!text) abort();
    return text;
}

static void run_model(int streaming, int reference) {
    tern_error err;
    tern_load_params lp = {.n_threads = 1, .reference_kernels = reference, .io_threads = 1,
                           .expert_budget = streaming ? 4u << 20 : 0};
    tern_model *m = tern_model_load(work, &lp, &err);
    if (!m) {
        FUZZ_NOTE("%s", err.msg);
        FUZZ_CHECK(err.msg[0], "load failed without a message");
        return;
    }
    tern_model_describe(work, NULL, devnull, &err);
    tern_session_params sp = {.max_context = 16};
    tern_session *s = tern_session_create(m, &sp, &err);
    if (s) {
        int vocab = tern_model_vocab_size(m);
        float *logits = malloc((size_t)vocab * sizeof *logits);
        int32_t prompt[3] = {1, 2, 3}, next = 4;
        for (int i = 0; i < 3; i++) prompt[i] %= vocab;
        next %= vocab;
        if (logits && tern_session_eval(s, prompt, 3, logits, 0, &err) == 0)
            tern_session_eval(s, &next, 1, logits, 0, &err);
        free(logits);
        tern_session_destroy(s);
    }
    tern_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 3;
    if (which == 3) return 0;
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    fuzz_write(work, SMALL[which], rest, n);
    if (which != 0) {
        char *man = manifest_for(SMALL[which], rest, n);
        fuzz_write(work, "manifest.json", man, strlen(man));
        free(man);
    }
    for (int f = 0; f < 3; f++)
        if (f != which && (f != 0 || which == 0)) fuzz_write(work, SMALL[f], tmpl_text[f], tmpl_len[f]);
    run_model(data[0] >> 2 & 1, data[0] >> 3 & 1);
    return 0;
}
