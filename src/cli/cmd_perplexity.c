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

/* Scored in windows, so the text is not bounded by the context; this cap
 * only keeps a device that never ends from being read forever. */
#define MAX_TEXT_BYTES ((size_t)64 << 20)

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
    char *text = cli_read_text(o->prompt_file, MAX_TEXT_BYTES, "the most tern perplexity reads", &len);
    if (!text) return 1;
    tern_model *m = cli_load_model(o);
    int win = m ? cli_context(o, m, 512) : -1;
    if (m && win >= 0 && win < 2) fprintf(stderr, "tern: perplexity needs windows of at least 2 tokens (--ctx %d)\n", win);
    tern_error err;
    tern_tokenizer *tok = win >= 2 ? tern_tokenizer_load(cli_model_dir(o), &err) : NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    int encoded = 0;
    if (win >= 2 && !tok) fprintf(stderr, "tern: %s\n", err.msg);
    if (tok && !(encoded = tern_tokenizer_encode(tok, text, len, 0, &ids, &n, &err) == 0))
        fprintf(stderr, "tern: %s\n", err.msg);
    if (encoded && n < 2) fprintf(stderr, "tern: %s has %zu tokens; perplexity needs at least 2\n", o->prompt_file, n);
    int V = m ? tern_model_vocab_size(m) : 0;
    float *logits = encoded && n >= 2 ? malloc((size_t)win * (size_t)V * sizeof(float)) : NULL;
    if (encoded && n >= 2 && !logits)
        fprintf(stderr, "tern: out of memory for %d x %d logits (try a smaller --ctx)\n", win, V);
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
