/* generation_config.json, read both ways: by the sampler's defaults
 * (tern_sampler_params_load) and for the EOS list (tern_config_load, next
 * to tests/fixtures/tiny's config.json). Accepted values must be ones the
 * sampler and the CLI accept: temperature >= 0, top_k >= 0, top_p and min_p
 * in [0, 1], repetition_penalty > 0, EOS ids >= 0. */
#include "fuzz.h"
#include "model/config.h"
#include "tern.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    size_t n;
    char *cfg = fuzz_read(FUZZ_ROOT "/tests/fixtures/tiny/config.json", &n);
    if (!cfg) { fprintf(stderr, "fuzz_genconfig: tests/fixtures/tiny/config.json unreadable\n"); abort(); }
    fuzz_write(fuzz_dir(), "config.json", cfg, n);
    free(cfg);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_dir();
    fuzz_write(dir, "generation_config.json", data, size);
    tern_error err;
    tern_sampler_params p;
    if (tern_sampler_params_load(&p, dir, &err) == 0) {
        FUZZ_CHECK(p.temperature >= 0, "temperature %g accepted", (double)p.temperature);
        FUZZ_CHECK(p.top_k >= 0, "top_k %d accepted", p.top_k);
        FUZZ_CHECK(p.top_p >= 0 && p.top_p <= 1, "top_p %g accepted", (double)p.top_p);
        FUZZ_CHECK(p.min_p >= 0 && p.min_p <= 1, "min_p %g accepted", (double)p.min_p);
        FUZZ_CHECK(p.repetition_penalty > 0, "repetition_penalty %g accepted", (double)p.repetition_penalty);
        FUZZ_CHECK(p.n_eos >= 0 && p.n_eos <= TERN_SAMPLER_MAX_EOS, "n_eos %d", p.n_eos);
        for (int i = 0; i < p.n_eos; i++) FUZZ_CHECK(p.eos_ids[i] >= 0, "eos_token_id %d accepted", p.eos_ids[i]);
    } else {
        FUZZ_CHECK(err.msg[0], "tern_sampler_params_load failed without a message");
    }
    tern_config c;
    if (tern_config_load(&c, dir, &err) == 0) {
        FUZZ_CHECK(c.n_eos >= 0 && c.n_eos <= TERN_MAX_EOS, "n_eos %d", c.n_eos);
        for (int i = 0; i < c.n_eos; i++) FUZZ_CHECK(c.eos[i] >= 0, "config eos %d accepted", c.eos[i]);
    } else {
        FUZZ_CHECK(err.msg[0], "tern_config_load failed without a message");
    }
    return 0;
}
