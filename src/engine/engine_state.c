/* The pieces of a session's layer state, in the order snapshots hold them
 * (engine.h). Both backends walk them: the CPU's with memcpy, the GPU's
 * with device copies. */
#include "engine/engine.h"

int tern_state_spans(const tern_config *c, const tern_kv *kv, const tern_gdn_state *gdn, size_t row_bytes, int from,
                     int pos, int recurrent, tern_span *out) {
    int n = 0;
    size_t off = (size_t)from * row_bytes, rows = (size_t)(pos - from) * row_bytes;
    for (int l = 0; l < c->n_layers && rows; l++) {
        if (c->layer_kind[l] != TERN_LAYER_ATTN) continue;
        out[n++] = (tern_span){kv[l].k + off, rows};
        out[n++] = (tern_span){kv[l].v + off, rows};
    }
    if (!recurrent) return n;
    size_t conv = tern_cfg_gdn_conv_floats(c) * sizeof(float), S = tern_cfg_gdn_state_floats(c) * sizeof(float);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] == TERN_LAYER_ATTN) continue;
        if (conv) out[n++] = (tern_span){(uint8_t *)gdn[l].conv, conv};
        if (S) out[n++] = (tern_span){(uint8_t *)gdn[l].S, S};
    }
    return n;
}

size_t tern_state_bytes(const tern_config *c, size_t row_bytes, int from, int pos, int recurrent) {
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++)
        n += c->layer_kind[l] == TERN_LAYER_ATTN ? 2 * (size_t)(pos - from) * row_bytes
             : recurrent ? (tern_cfg_gdn_conv_floats(c) + tern_cfg_gdn_state_floats(c)) * sizeof(float)
                         : 0;
    return n;
}
