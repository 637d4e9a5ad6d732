/* config.json's text (tern_config_parse). An accepted config must describe
 * a model the engine can size: positive dimensions, counts within their
 * arrays, top_k <= experts, a positive norm epsilon, EOS ids >= 0, a
 * positive RoPE scale and finite inverse frequencies. */
#include "fuzz.h"
#include <math.h>

#include "model/config.h"
#include "model/rope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_strndup(data, size);
    tern_config c;
    tern_error err;
    if (tern_config_parse(&c, text, "config.json", &err) != 0) {
        FUZZ_NOTE("%s", err.msg);
        FUZZ_CHECK(err.msg[0], "tern_config_parse failed without a message");
        free(text);
        return 0;
    }
    free(text);
    FUZZ_CHECK(c.hidden > 0 && c.vocab > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.head_dim > 0, "dims");
    FUZZ_CHECK(c.n_layers > 0 && c.n_layers <= TERN_MAX_LAYERS, "n_layers %d", c.n_layers);
    FUZZ_CHECK(c.n_experts > 0 && c.top_k > 0 && c.top_k <= c.n_experts, "experts %d top_k %d", c.n_experts, c.top_k);
    FUZZ_CHECK(c.gdn_k_heads > 0 && c.gdn_v_heads % c.gdn_k_heads == 0 && c.gdn_conv_kernel > 0, "gdn heads");
    FUZZ_CHECK(c.rope_dim > 0 && c.rope_dim <= c.head_dim, "rope_dim %d of %d", c.rope_dim, c.head_dim);
    FUZZ_CHECK(c.rope.attn_factor > 0 && isfinite(c.rope.attn_factor), "attention factor %g", c.rope.attn_factor);
    FUZZ_CHECK(tern_cfg_max_context(&c) >= c.max_pos, "context %d below max_pos %d", tern_cfg_max_context(&c),
               c.max_pos);
    if (c.rope_dim <= 4096) {   /* the RoPE table the engine builds: finite, positive */
        float inv[2048];
        tern_rope_inv_freq(&c, inv);
        for (int i = 0; i < c.rope_dim / 2; i++) FUZZ_CHECK(inv[i] >= 0 && isfinite(inv[i]), "inv_freq[%d] %g", i, inv[i]);
    }
    FUZZ_CHECK(c.norm_eps > 0, "rms_norm_eps %g", (double)c.norm_eps);
    FUZZ_CHECK(c.n_eos >= 0 && c.n_eos <= TERN_MAX_EOS, "n_eos %d", c.n_eos);
    for (int i = 0; i < c.n_eos; i++) FUZZ_CHECK(c.eos[i] >= 0, "eos[%d] = %d", i, c.eos[i]);
    /* the derived sizes the engine allocates from */
    volatile size_t s = tern_cfg_gdn_conv_floats(&c) + tern_cfg_gdn_state_floats(&c);
    (void)s;
    return 0;
}
