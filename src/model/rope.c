#include "model/rope.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "util/err.h"

#define FACTOR_MAX (1 << 20)

/* YaRN's attention scale for a stretch of `scale` (transformers' get_mscale). */
static double get_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

int tern_rope_finish(tern_config *c, const char *label, tern_error *err) {
    tern_rope_cfg *y = &c->rope;
    if (y->type != TERN_ROPE_YARN) {
        y->attn_factor = 1;
        return 0;
    }
    if (!(c->rope_theta > 1))
        return tern_fail(err, "%s: YaRN needs rope_theta > 1 (got %g)", label, c->rope_theta);
    if (!y->attn_given)
        y->attn_factor = y->mscale != 0 && y->mscale_all_dim != 0
                             ? get_mscale(y->factor, y->mscale) / get_mscale(y->factor, y->mscale_all_dim)
                             : get_mscale(y->factor, 1);
    if (!(y->attn_factor > 0 && y->attn_factor < 1e6))
        return tern_fail(err, "%s: YaRN's attention factor %g (from mscale %g, mscale_all_dim %g) is not positive",
                         label, y->attn_factor, y->mscale, y->mscale_all_dim);
    return 0;
}

/* YaRN asked for over a config without it: transformers' defaults. */
static void yarn_defaults(tern_rope_cfg *y, int native) {
    *y = (tern_rope_cfg){.type = TERN_ROPE_YARN, .config_type = y->config_type, .native = native, .factor = 1,
                         .beta_fast = 32, .beta_slow = 1, .truncate = 1};
}

int tern_rope_apply(tern_config *c, const tern_load_params *p, tern_error *err) {
    int type = p ? p->rope_scaling : TERN_ROPE_AS_CONFIG, ctx = p ? p->rope_context : 0;
    double factor = p ? p->rope_factor : 0;
    tern_rope_cfg *y = &c->rope;
    if (type < TERN_ROPE_AS_CONFIG || type > TERN_ROPE_YARN)
        return tern_fail(err, "rope_scaling %d is not a scaling (as config %d, none %d, yarn %d)", type,
                         TERN_ROPE_AS_CONFIG, TERN_ROPE_NONE, TERN_ROPE_YARN);
    if (!(factor == 0 || (factor >= 1 && factor <= FACTOR_MAX)))
        return tern_fail(err, "rope_factor must be in [1, %d], got %g", FACTOR_MAX, factor);
    if (ctx < 0) return tern_fail(err, "rope_context must be >= 0, got %d", ctx);
    if (factor && (type == TERN_ROPE_NONE || (type == TERN_ROPE_AS_CONFIG && y->type != TERN_ROPE_YARN)))
        return tern_fail(err, "rope_factor %g needs YaRN (rope_scaling yarn)", factor);
    if (type == TERN_ROPE_NONE) {
        y->type = TERN_ROPE_NONE;
        return tern_rope_finish(c, "rope scaling", err);
    }
    if (type == TERN_ROPE_YARN && y->type != TERN_ROPE_YARN) {
        yarn_defaults(y, c->max_pos);
        if (!factor && !ctx)
            return tern_fail(err, "YaRN needs a rope_factor or a rope_context above the native %d positions", y->native);
    }
    if (type == TERN_ROPE_YARN && !factor && ctx) {
        if (ctx <= y->native)
            return tern_fail(err, "YaRN to a context of %d: that is within the native %d positions (give a longer "
                                  "rope_context or a rope_factor)", ctx, y->native);
        factor = (double)ctx / y->native;
        if (factor > FACTOR_MAX) return tern_fail(err, "YaRN to %d positions: factor %g exceeds %d", ctx, factor, FACTOR_MAX);
    }
    if (factor) y->factor = factor;
    return tern_rope_finish(c, "rope scaling", err);
}

/* The dim whose wavelength turns `rotations` times over the native context
 * (transformers' find_correction_dim). */
static double correction_dim(double rotations, int dim, double base, int native) {
    return dim * log(native / (rotations * 2 * M_PI)) / (2 * log(base));
}

void tern_rope_inv_freq(const tern_config *c, float *inv_freq) {
    const tern_rope_cfg *y = &c->rope;
    int dim = c->rope_dim, half = dim / 2;
    double lo = 0, hi = 1;
    if (y->type == TERN_ROPE_YARN) {
        lo = correction_dim(y->beta_fast, dim, c->rope_theta, y->native);
        hi = correction_dim(y->beta_slow, dim, c->rope_theta, y->native);
        if (y->truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        lo = fmax(lo, 0);
        hi = fmin(hi, dim - 1);
        if (lo == hi) hi += 0.001;   /* (transformers' guard against a zero-width ramp) */
    }
    for (int i = 0; i < half; i++) {
        double extrap = 1.0 / pow(c->rope_theta, (double)(2 * i) / dim);
        if (y->type != TERN_ROPE_YARN) {
            inv_freq[i] = (float)extrap;
            continue;
        }
        /* the ramp in fp32, as torch forms it: 0 below lo (extrapolated,
         * the fast dims), 1 above hi (interpolated, the slow ones) */
        float ramp = ((float)i - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double e = 1.0 - ramp;
        inv_freq[i] = (float)(extrap / y->factor * (1 - e) + extrap * e);
    }
}

int tern_cfg_max_context(const tern_config *c) {
    if (c->rope.type != TERN_ROPE_YARN) return c->max_pos;
    double n = c->rope.native * c->rope.factor, k = nearbyint(n);
    if (fabs(n - k) > 1e-9 * n) k = floor(n);   /* a factor of ctx / native gives back ctx */
    if (k > INT_MAX) k = INT_MAX;
    return k > c->max_pos ? (int)k : c->max_pos;
}

int tern_cfg_check_context(const tern_config *c, int ctx, tern_error *err) {
    int most = tern_cfg_max_context(c);
    if (ctx <= most) return 0;
    if (c->rope.type == TERN_ROPE_YARN)
        return tern_fail(err, "a context of %d exceeds the %d positions of YaRN factor %g over the native %d "
                              "(a larger rope_factor reaches further)", ctx, most, c->rope.factor, c->rope.native);
    return tern_fail(err, "a context of %d exceeds the model's %d positions (max_position_embeddings); "
                          "YaRN reaches further (rope_scaling yarn)", ctx, most);
}

void tern_rope_describe(const tern_config *c, char *buf, size_t n) {
    const tern_rope_cfg *y = &c->rope;
    if (y->type != TERN_ROPE_YARN) {
        snprintf(buf, n, "none");
        return;
    }
    snprintf(buf, n, "yarn, factor %g over %d native positions, beta_fast %g, beta_slow %g, attention factor %.6g%s",
             y->factor, y->native, y->beta_fast, y->beta_slow, y->attn_factor, y->truncate ? "" : ", not truncated");
}
