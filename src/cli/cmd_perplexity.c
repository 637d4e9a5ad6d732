/* tern perplexity: exp(mean negative log-likelihood) of a text file, scored
 * in independent windows of --ctx tokens (default 512): every token of a
 * window but its first is predicted from the tokens before it in the same
 * window, as llama.cpp's perplexity tool does without overlap. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = '\0'; *len = (size_t)n; }
    return buf;
}

/* -log softmax(row)[target], in double */
static double nll(const float *row, int V, int32_t target) {
    float mx = row[0];
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    return log(sum) - ((double)row[target] - mx);
}

int cmd_perplexity(const cli_opts *o) {
    if (!o->prompt_file) { fprintf(stderr, "tern perplexity: -f FILE is required\n"); return 2; }
    size_t len;
    char *text = slurp(o->prompt_file, &len);
    if (!text) { fprintf(stderr, "tern: cannot read %s\n", o->prompt_file); return 1; }
    tern_model *m = cli_load_model(o);
    tern_error err;
    tern_tokenizer *tok = m ? tern_tokenizer_load(cli_model_dir(o), &err) : NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    if (m && !tok) fprintf(stderr, "tern: %s\n", err.msg);
    if (tok && tern_tokenizer_encode(tok, text, len, 0, &ids, &n, &err) != 0) {
        fprintf(stderr, "tern: %s\n", err.msg);
        ids = NULL;
    }
    int win = o->ctx ? o->ctx : 512, V = m ? tern_model_vocab_size(m) : 0;
    float *logits = ids ? malloc((size_t)win * V * sizeof(float)) : NULL;
    if (logits && n < 2) fprintf(stderr, "tern: %s has fewer than 2 tokens\n", o->prompt_file);
    if (logits && n >= 2) {
        double sum = 0;
        long scored = 0;
        clock_t t0 = clock();
        for (size_t start = 0; start + 1 < n; start += (size_t)win) {
            int w = n - start < (size_t)win ? (int)(n - start) : win;
            tern_session_params sp = {.max_context = win, .kv_bits = o->kv_bits};
            tern_session *s = tern_session_create(m, &sp, &err);
            if (!s || tern_session_eval(s, ids + start, w, logits, 1, &err) != 0) {
                fprintf(stderr, "tern: %s\n", err.msg);
                tern_session_destroy(s);
                goto done;
            }
            for (int t = 0; t + 1 < w; t++) sum += nll(logits + (size_t)t * V, V, ids[start + t + 1]);
            scored += w - 1;
            tern_session_destroy(s);
            fprintf(stderr, "\r[%zu/%zu tokens] ppl so far %.4f", start + (size_t)w, n, exp(sum / scored));
        }
        fprintf(stderr, "\n");
        printf("perplexity %.4f over %ld scored tokens (%zu tokens, windows of %d) in %.1f s CPU\n",
               exp(sum / scored), scored, n, win, (double)(clock() - t0) / CLOCKS_PER_SEC);
        rc = 0;
    }
done:
    free(logits);
    free(ids);
    free(text);
    tern_tokenizer_free(tok);
    tern_model_free(m);
    return rc;
}
