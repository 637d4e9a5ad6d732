/* Encode speed of the tokenizer on one core.
 *
 * Build and run (from the repository root; not part of `make`):
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc tools/tokenizer/bench_tokenizer.c \
 *      src/text/tokenizer.c src/text/tokenizer_load.c src/text/tokenizer_pre.c \
 *      src/text/utf8.c src/util/err.c src/util/file.c \
 *      $(pkg-config --cflags --libs jansson libpcre2-8 libutf8proc) -pthread \
 *      -o build/bench_tokenizer
 *   cat /usr/share/common-licenses/[A-Z]* /usr/share/doc/[a-z]*[a-z]/copyright > /tmp/english.txt
 *   build/bench_tokenizer tests/fixtures/tokenizer/qwen-like /tmp/english.txt
 *
 * Prints MB/s for the first pass over the text with a fresh tokenizer (word
 * cache empty) and the best of the following passes (cache warm). Invalid
 * UTF-8 in the file is replaced first (encode rejects it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "text/tokenizer.h"
#include "text/utf8.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER_DIR TEXT_FILE [PASSES]\n", argv[0]);
        return 2;
    }
    int passes = argc > 3 ? atoi(argv[3]) : 5;
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *raw = malloc((size_t)size + 1);
    if (!raw || fread(raw, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "%s: read failed\n", argv[2]);
        return 1;
    }
    fclose(f);
    size_t len;
    char *text = tern_utf8_sanitize(raw, (size_t)size, &len);
    free(raw);

    tern_error err;
    double t0 = now();
    tern_tokenizer *tok = tern_tokenizer_load(argv[1], &err);
    if (!tok) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double t_load = now() - t0;
    printf("tokenizer %s: %d ids, loaded in %.2f s\n", argv[1], tern_tokenizer_vocab_size(tok),
           t_load);
    printf("text %s: %.2f MB\n", argv[2], (double)len / 1e6);
    printf("%-6s %10s %10s %8s\n", "pass", "ids", "seconds", "MB/s");
    double best = 1e30;
    for (int p = 0; p < passes; p++) {
        int32_t *ids;
        size_t n;
        t0 = now();
        if (tern_tokenizer_encode(tok, text, len, 0, &ids, &n, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double dt = now() - t0;
        if (p > 0 && dt < best) best = dt;
        printf("%-6d %10zu %10.3f %8.1f%s\n", p + 1, n, dt, (double)len / 1e6 / dt,
               p == 0 ? "  (cold cache)" : "");
        free(ids);
    }
    if (passes > 1) printf("warm best: %.1f MB/s\n", (double)len / 1e6 / best);
    tern_tokenizer_free(tok);
    free(text);
    return 0;
}
