/* tokenizer.json (tern_tokenizer_load_files). A tokenizer that loads must
 * encode and decode a sample text, and every id its encoder gives must be
 * inside its vocabulary. */
#include "fuzz.h"
#include "tern.h"

static const char SAMPLE[] = "Hello, world! <|im_start|>user\n  dé\xcc\x81j\xc3\xa0 vu 123 \xf0\x9f\x98\x80<think>x</think>";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", fuzz_dir());
    fuzz_write(fuzz_dir(), "tokenizer.json", data, size);
    tern_error err;
    tern_tokenizer *tok = tern_tokenizer_load_files(path, NULL, &err);
    if (!tok) {
        FUZZ_NOTE("%s", err.msg);
        FUZZ_CHECK(err.msg[0], "load failed without a message");
        return 0;
    }
    int32_t vocab = tern_tokenizer_vocab_size(tok);
    FUZZ_CHECK(vocab >= 0, "vocab size %d", vocab);
    for (unsigned flags = 0; flags < 2; flags++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tern_tokenizer_encode(tok, SAMPLE, sizeof SAMPLE - 1, flags, &ids, &n, &err) != 0) continue;
        for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "id %d of %d", ids[i], vocab);
        char *out;
        size_t len;
        FUZZ_CHECK(tern_tokenizer_decode(tok, ids, n, 0, &out, &len, &err) == 0, "decode of its ids: %s", err.msg);
        free(out);
        free(ids);
    }
    for (int32_t id = 0; id < vocab && id < 64; id++) {
        size_t len;
        tern_tokenizer_token_bytes(tok, id, &len);
        tern_tokenizer_token_text(tok, id);
    }
    tern_tokenizer_free(tok);
    return 0;
}
