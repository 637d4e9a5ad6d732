/* tern info and tern tokenize. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cmd_info(const cli_opts *o) {
    tern_error err;
    tern_load_params lp = cli_load_params(o);
    if (tern_model_describe(cli_model_dir(o), &lp, stdout, &err) != 0) {
        fprintf(stderr, "tern: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static int decode_ids(tern_tokenizer *tok, const char *s) {
    size_t n = 0;
    int32_t *ids = cli_parse_ids(s, &n);
    if (!ids) return 2;
    char *out = NULL;
    size_t len = 0;
    tern_error err;
    int rc = tern_tokenizer_decode(tok, ids, n, 0, &out, &len, &err) == 0 ? 0 : 1;
    if (rc) fprintf(stderr, "tern: %s\n", err.msg);
    else { fwrite(out, 1, len, stdout); printf("\n"); }
    free(out);
    free(ids);
    return rc;
}

int cmd_tokenize(const cli_opts *o) {
    if (!o->decode == !o->positional) {
        fprintf(stderr, "tern tokenize: give TEXT or --decode IDS\n");
        return 2;
    }
    tern_error err;
    tern_tokenizer *tok = tern_tokenizer_load(cli_model_dir(o), &err);
    if (!tok) { fprintf(stderr, "tern: %s\n", err.msg); return 1; }
    int rc = 0;
    if (o->decode) {
        rc = decode_ids(tok, o->decode);
    } else {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tern_tokenizer_encode(tok, o->positional, strlen(o->positional), 0, &ids, &n, &err) != 0) {
            fprintf(stderr, "tern: %s\n", err.msg);
            rc = 1;
        } else {
            for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
            printf("\n");
        }
        free(ids);
    }
    tern_tokenizer_free(tok);
    return rc;
}
